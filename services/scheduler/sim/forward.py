"""Estimated starts: the round's pipeline (`plan_round`) run forward on simulated time from a
snapshot of the live state, to say when each waiting job should start.

The jobs run at the rates the allocators themselves predict (round/ests.rate: the job's
measured or estimated speed per device type, its scaling), a moved job pays its restart
time, and a round ends at `round_seconds` or at the next completion. Nothing arrives that
has not arrived: a job submitted later with a higher priority makes the estimate early. The
allocator is a copy of the live one, with its memory of past rounds (Gavel's time ledger),
where it can be copied (it decides in the scheduler's process, no recomputation under way);
else a fresh one of the configured kind, whose estimate is the policy's without that memory
(bench/estimated_start.py measures both).

Bounded: at most `max_rounds` simulated rounds, `horizon_seconds` of simulated time and
`budget_seconds` of wall time; a job not started within them has no estimate.
`LiveEstimates` runs it (with the profile's collocate stage) off the scheduler's lock, at
most once every `every_seconds`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

from gearshift.scheduler.round.decider import copy_at_rest
from gearshift.scheduler.round.ests import elastic_job, rate
from gearshift.scheduler.round.pipeline import plan_round
from gearshift.scheduler.round.placement import count_by_type
from gearshift.scheduler.state.state import SchedulerState
from gearshift.scheduler.types import (
    Allocator,
    Assignment,
    Collocator,
    Ran,
    Snapshot,
    config_of,
)

log = logging.getLogger("gearshift.scheduler")


@dataclass(frozen=True)
class Bounds:
    """How far an estimate looks: simulated rounds, simulated seconds, wall seconds."""

    round_seconds: float = 360.0
    horizon_seconds: float = 24 * 3600.0
    max_rounds: int = 200
    budget_seconds: float = 2.0


def estimate_starts(
    snapshot: Snapshot,
    current: Mapping[str, Assignment],
    allocator: Allocator,
    bounds: Bounds,
    collocator: Collocator | None = None,
) -> dict[str, float]:
    """Each waiting job's simulated start (seconds since the epoch, as `snapshot.now`); a
    job that does not start within the bounds is left out. See the module docstring."""
    deadline = time.perf_counter() + bounds.budget_seconds
    jobs = {job.job_id: job for job in snapshot.jobs}
    waiting = {job_id for job_id in jobs if not current.get(job_id)}
    held: dict[str, Assignment] = {j: list(a) for j, a in current.items() if a and j in jobs}
    resume: dict[str, float] = {}
    starts: dict[str, float] = {}
    ran: tuple[Ran, ...] = snapshot.ran
    now, end_of_horizon = snapshot.now, snapshot.now + bounds.horizon_seconds
    for _ in range(bounds.max_rounds):
        if not waiting - starts.keys() or time.perf_counter() > deadline or now > end_of_horizon:
            break
        view = Snapshot(now, snapshot.devices, tuple(jobs.values()), ran, snapshot.avoid)
        _, desired = plan_round(view, allocator, held, collocator)
        placed = {j: list(a) for j, a in desired.items() if a and j in jobs}
        for job_id in placed:
            if job_id in waiting and job_id not in starts:
                starts[job_id] = now
        for job_id, assignment in placed.items():
            before = held.get(job_id)
            if before is not None and _config(before) != _config(assignment):
                resume[job_id] = now + jobs[job_id].restart_seconds  # checkpoint and restart
        held = placed
        if not held:
            break  # nothing runs and nothing will arrive: no later round differs
        speeds = {j: rate(elastic_job(jobs[j]), dict(_config(a))) for j, a in held.items()}
        end = now + bounds.round_seconds
        for job_id, speed in speeds.items():
            if speed > 0:
                begin = max(now, resume.get(job_id, now))
                end = min(end, begin + jobs[job_id].steps_remaining / speed)
        end = max(end, now + 1e-3)
        out: list[Ran] = []
        for job_id, speed in speeds.items():
            job = jobs[job_id]
            work = speed * max(0.0, end - max(now, resume.get(job_id, now)))
            left = job.steps_remaining - work
            config = _config(held[job_id])
            out.append(Ran(job_id, config, end - now))
            if left <= 1e-6 * max(1.0, job.steps_remaining):
                del jobs[job_id]  # done
                held.pop(job_id)
                continue
            jobs[job_id] = dataclasses.replace(
                job,
                steps_remaining=left,
                current=config,
                attained_seconds=job.attained_seconds + end - now,
            )
        ran, now = tuple(out), end
    return starts


def copy_allocator(allocator: Allocator) -> Allocator | None:
    """A copy of a live allocator, with its memory of past rounds (Gavel's time ledger), to
    run forward without touching the original; None when it cannot be copied (a
    recomputation under way in a thread, a plugin holding a lock or a connection)."""
    copied = copy_at_rest(allocator)
    return standalone(copied) if copied is not None else None


def standalone(allocator: Allocator) -> Allocator:
    """A lent copy made to recompute in the forward run itself, never in a thread."""
    for part in (allocator, getattr(allocator, "inner", None)):  # Guarantees wraps it
        if part is not None and hasattr(part, "in_background"):
            part.in_background = False
    return allocator


def _config(assignment: Assignment) -> tuple[tuple[str, int], ...]:
    return config_of(count_by_type(d for d, _ in assignment))


class LiveEstimates:
    """A round observer that estimates the waiting jobs' starts from the round's snapshot,
    in `executor` (off the round and off the lock), at most once every `every_seconds` and
    one at a time, then sets them on the jobs (under the lock). `allocator` is called in
    the round's thread, where the live allocator is at rest between rounds (a copy)."""

    def __init__(
        self,
        state: SchedulerState,
        allocator: Callable[[], Allocator],
        executor: Executor,
        collocator: Callable[[], Collocator | None],
        *,
        bounds: Bounds,
        every_seconds: float = 30.0,
    ) -> None:
        self.state = state
        self.allocator = allocator
        self.collocator = collocator
        self.executor = executor
        self.bounds = bounds
        self.every_seconds = every_seconds
        self._busy = threading.Lock()
        self._last = -float("inf")
        self.runs = 0
        self.last_seconds = 0.0  # wall time of the last estimate

    def round_done(self, snapshot: Snapshot | None, current: Mapping[str, Assignment]) -> None:
        """Called at the end of a round: start an estimate if one is due and none runs."""
        now = time.monotonic()
        if snapshot is None or now - self._last < self.every_seconds:
            return
        if not self._busy.acquire(blocking=False):
            return
        self._last = now
        try:
            allocator = self.allocator()
            self.executor.submit(self._run, snapshot, dict(current), allocator)
        except Exception:  # shutting down, or a plugin that would not build
            self._busy.release()
            log.exception("estimating starts not started")

    def _run(
        self, snapshot: Snapshot, current: Mapping[str, Assignment], allocator: Allocator
    ) -> None:
        try:
            self._estimate(snapshot, current, allocator)
        except Exception:  # an estimate must never break the rounds
            log.exception("estimating starts failed")
        finally:
            self._busy.release()

    def _estimate(
        self, snapshot: Snapshot, current: Mapping[str, Assignment], allocator: Allocator
    ) -> dict[str, float]:
        began = time.perf_counter()
        starts = estimate_starts(snapshot, current, allocator, self.bounds, self.collocator())
        self.last_seconds = time.perf_counter() - began
        self.runs += 1
        state = self.state
        with state.lock:
            for job in snapshot.jobs:
                record = state.jobs.get(job.job_id)
                if record is not None and not record.terminal:
                    record.estimated_start = starts.get(job.job_id, 0.0)
        return starts
