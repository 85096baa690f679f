"""gRPC server bootstrap shared by every daemon.

One place sets what every Gearshift server must have: health checking,
reflection, keepalive, message-size limits, the bearer-token check, TLS, the
mapping of domain errors to status codes, and a graceful stop that drains
in-flight calls.

`GrpcServer` runs handlers in a thread pool (grpc.server); `AioGrpcServer` is
the same server on grpc.aio, for a service whose handlers are coroutines (the
shard manager): an open stream then holds no thread, and a message costs less
CPU (on the 2-core test machine, a bidirectional-stream message ~150 µs on
grpc.aio against ~250 µs on the thread pool, and a unary call ~320-430 µs).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AioHealthServicer  # health.aio.HealthServicer
from grpc_reflection.v1alpha import reflection

from gearshift.common.auth import BearerTokenServerInterceptor, ServerTls
from gearshift.common.authz import AioAuthorizationInterceptor, AuthorizationInterceptor, caller_of
from gearshift.common.decoding import AioDecodingInterceptor, DecodingInterceptor
from gearshift.common.errors import GearshiftError
from gearshift.common.handlers import (
    AioWrappingInterceptor,
    Handler,
    WrappingInterceptor,
    rewrapped,
)
from gearshift.common.identity import TokenTable
from gearshift.common.limits import CallerLimits, Limits, LimitsInterceptor
from gearshift.common.metrics import AioRpcMetricsInterceptor, RpcMetricsInterceptor
from gearshift.common.rpc_roles import Scopes
from gearshift.common.signals import wait_for_signal

log = logging.getLogger("gearshift.server")

MB = 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class ServiceRegistration:
    """A servicer and the generated function that adds it to a server."""

    name: str
    add: Callable[[grpc.Server], None]


def register(
    add_fn: Callable[[Any, grpc.Server], None], servicer: Any, service_name: str
) -> ServiceRegistration:
    """Bind a servicer to its generated `add_XServicer_to_server` function."""
    return ServiceRegistration(service_name, lambda server: add_fn(servicer, server))


@dataclass(frozen=True)
class ServerSettings:
    """How a daemon listens and protects itself."""

    listen: str = "127.0.0.1:0"
    token: str | None = None
    tls: ServerTls | None = None
    max_message_bytes: int = 64 * MB
    grace_seconds: float = 10.0
    max_workers: int = 32  # GrpcServer: calls at once; AioGrpcServer: threads for sync handlers
    keepalive_seconds: float = 60.0
    rpc_metrics: bool = False  # count and time every call (gearshift.common.metrics)
    tokens: TokenTable | None = None  # identities and roles (replaces the one-token check)
    limits: Limits | None = None  # per-caller submissions, streams, request size

    def grpc_options(self) -> list[tuple[str, Any]]:
        keepalive_ms = int(self.keepalive_seconds * 1000)
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_pings_without_data", 0),
        ]


def _wrap(handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """Wrap a method handler so domain errors become statuses and bugs become INTERNAL."""

    def fail(exc: Exception, context: grpc.ServicerContext) -> None:
        if isinstance(exc, GearshiftError):
            context.abort(exc.code, exc.message)
        if isinstance(exc, NotImplementedError):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented yet")
        if cast(Any, context).code() not in (None, grpc.StatusCode.OK):
            raise exc  # the servicer already set a status (context.abort)
        ref = uuid.uuid4().hex[:12]
        log.exception("unhandled error", extra={"method": method, "ref": ref})
        context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error (server log ref {ref})")

    def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            try:
                return behavior(request, context)
            except Exception as exc:
                fail(exc, context)
                raise
            finally:
                log.debug(
                    "rpc",
                    extra={"method": method, "ms": round((time.perf_counter() - start) * 1e3, 2)},
                )

        return call

    def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from behavior(request, context)
            except Exception as exc:
                fail(exc, context)
                raise

        return call

    return rewrapped(handler, unary, streaming)


class ErrorMappingInterceptor(WrappingInterceptor):
    """Maps GearshiftError to its status code; never lets a stack trace reach a client."""

    def wrap(self, handler: Handler, method: str) -> Handler:
        return _wrap(handler, method)


@dataclass
class GrpcServer:
    """A started-on-demand gRPC server with health, reflection and a draining stop."""

    services: Sequence[ServiceRegistration]
    settings: ServerSettings = field(default_factory=ServerSettings)
    extra_handlers: Sequence[grpc.GenericRpcHandler[Any, Any]] = ()
    scopes: Callable[[], Scopes | None] = lambda: None  # owners of objects, for tenant checks
    # The service's own, after the caller's checks (a standby scheduler's: its refusals).
    interceptors: Sequence[grpc.ServerInterceptor[Any, Any]] = ()

    def __post_init__(self) -> None:
        interceptors: list[grpc.ServerInterceptor[Any, Any]] = []
        if self.settings.rpc_metrics:
            interceptors.append(RpcMetricsInterceptor())
        interceptors.append(DecodingInterceptor())
        if self.settings.tokens is not None:
            interceptors.append(AuthorizationInterceptor(self.settings.tokens, self.scopes))
        elif self.settings.token:
            interceptors.append(BearerTokenServerInterceptor(self.settings.token))
        if self.settings.limits is not None:
            counters = CallerLimits(self.settings.limits)
            interceptors.append(LimitsInterceptor(counters, caller_of(self.settings.tokens)))
        interceptors.extend(self.interceptors)
        interceptors.append(ErrorMappingInterceptor())
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.settings.max_workers, thread_name_prefix="grpc"
            ),
            interceptors=interceptors,
            handlers=list(self.extra_handlers),
            options=self.settings.grpc_options(),
        )
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for service in self.services:
            service.add(self._server)
        names = [s.name for s in self.services]
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self._server
        )
        self.port = 0
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        host = self.settings.listen.rpartition(":")[0]
        return f"{host}:{self.port}"

    def start(self) -> int:
        """Bind, start serving, mark every service SERVING; returns the bound port."""
        if self.settings.tls:
            self.port = self._server.add_secure_port(
                self.settings.listen, self.settings.tls.credentials()
            )
        else:
            self.port = self._server.add_insecure_port(self.settings.listen)
        self._server.start()
        for name in ["", *(s.name for s in self.services)]:
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra={"address": self.address, "tls": bool(self.settings.tls)})
        return self.port

    def set_serving(self, name: str) -> None:
        """Report `name` SERVING to health checks from now on (a name never set is NOT_FOUND:
        a scheduler's leadership, for a readiness probe that only the leader passes)."""
        self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight ones finish within the grace."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._health.enter_graceful_shutdown()
        grace = self.settings.grace_seconds if grace is None else grace
        log.info("stopping", extra={"grace_seconds": grace})
        self._server.stop(grace).wait()
        log.info("stopped")

    def serve_until_signal(self, on_stop: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then drain, run on_stop and return."""
        received = wait_for_signal()
        log.info("signal received", extra={"signal": received.name})
        self.stop()
        if on_stop is not None:
            on_stop()


# -- grpc.aio ------------------------------------------------------------------


class _OpenStreams:
    """The streaming calls in progress on an AioGrpcServer, so that a stop can end them.

    A stream may stay open for the life of a client (a consumer reading shards,
    a watch); waiting for it through the grace period would only delay the
    stop. On stop each one is answered UNAVAILABLE at once, which its client
    takes as "reconnect" (to another replica, or to this one once it is back),
    and its handler is cancelled.
    """

    def __init__(self) -> None:
        self.open: dict[asyncio.Task[Any], tuple[str, grpc.aio.ServicerContext[Any, Any]]] = {}
        self.stopping = False

    def add(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.current_task()
        assert task is not None
        self.open[task] = (method, context)
        return task

    async def end_all(self) -> None:
        """Answer every open stream UNAVAILABLE, then cancel its handler.

        First a 20 ms pause: grpc.aio notes that a call's initial metadata went
        out only when its write's completion reaches the loop, and an abort
        issued before that sends them again and fails
        (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, seen 4 times in 120 stops right
        after a reply), which leaves the stream open until the grace ends.
        """
        self.stopping = True
        if not self.open:
            return
        await asyncio.sleep(0.02)
        for task, (method, context) in list(self.open.items()):
            with contextlib.suppress(Exception):  # AbortError, or the call ended meanwhile
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"{method}: the server is stopping"
                )
            task.cancel()


def _wrap_aio(
    handler: grpc.RpcMethodHandler[Any, Any], method: str, streams: _OpenStreams
) -> grpc.RpcMethodHandler[Any, Any]:
    """`_wrap` for grpc.aio: the same statuses for coroutine handlers; open streams tracked.

    Handlers that are plain functions (run in the server's thread pool) get `_wrap` itself.
    """

    async def fail(exc: Exception, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if isinstance(exc, GearshiftError):
            await context.abort(exc.code, exc.message)
        if isinstance(exc, NotImplementedError):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented yet")
        ref = uuid.uuid4().hex[:12]
        log.exception("unhandled error", extra={"method": method, "ref": ref})
        await context.abort(
            grpc.StatusCode.INTERNAL, f"{method}: internal error (server log ref {ref})"
        )

    def unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await fail(exc, context)
                raise

        return call

    @contextlib.asynccontextmanager
    async def open_stream(context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
        """A response stream, tracked while it is open; its errors mapped as `fail` does."""
        task = streams.add(method, context)
        try:
            yield
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if not streams.stopping:  # else the stream was answered UNAVAILABLE already
                await fail(exc, context)
            raise
        finally:
            streams.open.pop(task, None)

    def tracked(
        behavior: Callable[..., Coroutine[Any, Any, Any]],
    ) -> Callable[..., Coroutine[Any, Any, Any]]:
        """A response-streaming handler that writes with context.write and returns None."""

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with open_stream(context):
                return await behavior(request, context)

        return call

    def tracked_gen(
        behavior: Callable[..., AsyncIterator[Any]],
    ) -> Callable[..., AsyncIterator[Any]]:
        """A response-streaming handler that is an async generator."""

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with open_stream(context):
                async for response in behavior(request, context):
                    yield response

        return call

    def streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):
            return tracked_gen(behavior)
        return tracked(behavior)

    behaviors = (
        handler.unary_unary,
        handler.unary_stream,
        handler.stream_unary,
        handler.stream_stream,
    )
    if not any(inspect.iscoroutinefunction(b) or inspect.isasyncgenfunction(b) for b in behaviors):
        return _wrap(handler, method)  # a plain function, run in the thread pool
    return rewrapped(handler, unary, streaming)


class AioErrorMappingInterceptor(AioWrappingInterceptor):
    """ErrorMappingInterceptor for grpc.aio; also tracks open streams (see `_OpenStreams`)."""

    def __init__(self) -> None:
        super().__init__()
        self.streams = _OpenStreams()

    def wrap(self, handler: Handler, method: str) -> Handler:
        return _wrap_aio(handler, method, self.streams)


class AioBearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """BearerTokenServerInterceptor on grpc.aio: the same rule and messages (it decides).

    A refusal is that interceptor's handler, a plain function run in the
    server's thread pool; refusals are rare, so that costs nothing that matters.
    """

    def __init__(self, token: str) -> None:
        self._check = BearerTokenServerInterceptor(token)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        checked = self._check.intercept_service(lambda _: handler, handler_call_details)
        return cast("Handler", checked)


class AioGrpcServer:
    """GrpcServer on grpc.aio: the same settings, health, reflection, token check, error
    mapping and draining stop, for services whose handlers are coroutines.

    The event loop runs in a thread of its own, so the server is used as a
    GrpcServer is (start, stop, serve_until_signal from the main thread); the
    services' coroutines all run on that loop. Streaming calls still open when
    the server stops end at once with UNAVAILABLE (their clients reconnect);
    unary calls in flight get the grace period, as with GrpcServer.
    """

    def __init__(
        self,
        services: Sequence[ServiceRegistration],
        settings: ServerSettings | None = None,
        extra_handlers: Sequence[grpc.GenericRpcHandler[Any, Any]] = (),
    ) -> None:
        self.services = services
        self.settings = settings or ServerSettings()
        self.extra_handlers = extra_handlers
        self.port = 0
        self._stopped = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-aio", daemon=True)
        self._thread.start()
        self._errors = AioErrorMappingInterceptor()
        self._pool = futures.ThreadPoolExecutor(
            max_workers=self.settings.max_workers, thread_name_prefix="grpc"
        )
        try:
            self.run(self._build())
        except BaseException:
            self._close_loop()
            raise

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the server's loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _build(self) -> None:
        interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = []
        if self.settings.rpc_metrics:
            interceptors.append(AioRpcMetricsInterceptor())
        interceptors.append(AioDecodingInterceptor())
        if self.settings.tokens is not None:
            interceptors.append(AioAuthorizationInterceptor(self.settings.tokens))
        elif self.settings.token:
            interceptors.append(AioBearerTokenInterceptor(self.settings.token))
        interceptors.append(self._errors)
        self._server = grpc.aio.server(
            migration_thread_pool=self._pool,
            handlers=list(self.extra_handlers),
            interceptors=interceptors,
            options=self.settings.grpc_options(),
        )
        self._health = AioHealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for service in self.services:
            service.add(cast(grpc.Server, self._server))
        names = [s.name for s in self.services]
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self._server
        )

    @property
    def address(self) -> str:
        host = self.settings.listen.rpartition(":")[0]
        return f"{host}:{self.port}"

    def start(self) -> int:
        """Bind, start serving, mark every service SERVING; returns the bound port."""
        self.port = self.run(self._start())
        log.info("serving", extra={"address": self.address, "tls": bool(self.settings.tls)})
        return self.port

    async def _start(self) -> int:
        if self.settings.tls:
            port = self._server.add_secure_port(
                self.settings.listen, self.settings.tls.credentials()
            )
        else:
            port = self._server.add_insecure_port(self.settings.listen)
        await self._server.start()
        for name in ["", *(s.name for s in self.services)]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return port

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, end open streams, let unary calls finish within the grace."""
        self._stop_serving(grace)
        self._close_loop()

    def _stop_serving(self, grace: float | None) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.settings.grace_seconds if grace is None else grace
        log.info("stopping", extra={"grace_seconds": grace})
        self.run(self._stop(grace))
        log.info("stopped")

    async def _stop(self, grace: float) -> None:
        await self._health.enter_graceful_shutdown()
        await self._errors.streams.end_all()
        await self._server.stop(grace)

    def _close_loop(self) -> None:
        """Let callbacks scheduled from other threads run (closing connections), then end."""
        if self.loop.is_closed():
            return

        async def finish() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            if others:
                await asyncio.wait(others, timeout=1.0)
            await self.loop.shutdown_asyncgens()

        try:
            self.run(finish(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self.loop.close()
            self._pool.shutdown(wait=False)

    def serve_until_signal(self, on_stop: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then drain, run on_stop (loop still up) and return."""
        received = wait_for_signal()
        log.info("signal received", extra={"signal": received.name})
        try:
            self._stop_serving(None)
            if on_stop is not None:
                on_stop()
        finally:
            self._close_loop()
