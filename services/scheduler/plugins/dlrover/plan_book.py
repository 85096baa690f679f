"""Each job's plan as a round sees it: the plan it runs, a changed one waiting for its next
start, the last one a PLAN event announced, and when it was last asked.

Shared by the data-parallel resource plans (resource_plans.py) and the parameter-server
plans (ps_jobs.py): they differ in how they ask and when a change is worth a restart, not
in this bookkeeping. A placement's plan is stored with its job (`dump`, `load`; migration
0009): a restarted scheduler `restore`s it instead of planning a running job afresh.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("gearshift.scheduler.plan_book")

P = TypeVar("P")
D = TypeVar("D")


def dump(plan: Any) -> str:
    """A plan dataclass as its job's stored JSON; "" for none."""
    return "" if plan is None else json.dumps(dataclasses.asdict(plan), sort_keys=True)


def load(kind: type[D], text: str) -> D | None:
    """A stored plan back (lists become tuples again); None for none, or for a row no plan
    can be read from (logged: the job is then planned afresh, as before plans were stored)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return kind(**values)
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("stored plan unreadable; planned afresh", extra={"error": str(exc)})
        return None


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

    def restore(self, job_id: str, plan: P) -> None:
        """A restarted scheduler's memory of the plan the job's last placement ran (from its
        row): a running job is not restarted for it nor announced again, and is asked
        again an interval later, from it."""
        with self._lock:
            self._plans[job_id] = plan
            self._announced[job_id] = plan
            self._asked_at[job_id] = self.clock()

    def forget(self, job_id: str) -> None:
        with self._lock:
            for table in (self._plans, self._next, self._announced, self._asked_at):
                table.pop(job_id, None)
            self._on_forget(job_id)

    def _on_start(self, job_id: str) -> None:
        """More state a start clears (under the lock)."""

    def _on_forget(self, job_id: str) -> None:
        """More state a forgotten job drops (under the lock)."""
