"""Each job's plan as a round sees it: the plan it runs, a changed one waiting for its next
start, the last one a PLAN event announced, and when it was last asked.

Shared by the data-parallel resource plans (resource_plans.py) and the parameter-server
plans (ps_jobs.py): they differ in how they ask and when a change is worth a restart, not
in this bookkeeping.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

P = TypeVar("P")


class PlanBook(Generic[P]):
    """Per-job plans under one lock; subclasses add their own state through the hooks."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._plans: dict[str, P] = {}  # what the job runs (or will start) with
        self._next: dict[str, P] = {}  # changed: applied at the job's next start
        self._announced: dict[str, P] = {}  # the last plan in a PLAN event
        self._asked_at: dict[str, float] = {}

    def plan(self, job_id: str) -> P | None:
        """The plan the job's next start uses (None: none yet)."""
        with self._lock:
            return self._next.get(job_id) or self._plans.get(job_id)

    def started(self, job_id: str) -> P | None:
        """The job (re)started on plan(job_id): returns that plan when no PLAN event has
        announced it yet (the caller records one)."""
        with self._lock:
            if job_id in self._next:
                self._plans[job_id] = self._next.pop(job_id)
            self._on_start(job_id)
            self._asked_at[job_id] = self.clock()  # measure the new plan a whole interval
            plan = self._plans.get(job_id)
            if plan is None or self._announced.get(job_id) is plan:
                return None
            self._announced[job_id] = plan
            return plan

    def forget(self, job_id: str) -> None:
        with self._lock:
            for table in (self._plans, self._next, self._announced, self._asked_at):
                table.pop(job_id, None)
            self._on_forget(job_id)

    def _on_start(self, job_id: str) -> None:
        """More state a start clears (under the lock)."""

    def _on_forget(self, job_id: str) -> None:
        """More state a forgotten job drops (under the lock)."""
