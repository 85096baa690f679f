"""Client channels: default deadlines, bearer token, TLS, and retries for idempotent calls.

Which calls are retried is read from the contracts: an RPC carries the
`(gearshift.v1.idempotent)` option when repeating it is safe, so the retry
policy cannot drift from the .proto files.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Generic, TypeVar

import grpc

from gearshift.common.auth import ClientDefaultsInterceptor, ClientTls
from gearshift.common.errors import ValidationError
from gearshift.common.leader_follow import LeaderFollowing
from gearshift.v1 import (
    brain_pb2,
    common_pb2,
    scheduler_pb2,
    shardmanager_pb2,
    worker_pb2,
)

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Gearshift's services restart (a new scheduler, a moved shard manager); with gRPC's default
# reconnect backoff (up to 120 s) a client would keep failing for minutes afterwards, e.g. a
# worker's heartbeats until it is declared lost. Reconnect attempts stay within a second.
RECONNECT_BACKOFF_MS = (100, 1_000)  # initial and minimum, maximum
CONTRACT_MODULES: tuple[ModuleType, ...] = (
    scheduler_pb2,
    brain_pb2,
    shardmanager_pb2,
    worker_pb2,
)


@cache
def idempotent_methods() -> tuple[tuple[str, str], ...]:
    """(service full name, method name) of every RPC marked idempotent in the contracts."""
    found: list[tuple[str, str]] = []
    for module in CONTRACT_MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.GetOptions().Extensions[common_pb2.idempotent]:
                    found.append((service.full_name, method.name))
    return tuple(sorted(found))


def retry_service_config(max_attempts: int = 5) -> str:
    """gRPC service config retrying idempotent calls on UNAVAILABLE with backoff."""
    config = {
        "methodConfig": [
            {
                "name": [{"service": s, "method": m} for s, m in idempotent_methods()],
                "retryPolicy": {
                    "maxAttempts": max_attempts,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    return json.dumps(config)


def channel_target(address: str) -> str:
    """The gRPC target of an address, or of several separated by commas (a scheduler and
    its standbys): gRPC's static list, which a channel tries in order and keeps the first
    that accepts (pick_first), trying the list again once that one fails. A standby
    answers reads and refuses writes naming the leader, which connect()'s channel then
    calls (gearshift.common.leader_follow). Several addresses must be IP
    literals (gRPC's ipv4:/ipv6: lists); a host name that resolves to them all is one
    address."""
    parts = [part.strip() for part in address.split(",")]
    if len(parts) == 1:
        return address
    families = {_ip_family(part) for part in parts}
    if None in families or len(families) != 1:
        raise ValidationError(
            "address",
            f"{address!r}: several addresses must be IP:PORT of one family, comma-separated "
            "(a host name that resolves to them all can stand alone)",
        )
    family = families.pop()
    return f"{family}:" + ",".join(parts)


def _ip_family(address: str) -> str | None:
    """'ipv4' or 'ipv6' for an IP:PORT ([IPv6]:PORT), None for anything else."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if ip.version == 6 and not host.startswith("["):
        return None
    return f"ipv{ip.version}"


def plain_channel(
    address: str,
    *,
    tls: ClientTls | None = None,
    retry: bool = True,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A channel with Gearshift's options and retry policy but no Python interceptor.

    For hot paths that pass the token and the deadline on each call themselves
    (the interceptor costs about a fifth of a small unary call's client CPU).
    Each channel has a subchannel pool of its own: gRPC's global pool would
    share one reconnect backoff among every channel to an address.
    """
    options = channel_options(retry=retry, max_message_bytes=max_message_bytes)
    target = channel_target(address)
    if tls:
        return grpc.secure_channel(target, tls.credentials(), options=options)
    return grpc.insecure_channel(target, options=options)


def aio_channel(
    address: str,
    *,
    tls: ClientTls | None = None,
    retry: bool = True,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.aio.Channel:
    """plain_channel on grpc.aio: its calls are answered on the event loop that makes them
    (create it there), not on a thread of its own as a plain channel's futures are."""
    options = channel_options(retry=retry, max_message_bytes=max_message_bytes)
    target = channel_target(address)
    if tls:
        return grpc.aio.secure_channel(target, tls.credentials(), options=options)
    return grpc.aio.insecure_channel(target, options=options)


def channel_options(
    *, retry: bool = True, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> list[tuple[str, str | int]]:
    """Gearshift's channel options: message sizes, keepalive, reconnect backoff, a
    subchannel pool per channel and the retry policy."""
    first, most = RECONNECT_BACKOFF_MS
    options: list[tuple[str, str | int]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.enable_retries", 1 if retry else 0),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", first),
        ("grpc.min_reconnect_backoff_ms", first),
        ("grpc.max_reconnect_backoff_ms", most),
    ]
    if retry:
        options.append(("grpc.service_config", retry_service_config()))
    return options


def connect(
    address: str,
    *,
    token: str | None = None,
    tls: ClientTls | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
    retry: bool = True,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A channel to a Gearshift service; unary calls without a deadline get `timeout`. A
    call that a standby scheduler refuses is sent on to the leader it names
    (gearshift.common.leader_follow)."""

    def dial(target: str, retry: bool) -> grpc.Channel:
        channel = plain_channel(target, tls=tls, retry=retry, max_message_bytes=max_message_bytes)
        return grpc.intercept_channel(channel, ClientDefaultsInterceptor(token, timeout))

    return LeaderFollowing(
        dial(address, retry), lambda leader: dial(leader, False), idempotent=is_idempotent
    )


def is_idempotent(method: str) -> bool:
    """Whether the RPC at `method` ("/package.Service/Method") may be sent twice."""
    service, _, name = method.lstrip("/").partition("/")
    return (service, name) in _idempotent_set()


@cache
def _idempotent_set() -> frozenset[tuple[str, str]]:
    return frozenset(idempotent_methods())


Stub = TypeVar("Stub")


class OptionalClient(Generic[Stub]):
    """A stub for a service the caller can do without: no address, no channel
    (`stub` is None and the caller falls back to local behaviour)."""

    def __init__(
        self,
        address: str,
        make_stub: Callable[[grpc.Channel], Stub],
        *,
        token: str | None = None,
        tls: ClientTls | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self._channel = connect(address, token=token, tls=tls, timeout=timeout) if address else None
        self.stub: Stub | None = None if self._channel is None else make_stub(self._channel)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
