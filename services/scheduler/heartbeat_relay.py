"""A heartbeat relay: a process of the scheduler's that takes many workers' Heartbeats and
hands them to the scheduler in batches (WorkerRegistry.HeartbeatBatch).

Why: at a thousand workers heartbeating every second, the gRPC work of the calls alone
(about half a millisecond of CPU each in Python) fills the scheduler's interpreter, and
every other call waits behind them (bench/load.py). A relay does that work in its own
interpreter and the scheduler sees one call per batch, as Borg's link shards stand
between the Borglets and the elected master. A batch goes when its first heartbeat has
waited `--linger-ms` (or it is full), and heartbeats that arrive while one is in flight
go in the next: a batch handed on as soon as it was ready held one or two heartbeats
(the scheduler answers one in a fraction of a millisecond), and the scheduler took
nearly as many calls as before (bench/load.py).

Each heartbeat is checked here as the scheduler would (identity, fields), waits for its
batch and gets the scheduler's own reply; when the scheduler cannot be reached the worker
gets the error and registers again at the scheduler, which names the relay that serves it
then. The scheduler starts its relays (`--heartbeat-relays`) and a relay exits when that
parent does:

    gearshift-scheduler relay --upstream HOST:PORT --parent-pid PID [--listen HOST:0] ...
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from gearshift.common.channel import connect
from gearshift.common.config import Option
from gearshift.common.daemon import Daemon, outgoing_tls, run_daemon, server_options
from gearshift.common.errors import (
    GearshiftError,
    UnavailableError,
    UnimplementedError,
    error_from_rpc,
)
from gearshift.common.server import register
from gearshift.scheduler.worker_reports import MAX_BATCH, check_heartbeat
from gearshift.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("gearshift.scheduler.relay")

PROG = "gearshift-scheduler relay"
DESCRIPTION = "Relay workers' heartbeats to the scheduler in batches (started by the scheduler)."
CALL_TIMEOUT_S = 5.0  # a batch's call to the scheduler, and a heartbeat's wait for it
LINGER_MS = 20.0
# Heartbeats served at once, each waiting for its batch: a thousand a second lingering
# 20 ms and answered in as many more need about 40, and 32 (the servers' default) made
# them queue for a thread (heartbeat p50 153 ms at 1,000 workers, bench/load.py).
MAX_WAITING = 512
PARENT_CHECK_S = 1.0
OPTIONS = [
    *server_options(0),
    Option("upstream", "the scheduler's gRPC address (host:port) that batches go to", ""),
    Option("parent_pid", "exit when this process (the scheduler) is gone (0: never)", 0, int),
    Option(
        "linger_ms",
        "how long a batch's first heartbeat waits for others before the batch goes",
        LINGER_MS,
        float,
    ),
]

Send = Callable[
    [Sequence[scheduler_pb2.HeartbeatRequest]], Sequence[scheduler_pb2.HeartbeatResponse]
]


@dataclass
class _Waiting:
    request: scheduler_pb2.HeartbeatRequest
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    reply: scheduler_pb2.HeartbeatResponse | None = None
    error: GearshiftError | None = None


class HeartbeatBatcher:
    """Heartbeats handed on in batches by one thread, one batch at a time: a batch goes
    once its first heartbeat has waited `linger` seconds, or when it is full."""

    def __init__(
        self, send: Send, max_batch: int = MAX_BATCH, linger: float = LINGER_MS / 1000
    ) -> None:
        self._send = send
        self._max = max_batch
        self._linger = linger
        self._pending: list[_Waiting] = []
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="heartbeat-batches", daemon=True)
        self.batches = 0  # sent, answered or not

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop taking heartbeats; those pending are still sent."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join(timeout=CALL_TIMEOUT_S + 1)

    def relay(
        self, request: scheduler_pb2.HeartbeatRequest, timeout: float = CALL_TIMEOUT_S
    ) -> scheduler_pb2.HeartbeatResponse:
        """The scheduler's reply to this heartbeat, once its batch is answered."""
        waiting = _Waiting(request)
        with self._ready:
            if self._closed:
                raise UnavailableError("the heartbeat relay is stopping: heartbeat the scheduler")
            self._pending.append(waiting)
            # The first heartbeat starts the batch's linger, a full batch ends it.
            if len(self._pending) in (1, self._max):
                self._ready.notify()
        if not waiting.done.wait(timeout):
            raise UnavailableError(f"the scheduler did not answer within {timeout:.0f} s")
        if waiting.error is not None:
            raise waiting.error
        assert waiting.reply is not None
        return waiting.reply

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    return
                due = self._pending[0].arrived + self._linger
                while len(self._pending) < self._max and not self._closed:
                    left = due - time.monotonic()
                    if left <= 0:
                        break
                    self._ready.wait(left)
                batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            self._answer(batch)

    def _answer(self, batch: list[_Waiting]) -> None:
        self.batches += 1
        try:
            replies = self._send([w.request for w in batch])
            if len(replies) != len(batch):
                raise UnavailableError(
                    f"the scheduler answered {len(replies)} of {len(batch)} heartbeats"
                )
        except GearshiftError as exc:
            for waiting in batch:
                waiting.error = exc
                waiting.done.set()
            return
        for waiting, reply in zip(batch, replies, strict=True):
            waiting.reply = reply
            waiting.done.set()


