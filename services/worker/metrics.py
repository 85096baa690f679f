"""The worker daemon's Prometheus metrics (served with the RPC metrics, see
gearshift.common.metrics)."""

from __future__ import annotations

import prometheus_client

from gearshift.v1 import common_pb2

STARTED = prometheus_client.Counter(
    "gearshift_worker_tasks_started", "Tasks (a job's processes on this worker) started"
)
ENDED = prometheus_client.Counter(
    "gearshift_worker_tasks_ended",
    "Tasks ended, by final state: completed, checkpointed (stopped for a move), failed or "
    "left (its processes handed their ESTs over in place)",
    ["state"],
)


def task_started() -> None:
    STARTED.inc()


def task_ended(state: int) -> None:
    name = common_pb2.TaskState.Name(state).removeprefix("TASK_STATE_").lower()  # type: ignore[arg-type]
    ENDED.labels(name).inc()
