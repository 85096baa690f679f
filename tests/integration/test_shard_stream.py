"""StreamShards, the consumers' data path: in-band refusals, retries by request id, many open
streams, a stop that ends streams at once, the client's deadline, and a server without the
stream refused plainly (the client has no unary fallback). (The kill and restart runs in
test_shard_consumers also read over streams.)"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from gearshift.common.errors import (
    DeadlineExceededError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from gearshift.common.ports import free_port
from gearshift.common.server import AioGrpcServer, GrpcServer, ServerSettings, register
from gearshift.v1 import shardmanager_pb2, shardmanager_pb2_grpc
from gearshift.worker.shard_client import ShardClient, ShardStream
from tests.conftest import DaemonFactory
from tests.helpers import wait_until
from tests.integration.test_shard_consumers import replica_factory

pb = shardmanager_pb2
SERVICE = pb.DESCRIPTOR.services_by_name["ShardManager"].full_name


@pytest.fixture
def sm(daemons: DaemonFactory, redis_url: str, unique_id: str) -> Callable[..., str]:
    return replica_factory(daemons, redis_url, f"gstest:{unique_id}")


def code_of(status: grpc.StatusCode) -> int:
    number: int = status.value[0]
    return number


def acquire(holder: str = "h", request_id: str = "", dataset: str = "ds", **kw: Any) -> Any:
    return pb.AcquireShardRequest(dataset_id=dataset, holder_id=holder, request_id=request_id, **kw)


def test_answers_come_in_order_and_refusals_leave_the_stream_open(sm: Callable[..., str]) -> None:
    address = sm()
    with ShardClient(address) as client:
        client.create_dataset("ds", job_id="j", size=30, shard_size=10)
        other = client.consumer("ds", "o").acquire()
        assert other is not None
        stream = ShardStream(client.stub)
        first = stream.exchange(acquire(request_id="r1"))
        assert first.error_code == 0 and first.reply.status == pb.ACQUIRE_STATUS_GRANTED
        mine = first.reply.shard
        refused = [
            (acquire(request_id="r2", ack=pb.ShardRef(shard_id=other.shard_id)),
             grpc.StatusCode.FAILED_PRECONDITION,
             f"shard {other.shard_id} of epoch 0 of dataset 'ds' is not held by holder 'h'"),
            (acquire(request_id="r" * 129), grpc.StatusCode.INVALID_ARGUMENT, "request_id:"),
            (acquire(holder="a b"), grpc.StatusCode.INVALID_ARGUMENT, "holder_id:"),
            (acquire(dataset="nope"), grpc.StatusCode.NOT_FOUND, "dataset 'nope' not found"),
            (acquire(ack=pb.ShardRef(shard_id=-1)), grpc.StatusCode.INVALID_ARGUMENT,
             "ack.shard_id:"),
        ]  # fmt: skip
        for request, status, message in refused:
            answer = stream.exchange(request)
            assert (answer.error_code, answer.error_message[: len(message)]) == (
                code_of(status),
                message,
            ), answer
            assert not answer.HasField("reply")
        # A repeated request id gets the first grant back; nothing was granted meanwhile.
        again = stream.exchange(acquire(request_id="r1"))
        assert (again.reply.shard.shard_id, again.reply.shard.attempt) == (mine.shard_id, 1)
        last = stream.exchange(acquire(request_id="r3", ack=pb.ShardRef(shard_id=mine.shard_id)))
        assert last.reply.acked and last.reply.status == pb.ACQUIRE_STATUS_GRANTED
        assert last.reply.shard.shard_id not in (mine.shard_id, other.shard_id)
        stream.close()
        progress = client.describe("ds").epochs[0]
        assert (progress.shards_done, progress.samples_in_flight) == (1, 20)


def test_streams_hold_no_server_thread(sm: Callable[..., str]) -> None:
    """More open streams than GrpcServer's 32 worker threads; each one answered at once."""
    address = sm()
    with ShardClient(address) as client:
        client.create_dataset("ds", job_id="j", size=100, shard_size=1)
        streams = [ShardStream(client.stub, timeout=10) for _ in range(48)]
        try:
            for i, stream in enumerate(streams):
                answer = stream.exchange(acquire(f"h{i}", "r1"))
                assert answer.reply.status == pb.ACQUIRE_STATUS_GRANTED, answer
            second = streams[0].exchange(acquire("h0", "r2"))  # the first is still served
            assert second.reply.status == pb.ACQUIRE_STATUS_GRANTED
        finally:
            for stream in streams:
                stream.close()
        assert client.describe("ds").epochs[0].samples_in_flight == 49


