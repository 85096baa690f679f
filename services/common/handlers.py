"""Rebuilding a gRPC method handler around new behavior, for the server's interceptors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

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
