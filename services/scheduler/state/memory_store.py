"""The scheduler's Store in memory: the same interface as SqlStore, for a scheduler that need
not survive its process (the daemon's wiring driven on simulated time, and tests of the
domain code without a database).

Records are copied in and out, as a database would, so the caller's objects are
never shared with the store.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence

from gearshift.common.errors import ConflictError
from gearshift.common.facts import TERMINAL_STATES
from gearshift.scheduler.state.records import EventRecord, JobRecord, TaskRecord, WorkerRecord
from gearshift.scheduler.state.write_batch import BatchedWrites

_Rows = tuple[list[JobRecord], list[EventRecord], list[TaskRecord]]


class MemoryStore(BatchedWrites):
    """Store in dictionaries; every call is atomic under one lock."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._jobs: dict[str, JobRecord] = {}
        self._events: dict[str, list[EventRecord]] = {}
        self._workers: dict[str, WorkerRecord] = {}
        self._tasks: dict[str, TaskRecord] = {}
        self._state: dict[str, str] = {}
        self._code: dict[str, bytes] = {}

    def close(self) -> None:
        return None

    def create_job(self, job: JobRecord, event: EventRecord) -> JobRecord:
        with self._lock:
            taken = job.idempotency_key and any(
                j.idempotency_key == job.idempotency_key for j in self._jobs.values()
            )
            if job.job_id in self._jobs or taken:
                raise ConflictError(f"job {job.job_id!r} or its idempotency key exists")
            self._jobs[job.job_id] = copy.deepcopy(job)
            self._events[job.job_id] = [copy.deepcopy(event)]
        return job

    def find_job_by_key(self, key: str) -> JobRecord | None:
        with self._lock:
            for job in self._jobs.values():
                if job.idempotency_key == key:
                    return copy.deepcopy(job)
            return None

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return copy.deepcopy(job) if job is not None else None

    def _rows(
        self, jobs: Sequence[JobRecord], events: Sequence[EventRecord], tasks: Sequence[TaskRecord]
    ) -> _Rows:
        return copy.deepcopy((list(jobs), list(events), list(tasks)))  # as they are now

    def _commit(self, rows: _Rows) -> None:
        jobs, events, tasks = rows
        with self._lock:
            for job in jobs:
                if job.job_id in self._jobs:
                    self._jobs[job.job_id] = job
            for event in events:
                self._events.setdefault(event.job_id, []).append(event)
            for task in tasks:
                self._tasks[task.task_id] = task

    def list_jobs(
        self,
        *,
        tenant: str,
        states: Sequence[int],
        name_prefix: str,
        limit: int,
        after: tuple[float, str] | None,
    ) -> list[JobRecord]:
        with self._lock:
            jobs = [
                j
                for j in self._jobs.values()
                if (not tenant or j.spec.tenant == tenant)
                and (not states or j.state in states)
                and j.spec.name.startswith(name_prefix)
                and (after is None or (j.submitted_at, j.job_id) < after)
            ]
            jobs.sort(key=lambda j: (j.submitted_at, j.job_id), reverse=True)
            return [copy.deepcopy(j) for j in jobs[:limit]]

    def job_counts(self) -> dict[int, int]:
        with self._lock:
            out: dict[int, int] = {}
            for job in self._jobs.values():
                out[job.state] = out.get(job.state, 0) + 1
            return out

    def active_jobs(self) -> list[JobRecord]:
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.state not in TERMINAL_STATES]
            jobs.sort(key=lambda j: (j.submitted_at, j.job_id))
            return [copy.deepcopy(j) for j in jobs]

    def events_after(self, job_id: str, sequence: int, limit: int = 1000) -> list[EventRecord]:
        with self._lock:
            events = [e for e in self._events.get(job_id, []) if e.sequence > sequence]
            return [copy.deepcopy(e) for e in sorted(events, key=lambda e: e.sequence)[:limit]]

    def save_worker(self, worker: WorkerRecord) -> None:
        self.save_workers([worker])

    def save_workers(self, workers: Sequence[WorkerRecord]) -> None:
        with self._lock:
            for worker in workers:
                self._workers[worker.worker_id] = copy.deepcopy(worker)

    def workers(self) -> list[WorkerRecord]:
        with self._lock:
            return [copy.deepcopy(self._workers[w]) for w in sorted(self._workers)]

    def open_tasks(self) -> list[TaskRecord]:
        with self._lock:
            tasks = [t for t in self._tasks.values() if not t.ended]
            tasks.sort(key=lambda t: (t.created_at, t.task_id))
            return [copy.deepcopy(t) for t in tasks]

    def job_tasks(self, job_id: str) -> list[TaskRecord]:
        with self._lock:
            tasks = [t for t in self._tasks.values() if t.job_id == job_id]
            tasks.sort(key=lambda t: (t.created_at, t.task_id))
            return [copy.deepcopy(t) for t in tasks]

    def has_code(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._code

    def put_code(self, sha256: str, data: bytes) -> bool:
        with self._lock:
            if sha256 in self._code:
                return False
            self._code[sha256] = bytes(data)
            return True

    def get_code(self, sha256: str) -> bytes | None:
        with self._lock:
            return self._code.get(sha256)

    def get_state(self, key: str) -> str | None:
        with self._lock:
            return self._state.get(key)

    def set_state(self, key: str, value: str) -> None:
        with self._lock:
            self._state[key] = value