def test_a_stopping_daemon_ends_streams_at_once_and_consumers_carry_on(
    daemons: DaemonFactory, redis_url: str, unique_id: str
) -> None:
    port = free_port()
    args = ["--redis-url", redis_url, "--key-prefix", f"gstest:{unique_id}",
            "--listen", f"127.0.0.1:{port}", "--grace-seconds", "20"]  # fmt: skip
    first = daemons("shardmanager", args)
    with ShardClient(first.address, retry_seconds=60) as client:
        client.create_dataset("ds", job_id="j", size=50, shard_size=10)
        consumer = client.consumer("ds", "c")
        shards = iter(consumer)
        held = next(shards)
        idle = ShardStream(client.stub)
        assert idle.exchange(acquire("i", "r1")).reply.status == pb.ACQUIRE_STATUS_GRANTED
        started = time.monotonic()
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=15) == 0, first.log_tail()
        assert time.monotonic() - started < 5.0  # not the 20 s grace: streams ended at once
        with pytest.raises(grpc.RpcError) as ended:
            idle.exchange(acquire("i", "r2"))
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        idle.close()
        restarted: list[Any] = []
        restarting = threading.Event()  # set before the new daemon starts listening

        def restart() -> None:
            restarting.set()
            restarted.append(daemons("shardmanager", args))

        threading.Timer(1.0, restart).start()
        after = next(shards)  # acknowledges `held` once the daemon is back, on a new stream
        # the answer may come before the factory has seen the new daemon ready
        assert restarting.is_set() and after.shard_id != held.shard_id
        wait_until(lambda: restarted, 60.0, "the restarted shard manager ready")
        consumer.close()
        progress = client.describe("ds").epochs[0]
        assert (progress.shards_done, progress.shards_redelivered) == (1, 0)


class _Unary(shardmanager_pb2_grpc.ShardManagerServicer):
    """A shard manager without StreamShards: the consumer says so rather than falling back."""

    def __init__(self) -> None:
        self.calls = 0

    def AcquireShard(self, request: Any, context: Any) -> Any:
        self.calls += 1  # pragma: no cover - the consumer never calls it
        return pb.AcquireShardResponse(status=pb.ACQUIRE_STATUS_END_OF_DATA)


def test_a_server_without_streams_is_refused_plainly() -> None:
    unary = _Unary()  # type: ignore[abstract]
    server = GrpcServer(
        [register(shardmanager_pb2_grpc.add_ShardManagerServicer_to_server, unary, SERVICE)]
    )
    server.start()
    try:
        with ShardClient(server.address, retry_seconds=5) as client:
            consumer = client.consumer("ds", "h", renew=False)
            with pytest.raises(UnimplementedError):
                consumer.acquire()
            assert unary.calls == 0
            consumer.close(release=False)
    finally:
        server.stop(0)


class _Silent(shardmanager_pb2_grpc.ShardManagerServicer):
    """Reads stream requests and never answers (a stuck server)."""

    async def StreamShards(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for _ in request_iterator:
            await asyncio.sleep(3600)
        yield pb.StreamShardsResponse()  # pragma: no cover


def test_an_unanswered_stream_request_fails_after_the_client_timeout() -> None:
    silent = _Silent()  # type: ignore[abstract]
    server = AioGrpcServer(
        [register(shardmanager_pb2_grpc.add_ShardManagerServicer_to_server, silent, SERVICE)],
        ServerSettings(grace_seconds=1),
    )
    server.start()
    try:
        with ShardClient(server.address, timeout=0.5, retry_seconds=0) as client:
            consumer = client.consumer("ds", "h", renew=False)
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError, match=r"within 0\.5 s"):
                consumer.acquire()
            assert time.monotonic() - started < 3.0
            consumer.close(release=False)
    finally:
        server.stop()


class _Ending(shardmanager_pb2_grpc.ShardManagerServicer):
    """Ends each stream at its first request without answering (a server going away)."""

    async def StreamShards(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for _ in request_iterator:
            return
        yield pb.StreamShardsResponse()  # pragma: no cover


def test_a_stream_ended_without_an_answer_is_unavailable() -> None:
    ending = _Ending()  # type: ignore[abstract]
    server = AioGrpcServer(
        [register(shardmanager_pb2_grpc.add_ShardManagerServicer_to_server, ending, SERVICE)],
        ServerSettings(grace_seconds=1),
    )
    server.start()
    try:
        with ShardClient(server.address, retry_seconds=0) as client:
            consumer = client.consumer("ds", "h", renew=False)
            with pytest.raises(UnavailableError, match="the server ended the stream"):
                consumer.acquire()
            consumer.close(release=False)
    finally:
        server.stop()


def test_stream_requires_the_bearer_token(
    daemons: DaemonFactory, redis_url: str, unique_id: str
) -> None:
    args = ["--redis-url", redis_url, "--key-prefix", f"gstest:{unique_id}", "--token", "s3cret"]
    address = daemons("shardmanager", args).address
    with ShardClient(address, token="s3cret") as client:
        client.create_dataset("ds", job_id="j", size=10, shard_size=5)
        with client.consumer("ds", "h") as consumer:
            assert next(iter(consumer)).shard_id in (0, 1)
    with ShardClient(address, token="wrong", retry_seconds=5) as client:
        consumer = client.consumer("ds", "h2")
        with pytest.raises(UnauthenticatedError, match="invalid bearer token"):
            consumer.acquire()
        consumer.close(release=False)
