"""What the RPC metrics interceptor costs a unary call, measured side by side in one run.

Two in-process servers with the same trivial handler, one counting and timing every call
(ServerSettings(rpc_metrics=True), as `--metrics-listen` sets), one not; calls alternate
between them in rounds, and the figure is the median over rounds of the per-call time
ratio (metrics / none), with the client's and the server's CPU in this one process. Run
for both servers: GrpcServer (thread pool) and AioGrpcServer (grpc.aio).

    .venv/bin/python bench/rpc_metrics.py [--calls 300] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import grpc

from gearshift.common.channel import plain_channel
from gearshift.common.server import AioGrpcServer, GrpcServer, ServerSettings

SERVICE = "gearshift.bench.Echo"


def _sync_handler() -> Any:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    return grpc.method_handlers_generic_handler(
        SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )


def _aio_handler() -> Any:
    async def echo(request: bytes, context: Any) -> bytes:
        return request

    return grpc.method_handlers_generic_handler(
        SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )


def _per_call(call: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call(b"x", timeout=10)
    return (time.perf_counter() - start) / calls


def measure(kind: str, calls: int, rounds: int) -> tuple[float, float, float]:
    """(median µs per call without, with metrics, median ratio)."""
    servers: list[GrpcServer | AioGrpcServer] = []
    for metrics in (False, True):
        settings = ServerSettings(rpc_metrics=metrics, grace_seconds=0)
        if kind == "sync":
            servers.append(GrpcServer([], settings, [_sync_handler()]))
        else:
            servers.append(AioGrpcServer([], settings, [_aio_handler()]))
    for server in servers:
        server.start()
    channels = [plain_channel(s.address, retry=False) for s in servers]
    try:
        stubs = [c.unary_unary(f"/{SERVICE}/Echo") for c in channels]  # type: ignore[call-arg]
        for stub in stubs:
            _per_call(stub, 50)  # warm up
        plain, metered, ratios = [], [], []
        for _ in range(rounds):
            a = _per_call(stubs[0], calls)
            b = _per_call(stubs[1], calls)
            plain.append(a)
            metered.append(b)
            ratios.append(b / a)
    finally:
        for channel in channels:
            channel.close()
        for server in servers:
            server.stop(0)
    return (
        statistics.median(plain) * 1e6,
        statistics.median(metered) * 1e6,
        statistics.median(ratios),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per server per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    for kind in ("sync", "aio"):
        plain, metered, ratio = measure(kind, args.calls, args.rounds)
        print(
            f"{kind:>4}: {plain:7.1f} µs/call without metrics, {metered:7.1f} with, "
            f"ratio {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
