"""Stragglers live: a job on two workers, one of them slowed on purpose (the worker
daemon's test-only --step-delay), has that worker marked degraded by the scheduler's
straggler detection and moves off it at a round, onto a third worker; it ends with the
digest of its fixed run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.client.render import cluster_text
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.e2e.worker_cluster import (
    client_of,
    digits_spec,
    e2e_cluster,
    reference,
    running_on,
    started,
)
from tests.helpers import wait_until

C = common_pb2
S = scheduler_pb2
STEPS = 100
DELAY = "0.25"  # seconds a step on the slow worker: a digits step is a few ms elsewhere
WAIT = 300.0


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    stragglers = {"stragglers": {"args": {"margin": 0.5, "reports": 3}}}
    cluster = e2e_cluster(
        tmp_path,
        postgres_db,
        redis_url,
        flags={"slow": ["--step-delay", DELAY]},
        scheduler={"profile": stragglers},
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_straggler_worker_is_marked_degraded_and_the_job_moves_off_it(
    cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gs-ref"
    ref = reference(shared, STEPS, ests=2)
    started(cluster, [("fast", "cpu:1"), ("slow", "cpu:1")])
    with client_of(cluster) as client:
        job_id = client.submit(digits_spec("straggler", STEPS, ests=2, min_devices=2)).job_id
        first = wait_until(
            lambda: running_on(client.get(job_id)), WAIT, "the job runs on both workers"
        )
        assert first == {"fast": 1, "slow": 1}
        cluster.add_workers([("spare", "cpu:1")])  # the other placement, once it is needed

        def degraded() -> S.WorkerInfo | None:
            return next((w for w in client.cluster().workers if w.degraded), None)

        worker = wait_until(degraded, WAIT, "a worker is marked degraded")
        assert worker is not None and worker.worker_id == "slow", worker
        assert "STRAGGLER" in worker.degraded_reason and "on worker slow" in worker.degraded_reason
        shown = cluster_text(client.cluster())
        assert "alive degraded" in shown and "slow degraded: STRAGGLER" in shown, shown
        job = client.wait(job_id, timeout=WAIT)
        assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
        events = client.events(job_id)
    assert job.final_digest == ref.digest
    kinds = [e.type for e in events]
    straggler = next(e for e in events if e.type == S.JOB_EVENT_TYPE_STRAGGLER)
    assert "on worker slow:" in straggler.message and "for 3 reports" in straggler.message
    moved = [
        e
        for e in events
        if e.type == S.JOB_EVENT_TYPE_RESCALING and "off degraded worker slow" in e.message
    ]
    assert moved, [(S.JobEventType.Name(e.type), e.message) for e in events]
    assert kinds.index(S.JOB_EVENT_TYPE_STRAGGLER) < kinds.index(S.JOB_EVENT_TYPE_RESCALING)
    last = [e.placement for e in events if e.placement.processes][-1]
    assert sorted(p.worker_id for p in last.processes) == ["fast", "spare"]
