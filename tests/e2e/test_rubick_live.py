"""`--policy rubick` on the whole cluster as processes: the digits CNN job (4 ESTs) starts on
its own plan (no fit yet); mid-run its model key's profile reaches the Brain, whose fit says
gradient checkpointing off does not fit in the workers' 4 GiB device slots, so the scheduler
restarts the job in place with GC on (checkpoint, same devices) - and the job still ends
with the digest of the same job run on a fixed plan and placement."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.common.channel import connect
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2, scheduler_pb2
from tests.e2e.worker_cluster import (
    Reference,
    client_of,
    digits_spec,
    e2e_cluster,
    reference,
    started,
)
from tests.helpers import wait_until
from tests.integration.test_rubick_live import store_profile

STEPS = 480  # long enough that the fit (asked every 5 s) arrives while the job runs
WAIT = 240.0
C = common_pb2
S = scheduler_pb2


@pytest.fixture
def cluster(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    workers = (("w1", "cpu:2:4GiB"), ("w2", "cpu:2:4GiB"))
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, workers=workers)
    cluster.config.policy = "rubick"
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return reference(shared / "gearshift-worker-reference", STEPS)


def test_a_plan_changed_mid_run_keeps_the_fixed_run_digest(
    cluster: DevCluster, ref: Reference, tmp_path: Path
) -> None:
    started(cluster)
    key = f"digits-rubick-{tmp_path.name}"
    spec = digits_spec("digits", STEPS)
    spec.model_type = key
    spec.plan_dimensions.gradient_checkpointing = True
    with client_of(cluster) as client:
        job_id = client.submit(spec).job_id

        def progressed() -> S.Job | None:
            job = client.get(job_id)
            return job if job.progress.step >= 15 else None

        job = wait_until(progressed, WAIT, "the job ran 15 steps on its own plan", 0.5)
        assert job is not None and not job.plan.gradient_checkpointing
        store_profile(cluster.address("brain"), key)

        def replanned() -> list[S.JobEvent] | None:
            evs = [
                e
                for e in client.events(job_id)
                if e.type == S.JOB_EVENT_TYPE_RESCALED and "plan: gc on" in e.message
            ]
            return evs or None

        assert wait_until(replanned, WAIT, "a RESCALED event with GC on", 0.5) is not None
        now = client.get(job_id)
        assert now.state == C.JOB_STATE_SUCCEEDED or now.plan.gradient_checkpointing
        job = client.wait(job_id, timeout=WAIT)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.final_digest == ref.digest
    assert job.progress.step == STEPS


def test_a_job_without_a_fit_is_profiled_at_its_first_placement(
    cluster: DevCluster, ref: Reference, tmp_path: Path
) -> None:
    """Issue 19 point 2: nothing stored for the job or its model key, so its first start runs
    Rubick's profiling run on rank 0 (StartTaskRequest.profile_rubick); the Brain then holds
    >= 7 configurations and a fit of the job's own, the job's events say its plans come from
    that fit, and the job ends with its fixed-run digest (profiling computes on a fresh model
    with the random generators put back)."""
    started(cluster)
    spec = digits_spec("digits", STEPS)
    spec.model_type = f"digits-unprofiled-{tmp_path.name}"
    spec.plan_dimensions.gradient_checkpointing = True
    with client_of(cluster) as client:
        job_id = client.submit(spec).job_id

        def own_fit_noted() -> list[S.JobEvent] | None:
            evs = [
                e
                for e in client.events(job_id)
                if e.type == S.JOB_EVENT_TYPE_PLAN and "of the job's own runs" in e.message
            ]
            return evs or None

        noted = wait_until(own_fit_noted, WAIT, "an event naming the job's own fit", 0.5)
        assert noted is not None
        events = [e.message for e in client.events(job_id)]
        first = next(i for i, m in enumerate(events) if "none fitted yet" in m)
        assert first < events.index(noted[0].message)
        with connect(cluster.address("brain"), retry=False) as channel:
            fitted = brain_pb2_grpc.BrainStub(channel).FitModel(
                brain_pb2.FitModelRequest(job_id=job_id), timeout=30
            )
        assert fitted.run_count >= 7 and fitted.job_id == job_id
        runs = int(noted[0].message.split("fitted on ")[1].split()[0])
        assert 7 <= runs <= fitted.run_count  # runtime samples may add runs later
        job = client.wait(job_id, timeout=WAIT)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert job.final_digest == ref.digest
    assert job.progress.step == STEPS
