"""Elastic LAS live: Gavel's max-min fairness over elastic EST jobs on a real cluster of
processes. Two elastic jobs - one D1 (kept on the type it starts on), one D2 (free to mix
types) - share four CPU slots labelled v100 and t4 with a third job; when the third
finishes they grow, and each ends with the digest of its own fixed run.

The jobs are the sleepy model (tests/e2e/plan_jobs.py: each EST's step sleeps 0.1 s), and a
restart is estimated at 1 s until measured: growing must pay for its restart over the
work left, and with the digits CNN (80 steps in a second or two) on a loaded host the jobs
were nearly done when the third ended, so neither grew (CI, 2026-11-30)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.e2e.test_resource_plans import sleepy_spec
from tests.e2e.worker_cluster import (
    GAVEL_TIMING,
    client_of,
    e2e_cluster,
    reference,
    started,
)
from tests.helpers import repo_on_pythonpath

C = common_pb2
S = scheduler_pb2
STEPS = 120  # 24 s on one device; the third job's 40 end after about 8 s
SHORT = 40
WAIT = 300.0


@pytest.fixture
def cluster(
    tmp_path: Path, postgres_db: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DevCluster]:
    # The training processes (and the reference runs) import tests.e2e.plan_jobs.
    monkeypatch.setenv("PYTHONPATH", repo_on_pythonpath())
    las = {
        "profile": {"allocate": {"name": "las", "args": GAVEL_TIMING}},
        "estimates": {"restartSeconds": 1.0},
    }
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, scheduler=las)
    try:
        yield cluster
    finally:
        cluster.stop()


def placements(cluster: DevCluster, job_id: str) -> list[dict[str, int]]:
    """Devices by type of every placement the job ran on, in order."""
    with client_of(cluster) as client:
        out = []
        for event in client.watch(job_id):
            if event.placement.processes:
                kinds: dict[str, int] = {}
                for process in event.placement.processes:
                    kinds[process.accelerator_type] = kinds.get(process.accelerator_type, 0) + 1
                out.append(kinds)
        return out


@pytest.mark.slow
def test_elastic_las_shares_grows_and_keeps_the_bits(
    cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gs-ref"
    d1_ref = reference(shared, STEPS, ests=2, spec=sleepy_spec("reference", STEPS, ests=2))
    d2_ref = reference(
        shared, STEPS, ests=4, determinism="D2", spec=sleepy_spec("reference", STEPS, ests=4)
    )
    started(cluster, [("w1", "v100:3"), ("w2", "t4:1")])
    d1 = sleepy_spec("d1", STEPS, ests=2)
    d1.accelerator_types.append("v100")
    d2 = sleepy_spec("d2", STEPS, ests=4)
    d2.determinism = C.DETERMINISM_LEVEL_D2
    third = sleepy_spec("third", SHORT, ests=2)
    third.accelerator_types.append("v100")
    with client_of(cluster) as client:
        third_id = client.submit(third).job_id
        d1_id = client.submit(d1).job_id
        d2_id = client.submit(d2).job_id
        done = client.wait(third_id, timeout=WAIT)
        assert done.state == C.JOB_STATE_SUCCEEDED, done.message + cluster.log_tails()
        jobs = {j: client.wait(j, timeout=WAIT) for j in (d1_id, d2_id)}
    for job_id, ref in ((d1_id, d1_ref), (d2_id, d2_ref)):
        job = jobs[job_id]
        assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
        assert job.final_digest == ref.digest, job_id
    d1_runs, d2_runs = placements(cluster, d1_id), placements(cluster, d2_id)
    assert all(list(p) == ["v100"] for p in d1_runs), d1_runs  # D1: one type, all its life
    assert any(len(p) == 2 for p in d2_runs), d2_runs  # D2: v100 and t4 together
    # Both grew once the third job had gone.
    assert sum(d1_runs[-1].values()) > min(sum(p.values()) for p in d1_runs) or sum(
        d2_runs[-1].values()
    ) > min(sum(p.values()) for p in d2_runs), (d1_runs, d2_runs)
