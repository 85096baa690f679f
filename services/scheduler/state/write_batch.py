"""Writes held back for one transaction: what a scheduler round changes, committed once.

Every change of a job is saved with its event, and a round changes many jobs: it marks
the moving ones, records the checkpoints of those it stopped, creates the tasks of those
it starts and records their starts. Committed one by one under the scheduler's lock,
those writes were most of a round's time once jobs could start (bench/load.py: rounds of
16 s and RPC p99 of 4 s while a thousand jobs started, the lock held for one commit after
another). Inside `batch()` the writes of the calling thread wait and are committed in one
transaction when it ends: the same rows, in the same state, written together; a crash
loses the batch whole (as it lost a write not yet committed) and never half of a job's
change.

Only `save_job` and `save_tasks` wait; reads and other writes go through as before. A
record saved twice in a batch is written once, as it is when the batch ends (the later
call saw the later state; the rows are made from the records themselves).

`locked_batch(lock)` takes the lock for the batch and commits after letting it go: a
commit's round trips to the database took 100-400 ms under the load (waiting for a
busy host's CPU; the disk's own flushes stayed under 1.3 ms), and under the lock every
heartbeat and submission waited with it (bench/load.py at 250
workers: every p99 45-71 ms with commits that did not wait for the flush, 117-403 ms
with ones that did). The rows are made under the lock, and every write of the store
takes its turn in one order (CommitOrder) fixed under the lock: a batch that commits
later cannot overwrite a newer write of the same record, and its caller goes on only
once its rows are committed (a start's tasks are durable before any StartTask).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from gearshift.scheduler.state.records import EventRecord, JobRecord, TaskRecord

log = logging.getLogger("gearshift.scheduler.write_batch")


@dataclass
class PendingWrites:
    """The jobs (latest record per job), events (in order) and tasks of one batch."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)
    tasks: dict[str, TaskRecord] = field(default_factory=dict)


class CommitOrder:
    """Tickets taken under the scheduler's lock; their commits run in ticket order, so the
    database sees the records' states in the order the lock saw them, whichever thread
    commits first."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._taken = 0
        self._done = 0

    def take(self) -> int:
        with self._turn:
            self._taken += 1
            return self._taken

    def settle(self) -> None:
        """Wait for the commits of every ticket taken so far."""
        with self._turn:
            target = self._taken
            while self._done < target:
                self._turn.wait()

    def run(self, ticket: int, commit: Callable[[], None]) -> None:
        """`commit` once every earlier ticket's has run (failed or not)."""
        with self._turn:
            while self._done != ticket - 1:
                self._turn.wait()
        try:
            commit()
        finally:
            with self._turn:
                self._done = ticket
                self._turn.notify_all()


class BatchedWrites:
    """`save_job` and `save_tasks` of a Store: written at once, or together at the end of
    the calling thread's `batch()` or `locked_batch()`. A subclass turns records into rows
    with `_rows` (where they are read: under the lock) and writes them with `_commit` (one
    transaction). Every write takes a ticket of one CommitOrder: a batch committed after
    the lock is let go can never land after a later write of the same record."""

    def __init__(self) -> None:
        self._batches = threading.local()
        self._order = CommitOrder()

    def _rows(
        self, jobs: Sequence[JobRecord], events: Sequence[EventRecord], tasks: Sequence[TaskRecord]
    ) -> Any:
        raise NotImplementedError

    def _commit(self, rows: Any) -> None:
        raise NotImplementedError

    def _write(
        self, jobs: Sequence[JobRecord], events: Sequence[EventRecord], tasks: Sequence[TaskRecord]
    ) -> None:
        """Now, in this thread (after the writes whose tickets came first)."""
        rows = self._rows_of(jobs, events, tasks)
        if rows is not None:
            self._order.run(self._order.take(), lambda: self._commit(rows))

    def settle(self) -> None:
        """Return once the writes of the holds already let go are committed: what a reader
        of the database that looked at the scheduler's memory first must wait for."""
        self._order.settle()

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

    def batch(self) -> AbstractContextManager[None]:
        """This thread's job and task writes until the end, in one transaction then (a batch
        inside a batch joins it). What was saved before an error is still written."""
        return self.locked_batch(nullcontext())

    @contextmanager
    def locked_batch(self, lock: AbstractContextManager[Any]) -> Iterator[None]:
        """`with lock, batch()`, but the transaction commits after the lock is let go (in
        the order of the holds, CommitOrder): a slow commit (hundreds of ms on a busy
        host) then holds up its own caller, not every heartbeat and submission
        waiting for the lock (bench/load.py). The rows are made under the lock, from the
        records as the hold leaves them; the caller goes on once they are committed. A hold
        that wrote nothing takes no turn and waits for no one's commit: most heartbeats,
        which waited for each round's records before (bench/load.py)."""
        if self._pending() is not None:  # inside a batch: joins it, its end commits
            with lock:
                yield
            return
        pending = self._batches.pending = PendingWrites()
        ticket, rows, failed = 0, None, False
        try:
            with lock:
                try:
                    yield
                except BaseException:
                    failed = True
                    raise
                finally:
                    self._batches.pending = None
                    rows = self._rows_of(
                        list(pending.jobs.values()), pending.events, list(pending.tasks.values())
                    )
                    if rows is not None:
                        ticket = self._order.take()
        finally:
            if ticket:
                try:
                    self._order.run(ticket, lambda: self._commit(rows))
                except Exception:
                    if not failed:
                        raise
                    log.exception("a batch's writes were lost after an error")

    def _rows_of(
        self, jobs: Sequence[JobRecord], events: Sequence[EventRecord], tasks: Sequence[TaskRecord]
    ) -> Any:
        """The rows to commit, or None when nothing was written: then no commit and no turn
        in the order, so the writer waits for no one's commit (most heartbeats' holds)."""
        return self._rows(jobs, events, tasks) if jobs or events or tasks else None
