"""gRPC servicer of the worker daemon: validate, call the Agent, return its answer.

Domain errors (ValidationError naming the field, NotFoundError, ...) become
status codes in the server's interceptor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc

from gearshift.common.validation import require, tail_lines
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from gearshift.worker.agent import Agent

MAX_STOP_TIMEOUT_S = 3600.0


class WorkerAgentServicer(worker_pb2_grpc.WorkerAgentServicer):
    """WorkerAgent over an Agent."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def StartTask(
        self, request: worker_pb2.StartTaskRequest, context: grpc.ServicerContext
    ) -> common_pb2.TaskStatus:
        return self.agent.start(request)  # plan_task validates every field

    def StopTask(
        self, request: worker_pb2.StopTaskRequest, context: grpc.ServicerContext
    ) -> common_pb2.TaskStatus:
        require(bool(request.task_id), "task_id", "is required")
        timeout = request.timeout_seconds
        require(
            math.isfinite(timeout) and 0 <= timeout <= MAX_STOP_TIMEOUT_S,
            "timeout_seconds",
            f"must be between 0 and {MAX_STOP_TIMEOUT_S:.0f} (got {timeout})",
        )
        require(len(request.reason) <= 1024, "reason", "at most 1024 characters")
        return self.agent.stop(
            request.task_id,
            checkpoint=request.checkpoint,
            reason=request.reason,
            timeout=timeout,
            epoch=request.epoch,
        )

    def ChangeMembership(
        self, request: worker_pb2.ChangeMembershipRequest, context: grpc.ServicerContext
    ) -> common_pb2.TaskStatus:
        require(bool(request.task_id), "task_id", "is required")
        require(request.HasField("change"), "change", "is required")
        return self.agent.change(request.task_id, request.change, epoch=request.epoch)

    def GetTaskStatus(
        self, request: worker_pb2.GetTaskStatusRequest, context: grpc.ServicerContext
    ) -> common_pb2.TaskStatus:
        require(bool(request.task_id), "task_id", "is required")
        return self.agent.status(request.task_id)

    def StreamTaskLogs(
        self, request: worker_pb2.StreamTaskLogsRequest, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.LogLine]:
        require(bool(request.task_id), "task_id", "is required")
        tail = tail_lines(request.rank, request.tail_lines)
        yield from self.agent.logs(
            request.task_id, request.rank, tail, request.follow, context.is_active
        )

    def ReadStepLog(
        self, request: worker_pb2.ReadStepLogRequest, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.StepLoss]:
        require(bool(request.task_id), "task_id", "is required")
        require(request.after_step >= 0, "after_step", f"must be >= 0 (got {request.after_step})")
        yield from self.agent.step_log(request.task_id, request.after_step)

    def DescribeWorker(
        self, request: worker_pb2.DescribeWorkerRequest, context: grpc.ServicerContext
    ) -> worker_pb2.WorkerDescription:
        return self.agent.describe()
