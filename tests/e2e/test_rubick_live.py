"""Rubick's allocator (profile.allocate: rubick) on the whole cluster as processes. (1) The
digits CNN job (4 ESTs) starts
on its model key's fit (a synthetic profile stored before it: 100 M parameters, whose
activations need gradient checkpointing in the workers' 4 GiB device slots), so with GC on;
it has no fit of its own, so its rank 0 runs Rubick's profiling run first; once the Brain
has fitted its own runs (a small CNN: GC off fits and is faster), the scheduler restarts it
in place with GC off (checkpoint) - and it still ends with the digest of the same job run
on a fixed plan and placement. (2) A job with nothing stored anywhere is profiled at its
first placement and its events name the fit it then runs on."""

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
    rubick = {"profile": {"allocate": {"name": "rubick"}}}
    cluster = e2e_cluster(tmp_path, postgres_db, redis_url, workers=workers, scheduler=rubick)
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
    store_profile(cluster.address("brain"), key)
    spec = digits_spec("digits", STEPS)
    spec.model_type = key
    spec.plan_dimensions.gradient_checkpointing = True
    with client_of(cluster) as client:
        job_id = client.submit(spec).job_id

        def running() -> S.Job | None:
            job = client.get(job_id)
            return job if job.state == C.JOB_STATE_RUNNING else None

        job = wait_until(running, WAIT, "the job runs on its model key's plan", 0.5)
        assert job is not None and job.plan.gradient_checkpointing

        def replanned() -> list[S.JobEvent] | None:
            evs = [
                e
                for e in client.events(job_id)
                if e.type == S.JOB_EVENT_TYPE_RESCALED and "plan: gc off" in e.message
            ]
            return evs or None

        assert wait_until(replanned, WAIT, "a RESCALED event with GC off", 0.5) is not None
        notes = [e.message for e in client.events(job_id) if e.type == S.JOB_EVENT_TYPE_PLAN]
        assert f"of model {key}" in notes[0] and "of the job's own runs" in notes[-1], notes
        job = client.wait(job_id, timeout=WAIT)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + cluster.log_tails()
    assert not job.plan.gradient_checkpointing
    assert job.final_digest == ref.digest
    assert job.progress.step == STEPS


def test_a_job_without_a_fit_is_profiled_at_its_first_placement(
    cluster: DevCluster, ref: Reference, tmp_path: Path
) -> None:
    """Nothing stored for the job or its model key, so its first start runs
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
