"""A job's training-process output, gathered from the workers that run or ran its tasks.

One RPC per hop: the client's StreamJobLogs is answered from WorkerAgent.StreamTaskLogs
calls, one per task (a task is the job's processes on one worker for one placement).
Without follow, each task's history in turn (its tail per rank). With follow, every
task's stream is read at once into a bounded queue, and tasks that start later (after
a rescale) are picked up, until the job ends and its last streams close. A worker that
cannot answer (lost, restarted and forgot the task) gives one line saying so instead of
failing the whole stream.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gearshift.common.errors import rpc_details
from gearshift.v1 import common_pb2, worker_pb2

QUEUE_LINES = 10_000  # lines in flight from the workers; a slow reader slows them
POLL_SECONDS = 0.5  # how often a follower looks for new tasks of the job
END_GRACE_SECONDS = 10.0  # after the job ends, how long its workers get to send the rest


@dataclass(frozen=True)
class TaskSource:
    task_id: str
    address: str  # the worker's; empty when the worker is unknown
    ranks: tuple[int, ...]
    ended: bool


@dataclass(frozen=True)
class LogSources:
    """Where a job's logs come from: its tasks (ended ones too, oldest first), whether it
    has ended, a log stream per task (a grpc call: iterable, cancellable), and whether
    the client still listens."""

    tasks: Callable[[], Sequence[TaskSource]]
    job_ended: Callable[[], bool]
    open_stream: Callable[[str, worker_pb2.StreamTaskLogsRequest], Any]
    active: Callable[[], bool]


def _note(job_id: str, task: TaskSource, why: str) -> common_pb2.LogLine:
    rank = task.ranks[0] if task.ranks else -1
    text = f"[gearshift: logs of task {task.task_id} are not available: {why}]"
    return common_pb2.LogLine(
        job_id=job_id, rank=rank, time=time.time(), text=text, task_id=task.task_id
    )


def job_log_lines(
    job_id: str,
    rank: int,
    tail_lines: int,
    follow: bool,
    sources: LogSources,
) -> Iterator[common_pb2.LogLine]:
    """The lines of the job's tasks that hold `rank` (-1: every rank)."""

    def wanted(task: TaskSource) -> bool:
        return rank < 0 or rank in task.ranks

    def request(task: TaskSource) -> worker_pb2.StreamTaskLogsRequest:
        return worker_pb2.StreamTaskLogsRequest(
            task_id=task.task_id, rank=rank, tail_lines=tail_lines, follow=follow and not task.ended
        )

    if not follow:
        for task in filter(wanted, sources.tasks()):
            if not task.address:
                yield _note(job_id, task, "its worker is gone")
                continue
            try:
                for line in sources.open_stream(task.address, request(task)):
                    yield common_pb2.LogLine(
                        job_id=job_id,
                        rank=line.rank,
                        time=line.time,
                        text=line.text,
                        task_id=task.task_id,
                    )
            except grpc.RpcError as exc:
                yield _note(job_id, task, rpc_details(exc))
        return
    yield from _follow(job_id, wanted, request, sources)


def _follow(
    job_id: str,
    wanted: Callable[[TaskSource], bool],
    request: Callable[[TaskSource], worker_pb2.StreamTaskLogsRequest],
    sources: LogSources,
) -> Iterator[common_pb2.LogLine]:
    lines: queue.Queue[common_pb2.LogLine | None] = queue.Queue(QUEUE_LINES)
    calls: list[Any] = []
    seen: set[str] = set()
    live = 0

    def pump(task: TaskSource, call: Any) -> None:
        try:
            for line in call:
                line.job_id, line.task_id = job_id, task.task_id
                lines.put(line)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                lines.put(_note(job_id, task, rpc_details(exc)))
        finally:
            lines.put(None)  # this task's stream is over

    ended_at: float | None = None
    try:
        while sources.active():
            ended = sources.job_ended()  # read before the tasks: a last task is never missed
            if ended and ended_at is None:
                ended_at = time.monotonic()
            for task in sources.tasks():
                if task.task_id in seen or not wanted(task):
                    continue
                seen.add(task.task_id)
                if not task.address:
                    yield _note(job_id, task, "its worker is gone")
                    continue
                call = sources.open_stream(task.address, request(task))
                calls.append(call)
                live += 1
                threading.Thread(target=pump, args=(task, call), daemon=True).start()
            if ended_at is not None and (
                live == 0 or time.monotonic() - ended_at > END_GRACE_SECONDS
            ):
                return
            try:
                item = lines.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            while True:
                if item is None:
                    live -= 1
                else:
                    yield item
                try:
                    item = lines.get_nowait()
                except queue.Empty:
                    break
    finally:
        for call in calls:
            call.cancel()
