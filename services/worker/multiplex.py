"""The worker's collocation loop: runs a controller (collocation.py) per background task.

Every poll, each running background task is matched with its foreground, the task of its
partner job that runs rank 0 on this worker (the one whose progress file is here), and its
controller's decision is applied: the task's pause file written or removed, its status
(paused, pause_reason, pause_count) set for GetTaskStatus and the heartbeats. A foreground
whose rank 0 runs on another worker cannot be measured here: its background runs
unpaused (at the lowest priority still). The thread starts with the first background task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from gearshift.v1 import common_pb2
from gearshift.worker.collocation import Controller, Foreground, Policy
from gearshift.worker.tasks import Task

log = logging.getLogger("gearshift.worker.multiplex")

POLL_S = 0.05
_MEASURABLE = (common_pb2.TASK_STATE_STARTING, common_pb2.TASK_STATE_RUNNING)


def foreground(tasks: Sequence[Task], job_id: str) -> Foreground | None:
    """What this worker sees of job `job_id`: its rank 0's progress (None: not here)."""
    for task in tasks:
        if task.job_id == job_id and 0 in task.plan.ranks and task.state in _MEASURABLE:
            report = task.progress_report()
            done = report is not None and report[1] >= task.plan.total_steps
            return Foreground(job_id, report, done)
    return None


class Multiplexer:
    """Polls the tasks and pauses or resumes the background ones."""

    def __init__(
        self,
        tasks: Callable[[], list[Task]],
        policy: Policy,
        *,
        clock: Callable[[], float] = time.time,  # the progress files' times are wall clock
        poll_s: float = POLL_S,
    ) -> None:
        self._tasks = tasks
        self.policy = policy
        self.clock = clock
        self.poll_s = poll_s
        self._controllers: dict[str, Controller] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start polling (once; later calls do nothing)."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name="multiplex", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(5.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except Exception:  # a bad poll must not end multiplexing for good
                log.exception("collocation poll failed")

    def tick(self) -> None:
        """One poll over the tasks."""
        tasks = self._tasks()
        now = self.clock()
        running = {t.task_id for t in tasks}
        for task_id in [t for t in self._controllers if t not in running]:
            del self._controllers[task_id]
        for task in tasks:
            if not task.plan.background or task.state not in _MEASURABLE:
                continue
            controller = self._controllers.get(task.task_id)
            collocation = task.plan.collocation
            if controller is None:
                policy = self.policy
                if collocation.max_foreground_slowdown > 0:
                    policy = replace(policy, max_slowdown=collocation.max_foreground_slowdown)
                controller = Controller(collocation.partner_job_id, policy, now)
                self._controllers[task.task_id] = controller
            decision = controller.update(now, foreground(tasks, collocation.partner_job_id))
            task.set_pause(decision.paused, decision.reason, decision.pause_count)
