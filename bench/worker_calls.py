"""A round's StartTask calls to many workers while other threads hold the interpreter: the
scheduler's WorkerAgents (grpc.aio, one event loop thread) against the plain-channel futures
it used before (answered on a thread per channel), in the same run.

    .venv/bin/python bench/worker_calls.py [--calls 200] [--busy 2] [--trials 5]

A WorkerAgent server runs in a child process (every worker of the round is one of its
addresses, 127.0.x.y: a channel each, as to distinct workers); `--busy` threads of this
process run Python loops meanwhile, as the scheduler's RPC threads do, with the scheduler's
1 ms interpreter switch. Printed: each way's median seconds for the round's calls, and the
ratio. On the two-core machine of 2026-11-28, 200 calls with 2 busy threads: futures
1.09 s, aio 0.07-0.15 s.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc

from gearshift.common.channel import plain_channel
from gearshift.scheduler.daemon import GIL_SWITCH_MS
from gearshift.scheduler.round.workers import WorkerAgents
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc


class _Agent(worker_pb2_grpc.WorkerAgentServicer):
    def StartTask(
        self, request: worker_pb2.StartTaskRequest, context: grpc.ServicerContext
    ) -> common_pb2.TaskStatus:
        return common_pb2.TaskStatus(task_id=request.task_id, state=common_pb2.TASK_STATE_RUNNING)


def _serve(port: Any, stop: Any) -> None:  # a spawn context's Queue and Event
    server = grpc.server(futures.ThreadPoolExecutor(8))
    worker_pb2_grpc.add_WorkerAgentServicer_to_server(_Agent(), server)  # type: ignore[abstract]
    port.put(server.add_insecure_port("0.0.0.0:0"))
    server.start()
    stop.wait()
    server.stop(None)


def futures_round(
    stubs: dict[str, worker_pb2_grpc.WorkerAgentStub],
    calls: list[tuple[str, worker_pb2.StartTaskRequest]],
) -> None:
    """The baseline: every call a plain channel's future, then each result."""
    pending = [stubs[a].StartTask.future(r, timeout=30) for a, r in calls]
    for call in pending:
        call.result()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--busy", type=int, default=2, help="threads running Python loops")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    if args.calls < 1 or args.busy < 0 or args.trials < 1:
        parser.error("--calls and --trials must be > 0, --busy >= 0")
    ctx = mp.get_context("spawn")
    port_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(port_queue, stop), daemon=True)
    server.start()
    port = port_queue.get(timeout=60)
    sys.setswitchinterval(GIL_SWITCH_MS / 1000)
    addresses = [f"127.0.{1 + i // 250}.{1 + i % 250}:{port}" for i in range(args.calls)]
    calls = [(a, worker_pb2.StartTaskRequest(task_id=f"t{i}")) for i, a in enumerate(addresses)]
    channels = [plain_channel(a) for a in addresses]
    stubs = {
        a: worker_pb2_grpc.WorkerAgentStub(c) for a, c in zip(addresses, channels, strict=True)
    }
    agents = WorkerAgents(timeout=30)
    done = threading.Event()

    def busy() -> None:
        while not done.is_set():
            sum(range(1000))

    try:
        futures_round(stubs, calls)  # connected once, as a running scheduler's channels are
        agents.start_all(calls)
        for _ in range(args.busy):
            threading.Thread(target=busy, daemon=True).start()
        seconds: dict[str, list[float]] = {"plain futures": [], "aio loop": []}
        for _ in range(args.trials):
            began = time.perf_counter()
            futures_round(stubs, calls)
            seconds["plain futures"].append(time.perf_counter() - began)
            began = time.perf_counter()
            answers = agents.start_all(calls)
            seconds["aio loop"].append(time.perf_counter() - began)
            if not all(isinstance(a, common_pb2.TaskStatus) for a in answers):
                raise SystemExit(
                    f"a call failed: {next(a for a in answers if isinstance(a, Exception))}"
                )
    finally:
        done.set()
        agents.close()
        for channel in channels:
            channel.close()
        stop.set()
        server.join(timeout=10)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"{args.calls} StartTask calls to {args.calls} addresses, {args.busy} busy threads:")
    for name, value in medians.items():
        print(
            f"  {name:<14} median {value:.3f} s  ({', '.join(f'{v:.3f}' for v in seconds[name])})"
        )
    print(f"  plain futures / aio loop: {medians['plain futures'] / medians['aio loop']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
