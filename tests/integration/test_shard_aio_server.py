"""AioGrpcServer (the shard manager's server) in-process: the same statuses as GrpcServer for
coroutine handlers, the token check, unary calls drained on stop, open streams ended at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.common.channel import connect
from gearshift.common.errors import NotFoundError, ValidationError
from gearshift.common.server import AioGrpcServer, ServerSettings
from tests.helpers import wait_until

SERVICE = "gearshift.test.AioProbe"


class Probe:
    """Handlers of every kind; `release` lets the slow one finish (set from the test)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    async def slow(self, request: bytes, context: Any) -> bytes:
        self.entered.set()
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        return b"done:" + request

    async def invalid(self, request: bytes, context: Any) -> bytes:
        raise ValidationError("spec.dataset.size", "must be > 0 (got -1)")

    async def missing(self, request: bytes, context: Any) -> bytes:
        raise NotFoundError("job", "job-42")

    async def bug(self, request: bytes, context: Any) -> bytes:
        raise RuntimeError("secret internals")

    async def todo(self, request: bytes, context: Any) -> bytes:
        raise NotImplementedError

    def plain(self, request: bytes, context: Any) -> bytes:
        """Not a coroutine: runs in the server's thread pool."""
        if request == b"bad":
            raise ValidationError("x", "bad")
        return b"plain:" + request

    async def stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"one"
        raise ValidationError("after_sequence", "must be >= 0")

    async def echo(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield b"echo:" + request

    def handler(self) -> Any:
        unary = {
            name: grpc.unary_unary_rpc_method_handler(fn)
            for name, fn in {
                "Slow": self.slow,
                "Invalid": self.invalid,
                "Missing": self.missing,
                "Bug": self.bug,
                "Todo": self.todo,
                "Plain": self.plain,
            }.items()
        }
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                **unary,
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream),
                "Echo": grpc.stream_stream_rpc_method_handler(self.echo),
            },
        )


@pytest.fixture
def probe() -> Iterator[tuple[AioGrpcServer, Probe]]:
    handlers = Probe()
    server = AioGrpcServer([], ServerSettings(grace_seconds=5), [handlers.handler()])
    server.start()
    yield server, handlers
    handlers.release.set()
    server.stop(0)


def _call(address: str, method: str, payload: bytes = b"x", token: str | None = None) -> bytes:
    with connect(address, retry=False, timeout=10, token=token) as channel:
        call: Any = channel.unary_unary(f"/{SERVICE}/{method}")  # type: ignore[call-arg]
        return bytes(call(payload))


def _status(address: str, method: str, payload: bytes = b"x") -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        _call(address, method, payload)
    return exc.value.code(), str(exc.value.details())


@pytest.mark.parametrize(
    ("method", "code", "message"),
    [
        ("Invalid", grpc.StatusCode.INVALID_ARGUMENT, "spec.dataset.size: must be > 0 (got -1)"),
        ("Missing", grpc.StatusCode.NOT_FOUND, "job 'job-42' not found"),
        ("Todo", grpc.StatusCode.UNIMPLEMENTED, f"/{SERVICE}/Todo is not implemented yet"),
    ],
)
def test_domain_errors_become_statuses(
    probe: tuple[AioGrpcServer, Probe], method: str, code: grpc.StatusCode, message: str
) -> None:
    server, _ = probe
    assert _status(server.address, method) == (code, message)


def test_unexpected_errors_are_internal_without_internals(
    probe: tuple[AioGrpcServer, Probe],
) -> None:
    server, _ = probe
    code, details = _status(server.address, "Bug")
    assert code == grpc.StatusCode.INTERNAL
    assert "secret internals" not in details and "server log ref" in details


def test_plain_function_handlers_run_and_map_errors(probe: tuple[AioGrpcServer, Probe]) -> None:
    server, _ = probe
    assert _call(server.address, "Plain", b"a") == b"plain:a"
    assert _status(server.address, "Plain", b"bad") == (grpc.StatusCode.INVALID_ARGUMENT, "x: bad")


def test_streams_answer_and_their_errors_are_mapped(probe: tuple[AioGrpcServer, Probe]) -> None:
    server, _ = probe
    with connect(server.address, retry=False) as channel:
        stream: Any = channel.unary_stream(f"/{SERVICE}/Stream")  # type: ignore[call-arg]
        replies = iter(stream(b"x"))
        assert next(replies) == b"one"
        with pytest.raises(grpc.RpcError) as exc:
            next(replies)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        echo: Any = channel.stream_stream(f"/{SERVICE}/Echo")  # type: ignore[call-arg]
        assert list(echo(iter([b"a", b"b"]))) == [b"echo:a", b"echo:b"]


def test_stop_drains_unary_calls_and_ends_open_streams_at_once(
    probe: tuple[AioGrpcServer, Probe],
) -> None:
    server, handlers = probe
    result: dict[str, object] = {}

    def slow_client() -> None:
        try:
            result["reply"] = _call(server.address, "Slow", b"payload")
        except grpc.RpcError as exc:
            result["error"] = exc.code()

    caller = threading.Thread(target=slow_client)
    caller.start()
    assert handlers.entered.wait(10), "the slow call never reached the server"
    with connect(server.address, retry=False) as channel:
        echo: Any = channel.stream_stream(f"/{SERVICE}/Echo")  # type: ignore[call-arg]
        gate = threading.Event()

        def requests() -> Iterator[bytes]:
            yield b"first"
            gate.wait(30)  # the stream stays open, idle, until the test ends

        replies = echo(requests())
        assert next(replies) == b"echo:first"
        started = time.monotonic()
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        with pytest.raises(grpc.RpcError) as ended:
            next(replies)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the server is stopping" in str(ended.value.details())
        assert time.monotonic() - started < 3.0  # the stream did not wait for the grace
        gate.set()

    def refused() -> bool:
        try:
            _call(server.address, "Invalid")
        except grpc.RpcError as exc:
            return exc.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
            )
        return False

    wait_until(refused, 10, "new calls were still accepted after stop()")
    assert caller.is_alive(), "the in-flight unary call ended before it was released"
    handlers.release.set()
    caller.join(10)
    stopper.join(10)
    assert result == {"reply": b"done:payload"}
    assert server.loop.is_closed()


def test_token_is_checked_and_health_stays_open() -> None:
    handlers = Probe()
    server = AioGrpcServer([], ServerSettings(token="s3cret"), [handlers.handler()])
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert _call(server.address, "Plain", b"a", token="s3cret") == b"plain:a"
        for token in (None, "wrong"):
            with pytest.raises(grpc.RpcError) as exc:
                _call(server.address, "Plain", b"a", token=token)
            assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)
