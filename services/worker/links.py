"""Channels from the worker daemon and its training processes to the other services.

The same options as gearshift.common.channel (message sizes, keepalive, retries
of the calls the contracts mark idempotent, bearer token and default deadline),
plus two that a long-lived client of a restartable service needs: a subchannel
pool of its own (gRPC's global pool would share the reconnect backoff of every
channel to that address in the process) and a reconnect backoff capped at one
second. With gRPC's defaults (up to 120 s) a worker would keep failing its
heartbeats for minutes after a scheduler restart and be declared lost.
"""

from __future__ import annotations

import grpc

from gearshift.common.auth import ClientDefaultsInterceptor
from gearshift.common.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TIMEOUT_SECONDS,
    retry_service_config,
)

RECONNECT_BACKOFF_MS = (100, 1_000)  # initial/min, max


def channel_options() -> list[tuple[str, str | int]]:
    """gRPC channel options of every link (see the module docstring)."""
    first, most = RECONNECT_BACKOFF_MS
    return [
        ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", retry_service_config()),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", first),
        ("grpc.min_reconnect_backoff_ms", first),
        ("grpc.max_reconnect_backoff_ms", most),
    ]


def plain_link(address: str) -> grpc.Channel:
    """A channel without the Python interceptor (the caller passes token and deadline)."""
    return grpc.insecure_channel(address, options=channel_options())


def link(
    address: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> grpc.Channel:
    """A channel whose calls carry the token and, when they set none, a deadline of `timeout`."""
    return grpc.intercept_channel(plain_link(address), ClientDefaultsInterceptor(token, timeout))
