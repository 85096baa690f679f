"""Rebuilding a gRPC method handler around new behavior, and the interceptors that do only
that (sync, and aio with the wrapped handler kept per method)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, cast

import grpc

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


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


class WrappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """An interceptor whose one job is to wrap each method's handler (`wrap`)."""

    def wrap(self, handler: Handler, details: grpc.HandlerCallDetails) -> Handler:
        raise NotImplementedError

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = continuation(handler_call_details)
        return None if handler is None else self.wrap(handler, handler_call_details)


class AioWrappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """WrappingInterceptor on grpc.aio, for wrappings that depend on the method alone.

    A method's wrapped handler is built once and reused while the inner interceptors
    return the same handler object for it (generated servicers always do): wrapping per
    call would cost every unary call a few closures.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

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
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
