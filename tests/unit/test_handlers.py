"""Interceptors that wrap handlers build a method's wrapper once, not once per call."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from gearshift.common.handlers import AioWrappingInterceptor, Handler, WrappingInterceptor


class Counting(WrappingInterceptor):
    def __init__(self) -> None:
        super().__init__()
        self.built: list[str] = []

    def wrap(self, handler: Handler, method: str) -> Handler:
        self.built.append(method)
        return grpc.unary_unary_rpc_method_handler(echo)


class AioCounting(AioWrappingInterceptor):
    def __init__(self) -> None:
        super().__init__()
        self.built: list[str] = []

    def wrap(self, handler: Handler, method: str) -> Handler:
        self.built.append(method)
        return grpc.unary_unary_rpc_method_handler(echo)


class Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def echo(request: Any, context: Any) -> Any:
    return request


def test_a_method_is_wrapped_once_while_its_handler_stays() -> None:
    first, second = (grpc.unary_unary_rpc_method_handler(echo) for _ in range(2))
    interceptor = Counting()
    a = interceptor.intercept_service(lambda _: first, Details("/s/A"))
    assert interceptor.intercept_service(lambda _: first, Details("/s/A")) is a
    assert interceptor.built == ["/s/A"]
    b = interceptor.intercept_service(lambda _: first, Details("/s/B"))
    assert b is not a and interceptor.built == ["/s/A", "/s/B"]
    renewed = interceptor.intercept_service(lambda _: second, Details("/s/A"))  # a new handler
    assert renewed is not a and interceptor.built == ["/s/A", "/s/B", "/s/A"]
    assert interceptor.intercept_service(lambda _: None, Details("/s/C")) is None


def test_the_aio_interceptor_keeps_the_same_cache() -> None:
    handler = grpc.unary_unary_rpc_method_handler(echo)
    interceptor = AioCounting()

    async def continuation(_: grpc.HandlerCallDetails) -> Handler:
        return handler

    async def twice() -> tuple[Handler, Handler]:
        one = await interceptor.intercept_service(continuation, Details("/s/A"))
        return one, await interceptor.intercept_service(continuation, Details("/s/A"))

    one, two = asyncio.run(twice())
    assert one is two and interceptor.built == ["/s/A"]
