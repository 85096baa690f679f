"""Requests whose bytes are not the method's message: INVALID_ARGUMENT naming the type.

grpc answers a request it cannot deserialize with INTERNAL ("Exception deserializing
request!"), which reads as a server bug. Here the deserializer never raises: bytes that do
not parse become an `Undecodable`, and the outermost wrapper (before any interceptor looks
at the request) aborts the call INVALID_ARGUMENT with the message type and the parser's
reason. Placed right after the metrics interceptor, so the refusal is counted.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError

from gearshift.common.handlers import (
    AioWrappingInterceptor,
    Handler,
    WrappingInterceptor,
    rewrapped,
)


@dataclass(frozen=True)
class Undecodable:
    """Bytes that did not parse as the method's request message."""

    message: str


def _tolerant(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except (DecodeError, ValueError, TypeError) as exc:
            owner = getattr(deserializer, "__self__", None)
            kind = getattr(owner, "DESCRIPTOR", None)
            name = kind.full_name if kind is not None else "its request message"
            return Undecodable(f"{method}: the request is not a valid {name} ({exc})")

    return parse


def _sync(handler: Handler) -> Handler:
    def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
        streaming_request = handler.request_streaming

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            if streaming_request:
                return behavior(_checked(request, context), context)
            if isinstance(request, Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return behavior(request, context)

        return call

    return rewrapped(handler, unary, unary)


def _checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
    for request in requests:
        if isinstance(request, Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        yield request


async def _achecked(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        yield request


def _aio(handler: Handler) -> Handler:
    streaming_request = handler.request_streaming

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return _achecked(request, context) if streaming_request else request

    def wrap(behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):

            async def generate(request: Any, context: Any) -> AsyncIterator[Any]:
                async for reply in behavior(await refuse(request, context), context):
                    yield reply

            return generate

        async def call(request: Any, context: Any) -> Any:
            return await behavior(await refuse(request, context), context)

        return call

    return rewrapped(handler, wrap, wrap)


def decoded(handler: Handler, method: str, *, aio: bool = False) -> Handler:
    """The handler with a deserializer that never raises and a refusal of what it could not read."""
    behaviors = (
        handler.unary_unary,
        handler.unary_stream,
        handler.stream_unary,
        handler.stream_stream,
    )
    coroutines = any(
        inspect.iscoroutinefunction(b) or inspect.isasyncgenfunction(b) for b in behaviors
    )
    wrapped: Any = _aio(handler) if aio and coroutines else _sync(handler)
    tolerant = _tolerant(handler.request_deserializer, method)
    return cast(Handler, wrapped._replace(request_deserializer=tolerant))


class DecodingInterceptor(WrappingInterceptor):
    """Undecodable requests answered INVALID_ARGUMENT (see the module's docstring)."""

    def wrap(self, handler: Handler, method: str) -> Handler:
        return decoded(handler, method)


class AioDecodingInterceptor(AioWrappingInterceptor):
    """DecodingInterceptor on grpc.aio."""

    def wrap(self, handler: Handler, method: str) -> Handler:
        return decoded(handler, method, aio=True)
