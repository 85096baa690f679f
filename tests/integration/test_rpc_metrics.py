"""RPC metrics (gearshift.common.metrics): one interceptor counts and times every call of both
servers by method and status code, and `serve_metrics` exposes them over HTTP."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from gearshift.common.channel import connect
from gearshift.common.errors import NotFoundError
from gearshift.common.metrics import serve_metrics
from gearshift.common.server import AioGrpcServer, GrpcServer, ServerSettings

TOKEN = "metrics-token"


def _count(service: str, method: str, code: str) -> float:
    labels = {"service": service, "method": method, "code": code}
    return REGISTRY.get_sample_value("gearshift_rpc_handled_total", labels) or 0.0


def _timed(service: str, method: str, code: str) -> float:
    labels = {"service": service, "method": method, "code": code}
    return REGISTRY.get_sample_value("gearshift_rpc_duration_seconds_count", labels) or 0.0


def _sync_handlers(service: str) -> Any:
    def ok(request: bytes, context: grpc.ServicerContext) -> bytes:
        return b"ok:" + request

    def missing(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise NotFoundError("job", "job-42")

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield b"one"
        yield b"two"

    return grpc.method_handlers_generic_handler(
        service,
        {
            "Ok": grpc.unary_unary_rpc_method_handler(ok),
            "Missing": grpc.unary_unary_rpc_method_handler(missing),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
    )


def _aio_handlers(service: str) -> Any:
    async def ok(request: bytes, context: Any) -> bytes:
        return b"ok:" + request

    async def missing(request: bytes, context: Any) -> bytes:
        raise NotFoundError("job", "job-42")

    def plain(request: bytes, context: Any) -> bytes:  # runs in the server's thread pool
        return b"plain:" + request

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"one"
        yield b"two"

    return grpc.method_handlers_generic_handler(
        service,
        {
            "Ok": grpc.unary_unary_rpc_method_handler(ok),
            "Missing": grpc.unary_unary_rpc_method_handler(missing),
            "Plain": grpc.unary_unary_rpc_method_handler(plain),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
    )


def _calls(address: str, service: str, token: str | None) -> list[str]:
    """Every method once (a failure is expected for Missing); returns the outcomes."""
    outcomes = []
    with connect(address, token=token, retry=False, timeout=10) as channel:
        for method in ("Ok", "Missing", "Plain"):
            call: Any = channel.unary_unary(f"/{service}/{method}")  # type: ignore[call-arg]
            try:
                call(b"x")
                outcomes.append("OK")
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)
        stream: Any = channel.unary_stream(f"/{service}/Stream")  # type: ignore[call-arg]
        try:
            outcomes.append(str(len(list(stream(b"x")))))
        except grpc.RpcError as exc:
            outcomes.append(exc.code().name)
    return outcomes


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_every_call_is_counted_and_timed_by_method_and_code(kind: str) -> None:
    service = f"gearshift.test.Metrics{kind.title()}"
    settings = ServerSettings(token=TOKEN, rpc_metrics=True, grace_seconds=1)
    server: GrpcServer | AioGrpcServer
    if kind == "sync":
        server = GrpcServer([], settings, [_sync_handlers(service)])
    else:
        server = AioGrpcServer([], settings, [_aio_handlers(service)])
    server.start()
    try:
        assert _calls(server.address, service, TOKEN) == [
            "OK",
            "NOT_FOUND",
            "UNIMPLEMENTED" if kind == "sync" else "OK",
            "2",
        ]
        assert _calls(server.address, service, "wrong")[0] == "UNAUTHENTICATED"
    finally:
        server.stop(0)
    assert _count(service, "Ok", "OK") == 1
    assert _count(service, "Missing", "NOT_FOUND") == 1
    assert _count(service, "Stream", "OK") == 1
    assert _count(service, "Ok", "UNAUTHENTICATED") == 1
    assert _timed(service, "Ok", "OK") == 1
    assert _timed(service, "Stream", "OK") == 1
    if kind == "aio":
        assert _count(service, "Plain", "OK") == 1


def test_no_interceptor_unless_asked() -> None:
    service = "gearshift.test.MetricsOff"
    server = GrpcServer([], ServerSettings(grace_seconds=1), [_sync_handlers(service)])
    server.start()
    try:
        _calls(server.address, service, None)
    finally:
        server.stop(0)
    assert _count(service, "Ok", "OK") == 0


def test_endpoint_serves_the_registry_in_prometheus_text_format() -> None:
    service = "gearshift.test.MetricsHttp"
    server = GrpcServer(
        [], ServerSettings(rpc_metrics=True, grace_seconds=1), [_sync_handlers(service)]
    )
    server.start()
    endpoint = serve_metrics("127.0.0.1:0")
    try:
        _calls(server.address, service, None)
        with urllib.request.urlopen(endpoint.url, timeout=10) as reply:
            text = reply.read().decode()
    finally:
        endpoint.close()
        server.stop(0)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    handled = [
        s
        for s in families["gearshift_rpc_handled"].samples
        if s.labels.get("service") == service and s.name.endswith("_total")
    ]
    assert {(s.labels["method"], s.labels["code"]): s.value for s in handled} == {
        ("Ok", "OK"): 1.0,
        ("Missing", "NOT_FOUND"): 1.0,
        ("Stream", "OK"): 1.0,
    }  # Plain is no method of this server: answered by gRPC itself, not counted
    assert families["gearshift_rpc_duration_seconds"].type == "histogram"


def test_a_bad_address_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--metrics-listen: address 'nope' is not host:port"):
        serve_metrics("nope")


def test_a_daemon_with_a_bad_metrics_address_does_not_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.shardmanager", "--listen", "127.0.0.1:0",
         "--metrics-listen", "nowhere", "--redis-url", "redis://127.0.0.1:1/0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "--metrics-listen: address 'nowhere' is not host:port" in result.stderr
