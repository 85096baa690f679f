"""The server bootstrap in-process: errors map to statuses, stop drains in-flight calls."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.errors import NotFoundError, ValidationError
from gearshift.common.server import GrpcServer, ServerSettings
from tests.helpers import wait_until

SERVICE = "gearshift.test.Probe"


def _handlers(release: threading.Event, entered: threading.Event) -> Any:
    def slow(request: bytes, context: grpc.ServicerContext) -> bytes:
        entered.set()
        assert release.wait(10), "test never released the slow call"
        return b"done:" + request

    def invalid(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise ValidationError("spec.dataset.size", "must be > 0 (got -1)")

    def missing(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise NotFoundError("job", "job-42")

    def bug(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise RuntimeError("secret internals")

    def todo(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise NotImplementedError

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield b"one"
        raise ValidationError("after_sequence", "must be >= 0")

    unary = {
        name: grpc.unary_unary_rpc_method_handler(fn)
        for name, fn in {
            "Slow": slow,
            "Invalid": invalid,
            "Missing": missing,
            "Bug": bug,
            "Todo": todo,
        }.items()
    }
    return grpc.method_handlers_generic_handler(
        SERVICE, {**unary, "Stream": grpc.unary_stream_rpc_method_handler(stream)}
    )


@pytest.fixture
def probe() -> Iterator[tuple[GrpcServer, threading.Event, threading.Event]]:
    release, entered = threading.Event(), threading.Event()
    server = GrpcServer([], ServerSettings(grace_seconds=5), [_handlers(release, entered)])
    server.start()
    yield server, release, entered
    release.set()
    server.stop(0)


def _call(address: str, method: str, payload: bytes = b"x") -> bytes:
    with connect(address, retry=False, timeout=10) as channel:
        call: Any = channel.unary_unary(f"/{SERVICE}/{method}")  # type: ignore[call-arg]
        return bytes(call(payload))


@pytest.mark.parametrize(
    ("method", "code", "message"),
    [
        ("Invalid", grpc.StatusCode.INVALID_ARGUMENT, "spec.dataset.size: must be > 0 (got -1)"),
        ("Missing", grpc.StatusCode.NOT_FOUND, "job 'job-42' not found"),
        ("Todo", grpc.StatusCode.UNIMPLEMENTED, f"/{SERVICE}/Todo is not implemented yet"),
    ],
)
def test_domain_errors_become_statuses(
    probe, method: str, code: grpc.StatusCode, message: str
) -> None:
    server, _, _ = probe
    with pytest.raises(grpc.RpcError) as exc:
        _call(server.address, method)
    assert exc.value.code() == code
    assert exc.value.details() == message


def test_unexpected_errors_are_internal_without_internals(probe) -> None:
    server, _, _ = probe
    with pytest.raises(grpc.RpcError) as exc:
        _call(server.address, "Bug")
    assert exc.value.code() == grpc.StatusCode.INTERNAL
    details = str(exc.value.details())
    assert "secret internals" not in details
    assert "server log ref" in details


def test_streaming_errors_are_mapped(probe) -> None:
    server, _, _ = probe
    with connect(server.address, retry=False) as channel:
        stream: Any = channel.unary_stream(f"/{SERVICE}/Stream")  # type: ignore[call-arg]
        replies = iter(stream(b"x"))
        assert next(replies) == b"one"
        with pytest.raises(grpc.RpcError) as exc:
            next(replies)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_stop_drains_in_flight_calls(probe) -> None:
    server, release, entered = probe
    result: dict[str, object] = {}

    def client() -> None:
        try:
            result["reply"] = _call(server.address, "Slow", b"payload")
        except grpc.RpcError as exc:
            result["error"] = exc.code()

    caller = threading.Thread(target=client)
    caller.start()
    assert entered.wait(10), "the slow call never reached the server"
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    # New calls are refused while draining (once stop() has begun)...

    def refused() -> bool:
        try:
            _call(server.address, "Invalid")
        except grpc.RpcError as exc:
            return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        return False

    wait_until(refused, 10, "new calls were still accepted after stop()")
    assert caller.is_alive(), "the in-flight call ended before it was released"
    # ...and the in-flight one completes.
    release.set()
    caller.join(10)
    stopper.join(10)
    assert result == {"reply": b"done:payload"}
