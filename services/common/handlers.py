"""Rebuilding a gRPC method handler around new behavior, and the interceptors that do only
that (sync and aio), each keeping a method's wrapped handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias, cast

import grpc

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Metadata: TypeAlias = "Sequence[tuple[str, str | bytes]] | None"  # a call's invocation metadata


def rewrapped(
    handler: Handler,
    unary: Callable[[Any], Any],
    streaming: Callable[[Any], Any],
) -> Handler:
    """The same RPC with its behavior wrapped: `unary` for single responses, `streaming` else."""
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


class MethodCache:
    """A method's wrapped handler, built once and reused while the inner interceptors return
    the same handler object for it (generated servicers always do): wrapping per call would
    cost every call a few closures and a handler tuple per interceptor. Two threads that
    miss at once both build one; either is right."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    def get(
        self, method: str, handler: Handler, build: Callable[[Handler, str], Handler]
    ) -> Handler:
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = build(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class WrappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """An interceptor whose one job is to wrap each method's handler, the same way for every
    call of the method (`wrap`; what depends on the call is read from its context)."""

    def __init__(self) -> None:
        self._cache = MethodCache()

    def wrap(self, handler: Handler, method: str) -> Handler:
        raise NotImplementedError

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._cache.get(handler_call_details.method, handler, self.wrap)


class AioWrappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """WrappingInterceptor on grpc.aio."""

    def __init__(self) -> None:
        self._cache = MethodCache()

    def wrap(self, handler: Handler, method: str) -> Handler:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if cast(Any, handler) is None:  # no such method: the server answers UNIMPLEMENTED
            return handler
        return self._cache.get(handler_call_details.method, handler, self.wrap)
