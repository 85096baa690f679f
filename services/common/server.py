"""gRPC server bootstrap shared by every daemon.

One place sets what every Gearshift server must have: health checking,
reflection, keepalive, message-size limits, the bearer-token check, TLS, the
mapping of domain errors to status codes, and a graceful stop that drains
in-flight calls.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gearshift.common.auth import BearerTokenServerInterceptor, ServerTls
from gearshift.common.errors import GearshiftError
from gearshift.common.signals import wait_for_signal

log = logging.getLogger("gearshift.server")

MB = 1024 * 1024


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
    max_workers: int = 32
    keepalive_seconds: float = 60.0


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

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **kwargs)
    assert handler.stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **kwargs)


class ErrorMappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Maps GearshiftError to its status code; never lets a stack trace reach a client."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return _wrap(handler, handler_call_details.method)


@dataclass
class GrpcServer:
    """A started-on-demand gRPC server with health, reflection and a draining stop."""

    services: Sequence[ServiceRegistration]
    settings: ServerSettings = field(default_factory=ServerSettings)
    extra_handlers: Sequence[grpc.GenericRpcHandler[Any, Any]] = ()

    def __post_init__(self) -> None:
        interceptors: list[grpc.ServerInterceptor[Any, Any]] = []
        if self.settings.token:
            interceptors.append(BearerTokenServerInterceptor(self.settings.token))
        interceptors.append(ErrorMappingInterceptor())
        keepalive_ms = int(self.settings.keepalive_seconds * 1000)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.settings.max_workers, thread_name_prefix="grpc"
            ),
            interceptors=interceptors,
            handlers=list(self.extra_handlers),
            options=[
                ("grpc.max_send_message_length", self.settings.max_message_bytes),
                ("grpc.max_receive_message_length", self.settings.max_message_bytes),
                ("grpc.keepalive_time_ms", keepalive_ms),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.http2.max_pings_without_data", 0),
            ],
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