class RelayServicer(scheduler_pb2_grpc.WorkerRegistryServicer):
    """Heartbeat only: the other calls of the Workers API go to the scheduler itself."""

    def __init__(self, batcher: HeartbeatBatcher) -> None:
        self.batcher = batcher

    def Heartbeat(
        self, request: scheduler_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.HeartbeatResponse:
        check_heartbeat(request)
        return self.batcher.relay(request)

    def RegisterWorker(self, request: Any, context: grpc.ServicerContext) -> Any:
        raise _elsewhere("RegisterWorker")

    def RenewLease(self, request: Any, context: grpc.ServicerContext) -> Any:
        raise _elsewhere("RenewLease")

    def TaskFinished(self, request: Any, context: grpc.ServicerContext) -> Any:
        raise _elsewhere("TaskFinished")

    def FetchCode(self, request: Any, context: grpc.ServicerContext) -> Any:
        raise _elsewhere("FetchCode")

    def HeartbeatBatch(self, request: Any, context: grpc.ServicerContext) -> Any:
        raise _elsewhere("HeartbeatBatch")


def _elsewhere(method: str) -> UnimplementedError:
    return UnimplementedError(
        f"{method}: a heartbeat relay takes only Heartbeat; call the scheduler itself"
    )


def sender(stub: scheduler_pb2_grpc.WorkerRegistryStub) -> Send:
    def send(
        heartbeats: Sequence[scheduler_pb2.HeartbeatRequest],
    ) -> Sequence[scheduler_pb2.HeartbeatResponse]:
        request = scheduler_pb2.HeartbeatBatchRequest(heartbeats=heartbeats)
        try:
            return stub.HeartbeatBatch(request, timeout=CALL_TIMEOUT_S).replies
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
            log.warning("a heartbeat batch failed", extra={"error": error.message})
            raise error from None

    return send


def watch_parent(pid: int) -> None:
    """SIGTERM this process (a clean stop) once `pid` is no longer its parent."""

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(PARENT_CHECK_S)
        log.info("the scheduler is gone; stopping", extra={"parent_pid": pid})
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def build(config: argparse.Namespace) -> Daemon:
    if not config.upstream:
        raise ValueError("--upstream is required: the scheduler's address")
    if not 0 <= config.linger_ms <= 1000:
        raise ValueError("--linger-ms must be 0 to 1000")
    channel = connect(config.upstream, token=config.token or None, tls=outgoing_tls(config))
    send = sender(scheduler_pb2_grpc.WorkerRegistryStub(channel))
    batcher = HeartbeatBatcher(send, linger=config.linger_ms / 1000)
    batcher.start()
    if config.parent_pid:
        watch_parent(config.parent_pid)
    service = scheduler_pb2.DESCRIPTOR.services_by_name["WorkerRegistry"].full_name
    return Daemon(
        [
            register(
                scheduler_pb2_grpc.add_WorkerRegistryServicer_to_server,
                RelayServicer(batcher),
                service,
            )
        ],
        on_stop=[batcher.close, channel.close],
        max_workers=MAX_WAITING,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(PROG, DESCRIPTION, OPTIONS, build, argv)


if __name__ == "__main__":
    sys.exit(main())
