"""Calls from the scheduler to worker daemons (WorkerAgent.StartTask / StopTask)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message

from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc


class WorkerAgents:
    """One channel per worker address, reused. StartTask and StopTask go out in bulk and
    come back as each call's answer or error; a log stream raises grpc.RpcError."""

    def __init__(
        self, *, token: str | None = None, tls: ClientTls | None = None, timeout: float = 30.0
    ) -> None:
        self._token = token
        self._tls = tls
        self._timeout = timeout
        self._stubs: dict[str, worker_pb2_grpc.WorkerAgentStub] = {}
        self._channels: list[grpc.Channel] = []
        self._lock = threading.Lock()

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

    def _in_flight(
        self, calls: Iterable[tuple[str, str, Message, float]]
    ) -> list[common_pb2.TaskStatus | Exception]:
        """Each (address, method, request, timeout) sent from the calling thread as a gRPC
        future, all before any answer is awaited (answered on gRPC's own threads); then
        each one's status, or its error (a grpc.RpcError when the call failed). With a
        thread per call a round's hundreds of starts were a hundred threads taking turns
        at the interpreter, and the scheduler's RPCs waited behind them (bench/load.py)."""
        pending: list[grpc.Future[common_pb2.TaskStatus] | Exception] = []
        for address, method, request, timeout in calls:
            try:
                call = getattr(self._stub(address), method)
                pending.append(call.future(request, timeout=timeout))
            except Exception as exc:
                pending.append(exc)
        return [_outcome(call) for call in pending]

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._stubs.clear()


def _outcome(
    call: grpc.Future[common_pb2.TaskStatus] | Exception,
) -> common_pb2.TaskStatus | Exception:
    if not isinstance(call, grpc.Future):  # it could not be sent (a call is an Exception too)
        return call
    try:
        return call.result()
    except Exception as exc:
        return exc
