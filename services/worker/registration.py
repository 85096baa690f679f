"""The worker daemon's side of the Workers API: register, heartbeat, renew leases, report ends.

One thread does it all, in this order each tick (the interval the scheduler
returned at registration; at once when a task ends):

1. register when not registered (at start, when a heartbeat answers
   `reregister`: the scheduler declared this worker lost or lost its state), with
   the tasks still known here;
2. heartbeat with every task not yet acknowledged: active ones, and ended ones
   whose TaskFinished did not get through (the scheduler applies an end seen in
   a heartbeat as it would the TaskFinished); at the heartbeat relay the
   registration named, if any, on one open HeartbeatStream (a heartbeat that
   fails there: register again);
3. TaskFinished for every ended task not yet acknowledged, retried until it is;
4. RenewLease for every running task, at most every lease third. The lease is
   a fence: an answer of `renewed = false` means the scheduler no longer holds
   the task for this worker (it gave it up: this worker was declared lost, or
   a StopTask for it could not get through), and the task is terminated at
   once, without a checkpoint (its job may run elsewhere; a checkpoint now
   could overwrite that placement's). The scheduler stops a task only with
   StopTask; a lease never asks for a checkpoint.

A scheduler that is down or restarting costs log lines and retries, never a
task: a lease that runs out stops nothing, a refusal does.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from gearshift.common.auth import ClientTls
from gearshift.common.channel import connect
from gearshift.common.codepkg import assemble
from gearshift.common.errors import error_from_rpc, rpc_code, rpc_details
from gearshift.common.facts import ENDED_TASK_STATES
from gearshift.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from gearshift.worker.agent import Agent
from gearshift.worker.tasks import Task

log = logging.getLogger("gearshift.worker.registration")

CALL_TIMEOUT_S = 5.0
FIRST_INTERVAL_S = 1.0
MAX_RETRY_S = 5.0
FETCH_TIMEOUT_S = 120.0  # a code package is at most 32 MiB


class SchedulerLink:
    """Keeps this worker registered and its tasks reported; `start()` runs the thread."""

    def __init__(
        self,
        scheduler: str,
        agent: Agent,
        *,
        advertise: str,
        token: str | None = None,
        tls: ClientTls | None = None,
        hostname: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.agent = agent
        self.advertise = advertise
        self.token = token
        self.hostname = hostname or socket.gethostname()
        self.clock = clock
        self.registered = False
        self.registrations = 0
        self.interval = FIRST_INTERVAL_S
        self.tls = tls
        self._channel = connect(scheduler, token=token, tls=tls, timeout=CALL_TIMEOUT_S)
        self._stub = scheduler_pb2_grpc.WorkerRegistryStub(self._channel)
        # The scheduler's heartbeat relay for this worker, when it names one at registration.
        self.relay = ""
        self._relay_channel: grpc.Channel | None = None
        self._relay_stream: HeartbeatStream | None = None
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed_at: dict[str, float] = {}
        self._failures = 0
        agent.on_task_end = self._task_ended
        agent.fetch_code = self.fetch_code

    def fetch_code(self, sha256: str) -> bytes:
        """A code package from the scheduler, its size and hash checked."""
        request = scheduler_pb2.FetchCodeRequest(sha256=sha256)
        try:
            return assemble(self._stub.FetchCode(request, timeout=FETCH_TIMEOUT_S))[1]
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scheduler-link", daemon=True)
        self._thread.start()

    def close(self, flush_timeout: float = 5.0) -> None:
        """Report the ends not yet acknowledged (bounded), then stop the thread."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S + 1)
        deadline = time.monotonic() + flush_timeout
        while time.monotonic() < deadline and self._report_ends():
            time.sleep(0.1)
        self._use_relay(0)
        self._channel.close()

    def _task_ended(self, task: Task) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self.tick()
            except Exception:  # the link must outlive any one bad answer
                log.exception("scheduler link tick failed")
            wait = self.interval if self._failures == 0 else min(self.interval, MAX_RETRY_S)
            self._wake.wait(wait)
            self._wake.clear()

    def tick(self) -> None:
        if not self.registered and not self._register():
            return
        if not self._heartbeat():
            return
        self._report_ends()
        self._renew_leases()

    # -- calls -------------------------------------------------------------------------

    def _failed(self, what: str, exc: grpc.RpcError) -> None:
        self._failures += 1
        level = logging.WARNING if self._failures in (1, 10) or self._failures % 100 == 0 else 0
        if level:
            log.warning(
                f"{what} failed; retrying",
                extra={"code": str(rpc_code(exc)), "error": rpc_details(exc), "n": self._failures},
            )

    def _register(self) -> bool:
        request = scheduler_pb2.RegisterWorkerRequest(
            worker_id=self.agent.worker_id,
            address=self.advertise,
            hostname=self.hostname,
            devices=self.agent.devices,
            tasks=self.agent.unreported(),
            cpu_cores=len(self.agent.cores.cores),
            memory_bytes=self.agent.memory_bytes,
        )
        try:
            reply = self._stub.RegisterWorker(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            self._failed("registration", exc)
            return False
        self._failures = 0
        self.registered = True
        self.registrations += 1
        if reply.heartbeat_interval_seconds > 0:
            self.interval = reply.heartbeat_interval_seconds
        self._use_relay(reply.heartbeat_port)
        if reply.worker_id and reply.worker_id != self.agent.worker_id:
            log.warning(
                "the scheduler renamed this worker",
                extra={"asked": self.agent.worker_id, "given": reply.worker_id},
            )
            self.agent.worker_id = reply.worker_id
        log.info(
            "registered",
            extra={
                "worker_id": self.agent.worker_id,
                "scheduler": self.scheduler,
                "heartbeat_interval": self.interval,
            },
        )
        return True

    def _use_relay(self, port: int) -> None:
        """Heartbeat at this port of the scheduler's host from now on (0: the scheduler)."""
        if port and "," in self.scheduler:
            port = 0  # which of the schedulers answered is not known here: no relay
        relay = f"{self.scheduler.rpartition(':')[0]}:{port}" if port else ""
        if relay == self.relay:
            return
        if self._relay_stream is not None:
            self._relay_stream.close()
            self._relay_stream = None
        if self._relay_channel is not None:
            self._relay_channel.close()
            self._relay_channel = None
        self.relay = relay
        if relay:
            self._relay_channel = connect(
                relay, token=self.token, tls=self.tls, timeout=CALL_TIMEOUT_S
            )
            stub = scheduler_pb2_grpc.WorkerRegistryStub(self._relay_channel)
            self._relay_stream = HeartbeatStream(stub)

    def _heartbeat(self) -> bool:
        request = scheduler_pb2.HeartbeatRequest(
            worker_id=self.agent.worker_id, tasks=self.agent.unreported()
        )
        try:
            if self._relay_stream is not None:
                reply = self._relay_stream.beat(request)
            else:
                reply = self._stub.Heartbeat(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            self._failed("heartbeat", exc)
            if self.relay:  # the scheduler names a relay that serves, or none
                log.warning(
                    "heartbeat relay failed; registering again", extra={"relay": self.relay}
                )
                self._use_relay(0)
                self.registered = False
            return False
        self._failures = 0
        if reply.reregister:
            log.warning("the scheduler asks this worker to register again")
            self.registered = False
            return self._register()
        return True

    def _report_ends(self) -> bool:
        """TaskFinished for each unacknowledged end; True while some remain."""
        ended = [s for s in self.agent.unreported() if s.state in ENDED_TASK_STATES]
        left = False
        for status in ended:
            request = scheduler_pb2.TaskFinishedRequest(
                worker_id=self.agent.worker_id, status=status
            )
            try:
                self._stub.TaskFinished(request, timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as exc:
                if rpc_code(exc) == grpc.StatusCode.INVALID_ARGUMENT:  # would never succeed
                    log.error("TaskFinished refused", extra={"error": rpc_details(exc)})
                    self.agent.acknowledged(status.task_id)
                    continue
                self._failed("TaskFinished", exc)
                left = True
                continue
            self.agent.acknowledged(status.task_id)
            self._renewed_at.pop(status.task_id, None)
        return left

    def _renew_leases(self) -> None:
        now = self.clock()
        for task in self.agent.running():
            period = max(
                self.interval, (task.lease_expires_at - now) / 3 if task.lease_expires_at else 0
            )
            if now - self._renewed_at.get(task.task_id, 0.0) < min(period, 30.0):
                continue
            request = scheduler_pb2.RenewLeaseRequest(
                worker_id=self.agent.worker_id, task_id=task.task_id
            )
            try:
                reply = self._stub.RenewLease(request, timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as exc:
                self._failed("lease renewal", exc)
                return
            self._renewed_at[task.task_id] = now
            self._apply_lease(task, reply)

    def _apply_lease(self, task: Task, reply: scheduler_pb2.RenewLeaseResponse) -> None:
        if not self.agent.fence.current(reply.epoch):
            log.warning(
                "lease answer from a deposed scheduler leader ignored",
                extra={"task_id": task.task_id, "epoch": reply.epoch},
            )
            return
        if reply.renewed:
            task.lease_expires_at = reply.lease.expires_at
            return
        if task.state == common_pb2.TASK_STATE_STOPPING:
            return  # a StopTask is under way: it ends the task
        log.warning(
            "the scheduler no longer holds this task; terminating", extra={"task_id": task.task_id}
        )
        threading.Thread(
            target=task.request_stop,
            kwargs={"checkpoint": False, "reason": "unknown to the scheduler"},
            daemon=True,
        ).start()


class HeartbeatStream:
    """Heartbeats on one open HeartbeatStream call (at a relay): each request written and
    its reply read back within the timeout. Any failure ends the call for good; the link
    then registers again and opens another."""

    def __init__(
        self, stub: scheduler_pb2_grpc.WorkerRegistryStub, timeout: float = CALL_TIMEOUT_S
    ) -> None:
        self._requests: queue.SimpleQueue[scheduler_pb2.HeartbeatRequest | None] = (
            queue.SimpleQueue()
        )
        # A grpc call that is also an iterator of the replies (grpc's stubs type it loosely).
        self._replies: Any = stub.HeartbeatStream(iter(self._requests.get, None))
        self._timeout = timeout

    def beat(self, request: scheduler_pb2.HeartbeatRequest) -> scheduler_pb2.HeartbeatResponse:
        self._requests.put(request)
        timer = threading.Timer(self._timeout, self._replies.cancel)  # bounds the read
        timer.start()
        try:
            reply: scheduler_pb2.HeartbeatResponse = next(self._replies)
        except StopIteration:
            raise StreamEnded() from None
        finally:
            timer.cancel()
        return reply

    def close(self) -> None:
        self._requests.put(None)
        self._replies.cancel()


class StreamEnded(grpc.RpcError):
    """The relay ended the heartbeat stream without a status (as a stopping server may)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the heartbeat relay ended the stream"


def default_worker_id(hostname: str, port: int) -> str:
    """`<host>-<port>`: stable across restarts on a fixed port."""
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in hostname) or "worker"
    return f"{safe}-{port}"
