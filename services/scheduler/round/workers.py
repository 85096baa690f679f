"""Calls from the scheduler to worker daemons (WorkerAgent.StartTask / StopTask /
ChangeMembership)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message

from gearshift.common.auth import ClientTls, bearer_metadata
from gearshift.common.channel import aio_channel, connect
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc

# How long past the longest call's own deadline a round waits for a bulk call's answers
GRACE_SECONDS = 10.0


class WorkerAgents:
    """One channel per worker address, reused. StartTask and StopTask go out in bulk, on
    grpc.aio from one event loop thread of their own, and come back as each call's answer
    or error; a log stream (a plain channel's) raises grpc.RpcError."""

    def __init__(
        self, *, token: str | None = None, tls: ClientTls | None = None, timeout: float = 30.0
    ) -> None:
        self._token = token
        self._tls = tls
        self._timeout = timeout
        self._stubs: dict[str, worker_pb2_grpc.WorkerAgentStub] = {}
        self._channels: list[grpc.Channel] = []
        self._lock = threading.Lock()
        self._metadata = bearer_metadata(token)
        self._loop: asyncio.AbstractEventLoop | None = None  # the bulk calls', started once
        self._loop_thread: threading.Thread | None = None
        self._closed = False
        # the bulk calls' channels, used on their loop only
        self._aio_stubs: dict[str, worker_pb2_grpc.WorkerAgentStub] = {}
        self._aio_channels: list[grpc.aio.Channel] = []

    def _stub(self, address: str) -> worker_pb2_grpc.WorkerAgentStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = connect(address, token=self._token, tls=self._tls, timeout=self._timeout)
                self._channels.append(channel)
                stub = worker_pb2_grpc.WorkerAgentStub(channel)
                self._stubs[address] = stub
            return stub

    def logs(self, address: str, request: worker_pb2.StreamTaskLogsRequest) -> Any:
        """A task's log stream (a grpc call: iterate it, cancel it); a follower has no
        deadline, a one-off read the usual one."""
        timeout = None if request.follow else self._timeout
        return self._stub(address).StreamTaskLogs(request, timeout=timeout)

    def step_log(
        self, address: str, request: worker_pb2.ReadStepLogRequest
    ) -> list[common_pb2.StepLoss]:
        """The step log a task's worker reads (grpc.RpcError when it cannot)."""
        return list(self._stub(address).ReadStepLog(request, timeout=self._timeout))

    def start_all(
        self, calls: Sequence[tuple[str, worker_pb2.StartTaskRequest]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """StartTask to each (address, request), all in flight at once (_in_flight)."""
        return self._in_flight((a, "StartTask", r, self._timeout) for a, r in calls)

    def stop_all(
        self, calls: Sequence[tuple[str, worker_pb2.StopTaskRequest]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """StopTask to each (address, request), all in flight at once (_in_flight); each
        may take the request's timeout_seconds to checkpoint, and the usual deadline more."""
        return self._in_flight(
            (a, "StopTask", r, r.timeout_seconds + self._timeout) for a, r in calls
        )

    def change_all(
        self, calls: Sequence[tuple[str, worker_pb2.ChangeMembershipRequest]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """ChangeMembership to each (address, request), all in flight at once (_in_flight)."""
        return self._in_flight((a, "ChangeMembership", r, self._timeout) for a, r in calls)

    def _in_flight(
        self, calls: Iterable[tuple[str, str, Message, float]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """Each (address, method, request, timeout) sent on the calls' event loop, all
        before any answer is awaited; then each one's status, or its error (a
        grpc.RpcError when the call failed). With a plain channel's futures, each channel
        answered on a thread of its own: a round's hundreds of calls to hundreds of
        workers woke as many threads, each waiting its turn at the interpreter while the
        RPCs held it (200 calls: 1.1 s with two busy threads, 0.1 s on one loop; a round's
        starts 0.8-1.5 s of its 1-2 s under bench/load.py)."""
        calls = list(calls)
        if not calls:
            return []
        loop = self._calls_loop()
        if loop is None:
            closed = RuntimeError("the scheduler's calls to workers are closed")
            return [closed] * len(calls)
        answers = asyncio.run_coroutine_threadsafe(self._gather(calls), loop)
        try:
            return answers.result(timeout=max(c[3] for c in calls) + GRACE_SECONDS)
        except concurrent.futures.TimeoutError as exc:  # every call has a deadline: not seen
            answers.cancel()
            return [exc] * len(calls)

    def _calls_loop(self) -> asyncio.AbstractEventLoop | None:
        with self._lock:
            if self._loop is None and not self._closed:
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(
                    target=self._loop.run_forever, name="worker-calls", daemon=True
                )
                self._loop_thread.start()
            return self._loop

    async def _gather(
        self, calls: list[tuple[str, str, Message, float]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        return list(await asyncio.gather(*(self._call(*call) for call in calls)))

    async def _call(
        self, address: str, method: str, request: Message, timeout: float
    ) -> common_pb2.TaskStatus | Exception:
        try:
            stub = self._aio_stubs.get(address)
            if stub is None:  # made on the loop, as grpc.aio wants
                channel = aio_channel(address, tls=self._tls)
                self._aio_channels.append(channel)
                stub = self._aio_stubs[address] = worker_pb2_grpc.WorkerAgentStub(channel)
            answer: common_pb2.TaskStatus = await getattr(stub, method)(
                request, timeout=timeout, metadata=self._metadata
            )
            return answer
        except Exception as exc:  # answered in its call's place
            return exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._loop_thread
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._stubs.clear()
        if loop is None or thread is None:
            return
        shut = asyncio.run_coroutine_threadsafe(self._close_aio(), loop)
        try:
            shut.result(timeout=GRACE_SECONDS)
        except Exception:  # leaving anyway: the loop stops below
            shut.cancel()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=GRACE_SECONDS)
        if not thread.is_alive():
            loop.close()

    async def _close_aio(self) -> None:
        channels, self._aio_channels, self._aio_stubs = self._aio_channels, [], {}
        await asyncio.gather(*(c.close(None) for c in channels), return_exceptions=True)
