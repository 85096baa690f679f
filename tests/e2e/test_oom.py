"""Out of memory live (DLRover's relaunch): a job whose processes get too little memory is
killed for it by its worker, restarted by the scheduler with twice the memory, and ends
with the digest of its unconstrained fixed run; a job that does not fit even in a whole
worker's memory fails saying so.

Sizes (measured here): a digits training process has about 230 MB of RSS as it starts
(torch, inherited from the worker's zygote) and peaks at 305-307 MB (its stats files).
A worker offering 440 MiB to 2 CPU slots gives each process 220 MiB (231 MB: killed, 75
MB under the peak), then 440 MiB (461 MB: 155 MB over the peak); one offering 160 MiB
(168 MB) cannot hold a process even whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import DevCluster
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.e2e.worker_cluster import client_of, digits_spec, e2e_cluster, reference, started

C = common_pb2
S = scheduler_pb2
STEPS = 40
WAIT = 300.0


def memory_cluster(tmp_path: Path, database: str, redis_url: str, memory: str) -> DevCluster:
    return e2e_cluster(tmp_path, database, redis_url, flags={"w1": ["--memory", memory]})


@pytest.fixture
def roomy(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    cluster = memory_cluster(tmp_path, postgres_db, redis_url, "440MiB")
    try:
        yield started(cluster, [("w1", "cpu:2")])
    finally:
        cluster.stop()


@pytest.fixture
def tiny(tmp_path: Path, postgres_db: str, redis_url: str) -> Iterator[DevCluster]:
    cluster = memory_cluster(tmp_path, postgres_db, redis_url, "160MiB")
    try:
        yield started(cluster, [("w1", "cpu:2")])
    finally:
        cluster.stop()


def summary(events: list[S.JobEvent]) -> list[tuple[str, str]]:
    return [(S.JobEventType.Name(e.type), (e.message.splitlines() or [""])[0]) for e in events]


@pytest.mark.slow
def test_out_of_memory_restarts_with_doubled_memory_and_keeps_the_bits(
    roomy: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gs-ref"
    ref = reference(shared, STEPS, ests=2)
    with client_of(roomy) as client:
        job_id = client.submit(digits_spec("oom", STEPS, ests=2, min_devices=2)).job_id
        job = client.wait(job_id, timeout=WAIT)
        events = client.events(job_id)
    assert job.state == C.JOB_STATE_SUCCEEDED, job.message + roomy.log_tails()
    assert job.final_digest == ref.digest
    lines = summary(events)
    restarts = [m for kind, m in lines if kind == "JOB_EVENT_TYPE_PREEMPTED"]
    assert len(restarts) == 1, lines
    oom = restarts[0]
    assert "out of memory" in oom and "> limit 220.0 MiB" in oom, oom
    assert oom.endswith(
        "with 2x its memory share (440 MiB a process on w1, was 220 MiB) (restart 1 of 3)"
    )
    started_at = [i for i, (kind, _) in enumerate(lines) if kind == "JOB_EVENT_TYPE_STARTED"]
    at = lines.index(("JOB_EVENT_TYPE_PREEMPTED", oom))
    assert len(started_at) == 2 and started_at[0] < at < started_at[1], lines  # OOM -> restart


@pytest.mark.slow
def test_a_job_that_cannot_fit_in_a_whole_worker_fails_saying_so(tiny: DevCluster) -> None:
    with client_of(tiny) as client:
        job_id = client.submit(digits_spec("too-big", STEPS, ests=2, min_devices=2)).job_id
        job = client.wait(job_id, timeout=WAIT)
        events = client.events(job_id)
    assert job.state == C.JOB_STATE_FAILED, summary(events)
    lines = summary(events)
    restarts = [m for kind, m in lines if kind == "JOB_EVENT_TYPE_PREEMPTED"]
    assert len(restarts) == 1 and "(160 MiB a process on w1, was 80 MiB)" in restarts[0], lines
    failed = lines[-1]
    assert failed[0] == "JOB_EVENT_TYPE_FAILED", lines
    assert "out of memory" in failed[1], failed
    assert failed[1].endswith(
        "the job cannot fit: a process ran out of memory with 160 MiB, the whole memory of "
        "the largest worker"
    ), failed
    assert "cannot fit" in job.message
