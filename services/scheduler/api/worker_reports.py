"""Checks of what workers report (task statuses, heartbeats): shared by the scheduler's
servicer and its heartbeat relays, which refuse a bad heartbeat before it is batched."""

from __future__ import annotations

from gearshift.common.validation import check_enum, check_name, require
from gearshift.v1 import common_pb2, scheduler_pb2

MAX_BATCH = 10_000  # heartbeats in one HeartbeatBatch


def check_task_status(status: common_pb2.TaskStatus, field: str) -> None:
    require(bool(status.task_id), f"{field}.task_id", "is required")
    check_enum(
        status.state, common_pb2.TaskState.values(), f"{field}.state", allow_unspecified=False
    )
    check_progress(status.progress, f"{field}.progress")  # it feeds the job and the estimates


def check_progress(progress: common_pb2.JobProgress, field: str) -> None:
    require(progress.step >= 0, f"{field}.step", f"must be >= 0 (got {progress.step})")
    require(progress.total_steps >= 0, f"{field}.total_steps", "must be >= 0")
    require(progress.epoch >= 0, f"{field}.epoch", "must be >= 0")
    require(progress.samples_per_second >= 0, f"{field}.samples_per_second", "must be >= 0")


def check_heartbeat(request: scheduler_pb2.HeartbeatRequest, field: str = "") -> None:
    """`field` prefixes the names in errors (a batch's `heartbeats[3].`)."""
    check_name(request.worker_id, f"{field}worker_id")
    for i, task in enumerate(request.tasks):
        check_task_status(task, f"{field}tasks[{i}]")


def check_batch(request: scheduler_pb2.HeartbeatBatchRequest) -> None:
    """Every heartbeat, before any is applied: a bad one refuses the batch whole."""
    count = len(request.heartbeats)
    require(count <= MAX_BATCH, "heartbeats", f"at most {MAX_BATCH} (got {count})")
    for i, heartbeat in enumerate(request.heartbeats):
        check_heartbeat(heartbeat, f"heartbeats[{i}].")
