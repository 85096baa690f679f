"""Calls from the scheduler to worker daemons (WorkerAgent.StartTask / StopTask)."""

from __future__ import annotations

import threading
from typing import Any

import grpc

from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc


class WorkerAgents:
    """One channel per worker address, reused; calls raise grpc.RpcError on failure."""

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

    def start(self, address: str, request: worker_pb2.StartTaskRequest) -> common_pb2.TaskStatus:
        return self._stub(address).StartTask(request, timeout=self._timeout)

    def stop(
        self, address: str, task_id: str, *, checkpoint: bool, reason: str, timeout: float
    ) -> common_pb2.TaskStatus:
        request = worker_pb2.StopTaskRequest(
            task_id=task_id, checkpoint=checkpoint, reason=reason, timeout_seconds=timeout
        )
        return self._stub(address).StopTask(request, timeout=timeout + self._timeout)

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._stubs.clear()
