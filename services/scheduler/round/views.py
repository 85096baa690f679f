"""What a round derives from the workers and the running jobs, worked out once per change.

At 1,000 workers and 5,000 jobs a round rebuilt every live Device and every running job's
assignment each time, under the scheduler's lock: about 50-100 ms of the lock a round
(bench/load.py), every heartbeat and submission waiting behind it. A worker's record is
replaced when it registers and a job's placement is replaced, never changed in place
(records.JobRecord.placement), so what is derived from one is kept beside the object it came
from and reused while that is still the object there.
"""

from __future__ import annotations

from collections.abc import Iterable

from gearshift.scheduler.round.placement import placement_devices
from gearshift.scheduler.state.records import JobRecord, WorkerRecord
from gearshift.scheduler.types import Assignment, Device
from gearshift.v1 import common_pb2


def live_devices(workers: Iterable[WorkerRecord]) -> tuple[Device, ...]:
    """Every device of every live worker, by worker id; indexes count across a worker's
    groups."""
    out: list[Device] = []
    for worker in sorted(workers, key=lambda w: w.worker_id):
        if not worker.alive:
            continue
        index = 0
        for group in worker.devices:
            for _ in range(group.count):
                out.append(Device(worker.worker_id, index, group.accelerator_type))
                index += 1
    return tuple(out)


def assignment_of(placement: common_pb2.Placement) -> Assignment:
    """Where a placement's processes are, in rank order, with their EST counts."""
    processes = sorted(placement.processes, key=lambda p: p.rank)
    return [
        (d, len(p.est_ids)) for d, p in zip(placement_devices(placement), processes, strict=True)
    ]


class LiveDevices:
    """`live_devices`, kept while the same worker records are there and equally alive
    (read under the lock: it walks the workers)."""

    def __init__(self) -> None:
        self._key: list[tuple[WorkerRecord, bool]] = []
        self._devices: tuple[Device, ...] = ()

    def of(self, workers: Iterable[WorkerRecord]) -> tuple[Device, ...]:
        # The records themselves, not their ids: the key keeps them alive, so an id of a
        # record since replaced can never come back as another's.
        key = [(w, w.alive) for w in workers]
        if key != self._key:
            self._key, self._devices = key, live_devices(w for w, _ in key)
        return self._devices


class HeldAssignments:
    """Each running job's assignment, kept against the placement it was read from."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[common_pb2.Placement, Assignment]] = {}

    def of(self, job: JobRecord) -> Assignment:
        placement = job.placement  # one read: the object stays whole (replaced, not changed)
        cached = self._held.get(job.job_id)
        if cached is not None and cached[0] is placement:
            return cached[1]
        held = assignment_of(placement)
        self._held[job.job_id] = (placement, held)
        return held

    def forget(self, job_id: str) -> None:
        self._held.pop(job_id, None)
