"""The step logs the dashboard has read, per job: each refresh reads only the new steps.

A job's step log only grows (a step run again after a restart has the bits it had), so
the steps after the last one held are all a refresh asks for; once a job has ended and
its log was read after that, it is not asked again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gearshift.client.dashboard.series import LossPoint
from gearshift.v1 import common_pb2

MAX_CACHED_JOBS = 256

ReadSteps = Callable[[str, int], Sequence[common_pb2.StepLoss]]  # (job id, after step)


@dataclass
class _Log:
    points: list[LossPoint] = field(default_factory=list)
    complete: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class StepCache:
    """Jobs' step logs as read so far (the least recently read job dropped first)."""

    def __init__(self, max_jobs: int = MAX_CACHED_JOBS) -> None:
        self.max_jobs = max_jobs
        self._logs: OrderedDict[str, _Log] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, job_id: str, ended: bool, read: ReadSteps) -> list[LossPoint]:
        """Every step of the job so far; `read` is asked for the new ones only (its errors
        pass through, the steps held stay for the next try)."""
        with self._lock:
            log = self._logs.get(job_id)
            if log is None:
                log = self._logs[job_id] = _Log()
            self._logs.move_to_end(job_id)
            while len(self._logs) > self.max_jobs:
                self._logs.popitem(last=False)
        with log.lock:
            if not log.complete:
                last = log.points[-1].step if log.points else 0
                log.points.extend(
                    LossPoint(s.step, s.time, s.loss) for s in read(job_id, last) if s.step > last
                )
                log.complete = ended
            return list(log.points)
