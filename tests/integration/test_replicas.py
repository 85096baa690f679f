"""Two Brains on one PostgreSQL database and two shard managers on one Redis, each pair
behind one address list (channel_target): a client rides over losing one of a pair
(SIGKILL), and the survivor serves the state the dead one wrote."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gearshift.client.devcluster import wait_all
from gearshift.client.processes import DaemonProcess, start_daemon
from gearshift.common.channel import connect
from gearshift.v1 import (
    brain_pb2,
    brain_pb2_grpc,
    common_pb2,
    shardmanager_pb2,
    shardmanager_pb2_grpc,
)
from tests.helpers import wait_until

B = brain_pb2
SM = shardmanager_pb2
READY_S = 90.0


@pytest.fixture
def pairs(
    tmp_path: Path, postgres_db: str, redis_url: str
) -> Iterator[Callable[[str], list[DaemonProcess]]]:
    """The two daemons of a service, started together."""
    started: list[DaemonProcess] = []
    args = {"brain": ["--database-url", postgres_db], "shardmanager": ["--redis-url", redis_url]}

    def pair(name: str) -> list[DaemonProcess]:
        two = [start_daemon(name, args[name], run_dir=tmp_path / f"{name}-{i}") for i in range(2)]
        started.extend(two)
        wait_all(two, READY_S)
        return two

    yield pair
    for daemon in started:
        daemon.stop()


def _event(job_id: str) -> B.ReportJobEventRequest:
    return B.ReportJobEventRequest(
        event_id=f"submit-{job_id}",
        job_id=job_id,
        kind=B.JOB_EVENT_KIND_SUBMITTED,
        spec=common_pb2.JobSpec(
            name=job_id,
            entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
            num_ests=1,
            global_batch_size=8,
            total_steps=10,
            dataset=common_pb2.DatasetSpec(size=100, shard_size=10),
        ),
    )


def test_a_brain_client_rides_over_losing_one_of_two(
    pairs: Callable[[str], list[DaemonProcess]],
) -> None:
    first, second = pairs("brain")
    with connect(f"{first.address},{second.address}", timeout=10) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        stub.ReportJobEvent(_event("before"))
        first.kill()
        killed = time.monotonic()
        stub.ReportJobEvent(_event("after"))  # idempotent: the channel retries on the other
        ridden = time.monotonic() - killed
        for job_id in ("before", "after"):
            history = stub.GetJobHistory(B.GetJobHistoryRequest(job_id=job_id))
            assert history.job.spec.name == job_id
    print(f"rode over losing one in {ridden:.2f} s")
    assert ridden < 5.0, ridden


def test_a_shard_client_rides_over_losing_one_of_two(
    pairs: Callable[[str], list[DaemonProcess]], unique_id: str
) -> None:
    first, second = pairs("shardmanager")
    dataset = f"ds-{unique_id}"
    config = SM.DatasetConfig(
        job_id=f"job-{unique_id}", size=100, shard_size=10, seed=3, num_epochs=1,
        mode=common_pb2.DATA_MODE_DYNAMIC,
    )  # fmt: skip
    with connect(f"{first.address},{second.address}", timeout=5) as channel:
        stub = shardmanager_pb2_grpc.ShardManagerStub(channel)
        stub.CreateDataset(SM.CreateDatasetRequest(dataset_id=dataset, config=config))

        def take() -> list[int]:
            """One shard read and acknowledged ([]: this call failed, try again)."""
            try:
                reply = stub.AcquireShard(SM.AcquireShardRequest(dataset_id=dataset, holder_id="h"))
                if reply.status != SM.ACQUIRE_STATUS_GRANTED:
                    return []
                shard = reply.shard
                stub.AckShard(
                    SM.AckShardRequest(dataset_id=dataset, holder_id="h", shard_id=shard.shard_id)
                )
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                return []
            return [int(shard.shard_id)]  # truthy for shard 0 too

        taken = [wait_until(take, 10, "a shard")[0] for _ in range(4)]
        first.kill()
        killed = time.monotonic()
        taken += wait_until(take, 10, "a shard from the other shard manager")
        ridden = time.monotonic() - killed
        taken += [wait_until(take, 10, "a shard")[0] for _ in range(5)]
    assert sorted(taken) == list(range(10)), taken  # each shard once: none lost or repeated
    print(f"rode over losing one in {ridden:.2f} s")
    assert ridden < 5.0, ridden
