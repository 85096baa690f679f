"""Client side of gRPC health checking: ask a daemon whether it serves, or wait until it does."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.common.errors import rpc_code


def health_status(
    address: str,
    service: str = "",
    *,
    tls: ClientTls | None = None,
    timeout: float = 2.0,
) -> str:
    """The health status name (e.g. "SERVING"); "UNREACHABLE" when the daemon cannot be called."""
    with connect(address, tls=tls, timeout=timeout, retry=False) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            if rpc_code(exc) == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            return "UNREACHABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def wait_serving(
    address: str,
    timeout: float,
    *,
    service: str = "",
    tls: ClientTls | None = None,
) -> None:
    """Block until the daemon at `address` reports SERVING; TimeoutError after `timeout` seconds.

    Uses the health Watch stream, so it wakes as soon as the status changes
    instead of polling.
    """
    deadline = time.monotonic() + timeout
    last = "UNREACHABLE"
    while (remaining := deadline - time.monotonic()) > 0:
        with connect(address, tls=tls, retry=False) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                request = health_pb2.HealthCheckRequest(service=service)
                for reply in stub.Watch(request, timeout=remaining, wait_for_ready=True):
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError as exc:
                if rpc_code(exc) == grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
                last = "UNREACHABLE"
                # The server went away mid-watch; reconnect with wait_for_ready.
    raise TimeoutError(f"{address} not SERVING after {timeout:.1f}s (last status: {last})")
