"""Per-caller limits on a real scheduler process: a spec too large, too many queued jobs,
too many submissions a second, too many open streams - each RESOURCE_EXHAUSTED naming the
limit, and nothing changed by a refused call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.identity import create_job_key, create_token
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import DaemonFactory
from tests.helpers import scheduler_config, wait_until

C = common_pb2
S = scheduler_pb2


def spec(name: str, tenant: str = "t", config: str = "{}") -> C.JobSpec:
    return C.JobSpec(
        name=name,
        tenant=tenant,
        entrypoint=C.Entrypoint(module="gearshift.examples.mlp", config_json=config),
        num_ests=2,
        global_batch_size=8,
        total_steps=5,
        dataset=C.DatasetSpec(size=64, shard_size=8),
    )


def exhausted(call: object) -> str:
    with pytest.raises(grpc.RpcError) as info:
        result = call()  # type: ignore[operator]
        if hasattr(result, "__next__"):
            next(result)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    return info.value.details() or ""


def passes(call: object) -> bool:
    """True once `call` goes through; False while it is refused for a limit."""
    try:
        result = call()  # type: ignore[operator]
        if hasattr(result, "__next__"):
            next(result)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
        return False
    return True


def scheduler(
    daemons: DaemonFactory, tmp_path: Path, *flags: str, **limits: float
) -> scheduler_pb2_grpc.JobServiceStub:
    """A scheduler (no workers: jobs stay queued) with these process flags and `limits`, the
    file's limits section (`maxSpecKb=1`)."""
    database = f"sqlite:///{tmp_path / 'scheduler.db'}"
    config = scheduler_config(
        tmp_path, round={"seconds": 60}, heartbeats={"relays": 0}, limits=limits
    )
    daemon = daemons("scheduler", ["--database-url", database, *config, *flags])
    return scheduler_pb2_grpc.JobServiceStub(connect(daemon.address))


def count(jobs: scheduler_pb2_grpc.JobServiceStub) -> int:
    return len(jobs.ListJobs(S.ListJobsRequest()).jobs)


def test_spec_size_queue_and_stream_limits(daemons: DaemonFactory, tmp_path: Path) -> None:
    jobs = scheduler(daemons, tmp_path, maxSpecKb=1, maxQueuedJobs=2, maxStreams=1)
    big = spec("big", config=json.dumps({"pad": "x" * 2000}))
    assert "over the limit of 1024 (limits.maxSpecKb)" in exhausted(
        lambda: jobs.SubmitJob(S.SubmitJobRequest(spec=big))
    )
    assert count(jobs) == 0
    first = jobs.SubmitJob(S.SubmitJobRequest(spec=spec("a"))).job
    jobs.SubmitJob(S.SubmitJobRequest(spec=spec("b")))
    details = exhausted(lambda: jobs.SubmitJob(S.SubmitJobRequest(spec=spec("c"))))
    assert "tenant 't' has 2 queued jobs" in details and "limits.maxQueuedJobs" in details
    assert count(jobs) == 2
    jobs.SubmitJob(S.SubmitJobRequest(spec=spec("other", tenant="u")))  # another tenant's queue

    watch: Any = jobs.WatchJob(S.WatchJobRequest(job_id=first.job_id))  # also a grpc.Call
    assert next(watch).type == S.JOB_EVENT_TYPE_SUBMITTED  # the stream is open
    assert "streams open, the limit (limits.maxStreams)" in exhausted(
        lambda: jobs.WatchJob(S.WatchJobRequest(job_id=first.job_id))
    )
    watch.cancel()
    wait_until(
        lambda: passes(lambda: jobs.WatchJob(S.WatchJobRequest(job_id=first.job_id))),
        10,
        "a stream may open again once the first closed",
    )


def test_submissions_per_second(daemons: DaemonFactory, tmp_path: Path) -> None:
    jobs = scheduler(daemons, tmp_path, maxSubmitsPerSecond=1)
    for name in ("a", "b"):  # the burst: twice the rate
        jobs.SubmitJob(S.SubmitJobRequest(spec=spec(name)))
    assert "more than 1 submissions a second" in exhausted(
        lambda: jobs.SubmitJob(S.SubmitJobRequest(spec=spec("c")))
    )
    assert count(jobs) == 2
    wait_until(
        lambda: passes(lambda: jobs.SubmitJob(S.SubmitJobRequest(spec=spec("c")))),
        10,
        "a submission passes once the bucket refills",
    )


def test_submissions_per_second_are_counted_per_caller(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    """Each method's handler is wrapped once for every caller: who is over the limit is
    read from each call's own token, not from the first call's."""
    tokens, key = tmp_path / "tokens", tmp_path / "job.key"
    create_job_key(key)
    alice, bob = (create_token(tokens, f"tenant:{name}") for name in ("alice", "bob"))
    identities = ["--tokens-file", str(tokens), "--job-key-file", str(key)]
    database = f"sqlite:///{tmp_path / 'scheduler.db'}"
    config = scheduler_config(
        tmp_path,
        round={"seconds": 60},
        heartbeats={"relays": 0},
        limits={"maxSubmitsPerSecond": 1},
    )
    daemon = daemons("scheduler", ["--database-url", database, *config, *identities])
    as_alice = scheduler_pb2_grpc.JobServiceStub(connect(daemon.address, token=alice))
    as_bob = scheduler_pb2_grpc.JobServiceStub(connect(daemon.address, token=bob))
    for name in ("a1", "a2"):  # alice's burst
        as_alice.SubmitJob(S.SubmitJobRequest(spec=spec(name, tenant="")))
    assert "tenant:alice" in exhausted(
        lambda: as_alice.SubmitJob(S.SubmitJobRequest(spec=spec("a3", tenant="")))
    )
    for name in ("b1", "b2"):  # bob's own burst is untouched by alice's
        as_bob.SubmitJob(S.SubmitJobRequest(spec=spec(name, tenant="")))
    assert "tenant:bob" in exhausted(
        lambda: as_bob.SubmitJob(S.SubmitJobRequest(spec=spec("b3", tenant="")))
    )
