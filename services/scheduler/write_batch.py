"""Writes held back for one transaction: what a scheduler round changes, committed once.

Every change of a job is saved with its event, and a round changes many jobs: it marks
the moving ones, records the checkpoints of those it stopped, creates the tasks of those
it starts and records their starts. Committed one by one under the scheduler's lock,
those writes were most of a round's time once jobs could start (bench/load.py: rounds of
16 s and RPC p99 of 4 s while a thousand jobs started, the lock held for one commit after
another). Inside `batch()` the writes of the calling thread wait and are committed in one
transaction when it ends, before the lock is let go: the same rows, in the same state,
written together; a crash loses the batch whole (as it lost a write not yet committed)
and never half of a job's change.

Only `save_job` and `save_tasks` wait; reads and other writes go through as before. A
record saved twice in a batch is written once, as it is when the batch ends (the later
call saw the later state; the rows are written from the records themselves).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # store.py builds its stores on BatchedWrites
    from gearshift.scheduler.store import EventRecord, JobRecord, TaskRecord

log = logging.getLogger("gearshift.scheduler.write_batch")


@dataclass
class PendingWrites:
    """The jobs (latest record per job), events (in order) and tasks of one batch."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)
    tasks: dict[str, TaskRecord] = field(default_factory=dict)


class BatchedWrites:
    """`save_job` and `save_tasks` of a Store: written at once, or together at the end of
    the calling thread's `batch()`. A subclass writes them with `_write` (one transaction)."""

    def __init__(self) -> None:
        self._batches = threading.local()

    def _write(
        self, jobs: Sequence[JobRecord], events: Sequence[EventRecord], tasks: Sequence[TaskRecord]
    ) -> None:
        raise NotImplementedError

    def _pending(self) -> PendingWrites | None:
        pending: PendingWrites | None = getattr(self._batches, "pending", None)
        return pending

    def save_job(self, job: JobRecord, events: Sequence[EventRecord] = ()) -> None:
        """Update a job and append events, together."""
        pending = self._pending()
        if pending is None:
            self._write([job], events, [])
            return
        pending.jobs[job.job_id] = job
        pending.events.extend(events)

    def save_tasks(self, tasks: Iterable[TaskRecord]) -> None:
        pending = self._pending()
        if pending is None:
            self._write([], [], list(tasks))
            return
        pending.tasks.update((t.task_id, t) for t in tasks)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """This thread's job and task writes until the end, in one transaction then (a batch
        inside a batch joins it). What was saved before an error is still written."""
        if self._pending() is not None:
            yield
            return
        pending = self._batches.pending = PendingWrites()
        try:
            yield
        except BaseException:
            self._batches.pending = None
            try:
                self._flush(pending)
            except Exception:
                log.exception("a batch's writes were lost after an error")
            raise
        self._batches.pending = None
        self._flush(pending)

    def _flush(self, pending: PendingWrites) -> None:
        if pending.jobs or pending.events or pending.tasks:
            self._write(list(pending.jobs.values()), pending.events, list(pending.tasks.values()))
