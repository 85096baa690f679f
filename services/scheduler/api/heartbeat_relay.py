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

Workers heartbeat here on one open stream each (HeartbeatStream; unary Heartbeat is
served too): a stream's message costs about half of a unary call's CPU on grpc.aio, and
the relay serves its calls on one event loop, with no thread per waiting heartbeat (a
thread pool's hand-offs cost more than the calls themselves, bench/load.py). Each
heartbeat is checked here as the scheduler would (identity, fields), waits for its
batch and gets the scheduler's own reply; when the scheduler cannot be reached the worker
gets the error and registers again at the scheduler, which names the relay that serves it
then. The scheduler starts its relays (`--heartbeat-relays`) and a relay exits when that
parent does:

    gearshift-scheduler relay --upstream HOST:PORT --parent-pid PID [--listen HOST:0] ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
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
from gearshift.scheduler.api.worker_reports import MAX_BATCH, check_heartbeat
from gearshift.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("gearshift.scheduler.relay")

PROG = "gearshift-scheduler relay"
DESCRIPTION = "Relay workers' heartbeats to the scheduler in batches (started by the scheduler)."
CALL_TIMEOUT_S = 5.0  # a batch's call to the scheduler, and a heartbeat's wait for it
LINGER_MS = 20.0
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
    """A heartbeat in a batch, and who waits for its answer: a thread (`event`) or a
    coroutine (`future`, on its event loop)."""

    request: scheduler_pb2.HeartbeatRequest
    event: threading.Event | None = None
    future: asyncio.Future[None] | None = None
    arrived: float = field(default_factory=time.monotonic)
    reply: scheduler_pb2.HeartbeatResponse | None = None
    error: GearshiftError | None = None

    def result(self) -> scheduler_pb2.HeartbeatResponse:
        if self.error is not None:
            raise self.error
        assert self.reply is not None
        return self.reply


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
        """The scheduler's reply to this heartbeat, once its batch is answered (a thread's
        call: it waits)."""
        waiting = self._add(_Waiting(request, event=threading.Event()))
        assert waiting.event is not None
        if not waiting.event.wait(timeout):
            raise _timed_out(timeout)
        return waiting.result()

    async def relay_async(
        self, request: scheduler_pb2.HeartbeatRequest, timeout: float = CALL_TIMEOUT_S
    ) -> scheduler_pb2.HeartbeatResponse:
        """`relay` for a coroutine on an event loop: it awaits the batch's answer (a timer,
        not wait_for: that makes a task per heartbeat)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        waiting = self._add(_Waiting(request, future=done))
        timer = loop.call_later(timeout, _expire, done, timeout)
        try:
            await done
        finally:
            timer.cancel()
        return waiting.result()

    def _add(self, waiting: _Waiting) -> _Waiting:
        with self._ready:
            if self._closed:
                raise UnavailableError("the heartbeat relay is stopping: heartbeat the scheduler")
            self._pending.append(waiting)
            # The first heartbeat starts the batch's linger, a full batch ends it.
            if len(self._pending) in (1, self._max):
                self._ready.notify()
        return waiting

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
            _wake(batch)
            return
        for waiting, reply in zip(batch, replies, strict=True):
            waiting.reply = reply
        _wake(batch)


def _wake(batch: list[_Waiting]) -> None:
    """Tell a batch's waiters their answers are in: threads at once, coroutines with one
    call into their loop for the whole batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for waiting in batch:
        if waiting.event is not None:
            waiting.event.set()
        if waiting.future is not None:
            by_loop.setdefault(waiting.future.get_loop(), []).append(waiting.future)
    for loop, futures in by_loop.items():
        with contextlib.suppress(RuntimeError):  # its loop is closed: no one waits any more
            loop.call_soon_threadsafe(_finish, futures)


def _finish(futures: list[asyncio.Future[None]], error: BaseException | None = None) -> None:
    for done in futures:
        if done.done():  # answered, timed out or cancelled meanwhile
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)


def _expire(done: asyncio.Future[None], timeout: float) -> None:
    """A coroutine's wait ran out (its error built only then, off the hot path)."""
    _finish([done], _timed_out(timeout))


def _timed_out(timeout: float) -> UnavailableError:
    return UnavailableError(f"the scheduler did not answer within {timeout:.0f} s")


Context = grpc.aio.ServicerContext[Any, Any]


class RelayServicer(scheduler_pb2_grpc.WorkerRegistryServicer):
    """Heartbeats only (a stream or single calls), served on grpc.aio: the other calls of
    the Workers API go to the scheduler itself."""

    def __init__(self, batcher: HeartbeatBatcher) -> None:
        self.batcher = batcher

    async def Heartbeat(
        self, request: scheduler_pb2.HeartbeatRequest, context: Context
    ) -> scheduler_pb2.HeartbeatResponse:
        check_heartbeat(request)
        return await self.batcher.relay_async(request)

    async def HeartbeatStream(
        self, request_iterator: AsyncIterator[scheduler_pb2.HeartbeatRequest], context: Context
    ) -> AsyncIterator[scheduler_pb2.HeartbeatResponse]:
        async for request in request_iterator:
            check_heartbeat(request)
            yield await self.batcher.relay_async(request)

    async def RegisterWorker(self, request: Any, context: Context) -> Any:
        raise _elsewhere("RegisterWorker")

    async def RenewLease(self, request: Any, context: Context) -> Any:
        raise _elsewhere("RenewLease")

    async def TaskFinished(self, request: Any, context: Context) -> Any:
        raise _elsewhere("TaskFinished")

    async def FetchCode(self, request: Any, context: Context) -> Any:  # type: ignore[override]
        raise _elsewhere("FetchCode")

    async def HeartbeatBatch(self, request: Any, context: Context) -> Any:
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
        aio=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_daemon(PROG, DESCRIPTION, OPTIONS, build, argv)


if __name__ == "__main__":
    sys.exit(main())
