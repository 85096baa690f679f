"""Outages of what a daemon depends on: a stopped database is UNAVAILABLE (a retryable
status) from the scheduler and the Brain alike, never INTERNAL, and both serve again once it
is back; a Brain that takes seconds to answer holds up the scheduler's round, not its API."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.config import merged
from gearshift.v1 import (
    brain_pb2,
    brain_pb2_grpc,
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from tests.chaos.services import PrivatePostgres
from tests.conftest import DaemonFactory
from tests.helpers import scheduler_config, single_seed, wait_until

S = scheduler_pb2


def _spec(name: str) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name=name,
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        model_type="mlp",
        num_ests=1,
        global_batch_size=8,
        total_steps=100,
        dataset=common_pb2.DatasetSpec(name="digits", size=1000, shard_size=10),
    )


def _code(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


def test_a_stopped_database_is_unavailable_from_scheduler_and_brain(
    daemons: DaemonFactory, postgres: PrivatePostgres, tmp_path: Path
) -> None:
    brain = daemons("brain", ["--database-url", postgres.url])
    config = scheduler_config(tmp_path, round={"seconds": 3600}, heartbeats={"relays": 0})
    scheduler = daemons("scheduler", ["--database-url", postgres.url, *config])
    with connect(scheduler.address) as s_channel, connect(brain.address) as b_channel:
        jobs = scheduler_pb2_grpc.JobServiceStub(s_channel)
        history = brain_pb2_grpc.BrainStub(b_channel)
        jobs.SubmitJob(S.SubmitJobRequest(spec=_spec("before")), timeout=10)
        calls: dict[str, Callable[[], Any]] = {
            "scheduler ListJobs": lambda: jobs.ListJobs(S.ListJobsRequest(), timeout=10),
            "scheduler GetJob": lambda: jobs.GetJob(S.GetJobRequest(job_id="job-x"), timeout=10),
            "scheduler SubmitJob": lambda: jobs.SubmitJob(
                S.SubmitJobRequest(spec=_spec("during")), timeout=10
            ),
            "brain ListJobRecords": lambda: history.ListJobRecords(
                brain_pb2.ListJobRecordsRequest(), timeout=10
            ),
        }
        postgres.crash()
        during = {name: _code(call) for name, call in calls.items()}
        assert during == dict.fromkeys(calls, grpc.StatusCode.UNAVAILABLE), during
        postgres.start()
        wait_until(
            lambda: (
                _code(calls["scheduler ListJobs"]) == grpc.StatusCode.OK
                and _code(calls["brain ListJobRecords"]) == grpc.StatusCode.OK
            ),
            30,
            "both serve again once the database is back",
        )
        names = [j.spec.name for j in jobs.ListJobs(S.ListJobsRequest(), timeout=10).jobs]
        assert names == ["before"], "the refused submission left nothing behind"


class SlowBrain(brain_pb2_grpc.BrainServicer):
    """A Brain whose throughput estimates take `delay` seconds; events answered at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.asked = threading.Event()
        self.release = threading.Event()

    def EstimateThroughput(
        self, request: brain_pb2.EstimateThroughputRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ThroughputEstimate:
        self.asked.set()
        self.release.wait(self.delay)  # a slow Brain (let go at the end of the test)
        return brain_pb2.ThroughputEstimate(steps_per_second=1.0)

    def ReportJobEvent(
        self, request: brain_pb2.ReportJobEventRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ReportJobEventResponse:
        return brain_pb2.ReportJobEventResponse()


def test_a_slow_brain_holds_up_the_round_not_the_api(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    slow = SlowBrain(delay=5.0)  # type: ignore[abstract]  # the rest: UNIMPLEMENTED
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    brain_pb2_grpc.add_BrainServicer_to_server(slow, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        # EasyScale's allocator, every event a round, the decision in the scheduler's
        # process (the defaults this test was written against), 1 s rounds.
        over = {"round": {"seconds": 1}, "cluster": {"brainAddress": f"127.0.0.1:{port}"}}
        config = scheduler_config(tmp_path, **merged(single_seed(), over))
        scheduler = daemons(
            "scheduler", ["--database-url", f"sqlite:///{tmp_path / 'scheduler.db'}", *config]
        )
        with connect(scheduler.address) as channel:
            jobs = scheduler_pb2_grpc.JobServiceStub(channel)
            registry = scheduler_pb2_grpc.WorkerRegistryStub(channel)
            registry.RegisterWorker(
                S.RegisterWorkerRequest(
                    worker_id="w1",
                    address="127.0.0.1:9",
                    devices=[common_pb2.DeviceGroup(accelerator_type="cpu", count=1)],
                ),
                timeout=10,
            )
            job_id = jobs.SubmitJob(S.SubmitJobRequest(spec=_spec("j")), timeout=10).job.job_id
            assert slow.asked.wait(30), "the round asks the Brain for estimates"
            latencies = []
            deadline = time.monotonic() + 3.0  # well inside the Brain's 5 s
            while time.monotonic() < deadline:
                for call in (
                    lambda: jobs.GetJob(S.GetJobRequest(job_id=job_id), timeout=10),
                    lambda: jobs.ListJobs(S.ListJobsRequest(), timeout=10),
                ):
                    started = time.monotonic()
                    call()
                    latencies.append(time.monotonic() - started)
            assert not slow.release.is_set()  # the Brain was still answering all along
        # Every call answered while the round waited on the Brain: none waited for it
        # (seconds), and typically well under 100 ms (the bound leaves room for a busy CI).
        assert max(latencies) < 1.0, max(latencies)
        assert statistics.median(latencies) < 0.1, statistics.median(latencies)
    finally:
        slow.release.set()
        server.stop(grace=None)
