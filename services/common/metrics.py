"""Prometheus metrics every daemon serves: its RPCs, counted and timed by one interceptor,
and the HTTP endpoint of `--metrics-listen` (GEARSHIFT_METRICS_LISTEN).

Metrics live in prometheus_client's default registry, so a service's own metrics
(gearshift.<service>.metrics) are served by the same endpoint with nothing to wire.
Every name starts with `gearshift_`. The endpoint is plain HTTP at any path
(/metrics by convention): bind it to an interface only your Prometheus reaches.
"""

from __future__ import annotations

import gc
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
import prometheus_client

from gearshift.common.config import Option, host_port
from gearshift.common.handlers import (
    AioWrappingInterceptor,
    Handler,
    WrappingInterceptor,
    rewrapped,
)

METRICS_OPTION = Option(
    "metrics_listen",
    "host:port to serve Prometheus metrics on over HTTP, at /metrics (empty: not served; "
    "port 0: any free port)",
    "",
)
# From a fast unary call (~0.3 ms) to a long watch or shard stream.
RPC_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 300.0,
)  # fmt: skip

# No `_created` series beside each counter and histogram: noise on every scrape.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

RPC_HANDLED = prometheus_client.Counter(
    "gearshift_rpc_handled",
    "RPCs this server finished, by gRPC service, method and status code",
    ["service", "method", "code"],
)
RPC_SECONDS = prometheus_client.Histogram(
    "gearshift_rpc_duration_seconds",
    "Seconds from an RPC's start to its status (a stream's whole life), by service, method "
    "and status code",
    ["service", "method", "code"],
    buckets=RPC_BUCKETS,
)


GC_PAUSE_SECONDS = prometheus_client.Histogram(
    "gearshift_gc_pause_seconds",
    "Seconds a cycle-collector pass held the GIL, by generation (2: a full pass)",
    ["generation"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
LONG_GC_PAUSE_S = 0.05  # a pass this long is logged: it is an RPC's latency tail


def time_collections(
    log: Callable[[int, float, int], None],
) -> Callable[[str, dict[str, int]], None]:
    """Measure every cycle-collector pass (GC_PAUSE_SECONDS); `log(generation, seconds,
    collected)` for the long ones. Returns the gc callback (gc.callbacks holds it)."""
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        pause = time.perf_counter() - started[0]
        generation = info["generation"]
        GC_PAUSE_SECONDS.labels(str(generation)).observe(pause)
        if pause >= LONG_GC_PAUSE_S:
            log(generation, pause, info["collected"])

    gc.callbacks.append(callback)
    return callback


def _split(method: str) -> tuple[str, str]:
    """ "/gearshift.v1.JobService/GetJob" -> ("gearshift.v1.JobService", "GetJob")."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


class _CodeRecorder:
    """A servicer context that remembers the status set on it, for the contexts that do not
    tell (grpc.aio's context of a plain-function handler has no `code()`)."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._code: grpc.StatusCode | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        self._context.set_code(code)

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code = code
        self._context.abort(code, details)

    def code(self) -> grpc.StatusCode | None:
        return self._code


def _code(context: Any, finished: bool) -> str:
    """The call's status code name; a call that ended without one was cancelled or broke."""
    code = context.code()
    if code is None or code == grpc.StatusCode.OK:
        if finished:
            return "OK"
        active = getattr(context, "is_active", None)
        cancelled = getattr(context, "cancelled", None)
        if (active is not None and not active()) or (cancelled is not None and cancelled()):
            return "CANCELLED"
        return "UNKNOWN"
    if isinstance(code, grpc.StatusCode):
        return code.name
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), "UNKNOWN")


class _Observer:
    """Records one method's calls (its labelled series looked up once per status code)."""

    def __init__(self, service: str, method: str) -> None:
        self.service = service
        self.method = method
        self._series: dict[str, tuple[Any, Any]] = {}

    def record(self, context: Any, started: float, finished: bool) -> None:
        seconds = time.perf_counter() - started
        code = _code(context, finished)
        series = self._series.get(code)
        if series is None:
            labels = (self.service, self.method, code)
            series = self._series[code] = (RPC_HANDLED.labels(*labels), RPC_SECONDS.labels(*labels))
        series[0].inc()
        series[1].observe(seconds)

    def unary(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(behavior):
            return self._unary_async(behavior)

        def call(request: Any, context: Any) -> Any:
            started, finished = time.perf_counter(), False
            if not hasattr(context, "code"):
                context = _CodeRecorder(context)
            try:
                reply = behavior(request, context)
                finished = True
                return reply
            finally:
                self.record(context, started, finished)

        return call

    def _unary_async(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def call(request: Any, context: Any) -> Any:
            started, finished = time.perf_counter(), False
            try:
                reply = await behavior(request, context)
                finished = True
                return reply
            finally:
                self.record(context, started, finished)

        return call

    def streaming(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):
            return self._streaming_async(behavior)
        if inspect.iscoroutinefunction(behavior):  # writes with context.write
            return self._unary_async(behavior)

        def call(request: Any, context: Any) -> Iterator[Any]:
            started, finished = time.perf_counter(), False
            if not hasattr(context, "code"):
                context = _CodeRecorder(context)
            try:
                yield from behavior(request, context)
                finished = True
            finally:
                self.record(context, started, finished)

        return call

    def _streaming_async(self, behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            started, finished = time.perf_counter(), False
            try:
                async for reply in behavior(request, context):
                    yield reply
                finished = True
            finally:
                self.record(context, started, finished)

        return call


_OBSERVERS: dict[str, _Observer] = {}  # by method: a server's methods are a fixed set


def observed(handler: Handler, method: str) -> Handler:
    """The handler, its calls counted and timed under their method and status code."""
    observer = _OBSERVERS.get(method)
    if observer is None:
        observer = _OBSERVERS.setdefault(method, _Observer(*_split(method)))
    return rewrapped(handler, observer.unary, observer.streaming)


class RpcMetricsInterceptor(WrappingInterceptor):
    """Counts and times every call (outermost: it sees the status the others set)."""

    def wrap(self, handler: Handler, method: str) -> Handler:
        return observed(handler, method)


class AioRpcMetricsInterceptor(AioWrappingInterceptor):
    """RpcMetricsInterceptor on grpc.aio (coroutine, async-generator and plain handlers)."""

    def wrap(self, handler: Handler, method: str) -> Handler:
        return observed(handler, method)


@dataclass
class MetricsEndpoint:
    """The HTTP server of `--metrics-listen`, running in a daemon thread."""

    server: WSGIServer
    address: str  # host:port it is bound to

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(listen: str) -> MetricsEndpoint:
    """Serve the default registry over HTTP at `listen` (port 0: any free port).

    ValueError names a malformed address; OSError a port that cannot be bound.
    """
    try:
        host, port = host_port(listen)
    except ValueError as exc:
        raise ValueError(f"--metrics-listen: {exc}") from None
    server, _thread = prometheus_client.start_http_server(port, addr=host)
    bound = f"[{host}]" if ":" in host else host
    return MetricsEndpoint(server, f"{bound}:{server.server_port}")
