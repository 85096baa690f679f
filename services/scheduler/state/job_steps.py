"""A job's step log, read through the worker of one of its tasks.

Rank 0 of a job writes a record per global step into the job's checkpoint folder, the
same folder for every task of the job, so one task's worker answers for the whole job:
the newest task holding rank 0 whose worker answers (an older one when that worker is
lost or has forgotten the task).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from gearshift.common.errors import UnavailableError, rpc_details
from gearshift.scheduler.state.job_logs import TaskSource
from gearshift.v1 import common_pb2, worker_pb2

ReadSteps = Callable[[str, worker_pb2.ReadStepLogRequest], Sequence[common_pb2.StepLoss]]


def job_steps(
    job_id: str, after_step: int, tasks: Sequence[TaskSource], read: ReadSteps
) -> list[common_pb2.StepLoss]:
    """The job's steps after `after_step`, from the newest task (oldest first in `tasks`)
    that holds rank 0 and whose worker answers; nothing for a job that never ran."""
    failures: list[str] = []
    for task in (t for t in reversed(tasks) if 0 in t.ranks):
        if not task.address:
            failures.append(f"task {task.task_id}: its worker is gone")
            continue
        request = worker_pb2.ReadStepLogRequest(task_id=task.task_id, after_step=after_step)
        try:
            return list(read(task.address, request))
        except grpc.RpcError as exc:
            failures.append(f"task {task.task_id}: {rpc_details(exc)}")
    if failures:
        why = "; ".join(failures)
        raise UnavailableError(f"no worker of job {job_id} can read its step log ({why})")
    return []
