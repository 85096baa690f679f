"""A job's history as plain data, from its events: where it ran over time, its progress.

The dashboard's job page and `gearshift job ID --plot` both draw from these.
A placement starts with a STARTED or RESCALED event (they carry it) and lasts
until the job leaves RUNNING (it checkpoints to move, is preempted or ends) or
the next placement starts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gearshift.v1 import common_pb2, scheduler_pb2

S = scheduler_pb2
PLACED = (S.JOB_EVENT_TYPE_STARTED, S.JOB_EVENT_TYPE_RESCALED)


@dataclass(frozen=True)
class Slot:
    """One device of a placement: which process of the job it ran, and how many ESTs."""

    rank: int
    worker_id: str
    device_index: int
    accelerator_type: str
    ests: int


@dataclass(frozen=True)
class Segment:
    """A placement and the time it held; `end` is None while it still holds."""

    start: float
    end: float | None
    slots: tuple[Slot, ...]

    @property
    def devices_by_type(self) -> dict[str, int]:
        return dict(sorted(Counter(s.accelerator_type for s in self.slots).items()))

    @property
    def ests_per_device(self) -> list[int]:
        return [s.ests for s in self.slots]


@dataclass(frozen=True)
class ProgressPoint:
    time: float
    step: int
    loss: float
    samples_per_second: float


def slots(placement: common_pb2.Placement) -> tuple[Slot, ...]:
    return tuple(
        Slot(p.rank, p.worker_id, p.device_index, p.accelerator_type, len(p.est_ids))
        for p in placement.processes
    )


def segments(events: Iterable[scheduler_pb2.JobEvent]) -> list[Segment]:
    """The job's placements in time order (events in sequence order)."""
    out: list[Segment] = []
    current: Segment | None = None
    for event in events:
        if current is not None and (
            event.type in PLACED or event.state != common_pb2.JOB_STATE_RUNNING
        ):
            out.append(Segment(current.start, event.time, current.slots))
            current = None
        if event.type in PLACED and event.placement.processes:
            current = Segment(event.time, None, slots(event.placement))
    if current is not None:
        out.append(current)
    return out


def rescale_times(events: Iterable[scheduler_pb2.JobEvent]) -> list[float]:
    """When the job resumed on a new placement (RESCALED events)."""
    return [e.time for e in events if e.type == S.JOB_EVENT_TYPE_RESCALED]


def plan_changes(events: Iterable[scheduler_pb2.JobEvent]) -> list[scheduler_pb2.JobEvent]:
    """Events whose message says a plan changed (whichever part of the system wrote it)."""
    return [e for e in events if "plan" in e.message.lower()]


def progress(
    events: Iterable[scheduler_pb2.JobEvent], seen: Iterable[ProgressPoint] = ()
) -> list[ProgressPoint]:
    """Step, loss and samples/s over time, one point per step: from the events, and from
    progress `seen` otherwise (e.g. the job's latest); oldest first."""
    points: dict[int, ProgressPoint] = {}
    for event in events:
        p = event.progress
        if p.step > 0 and p.step not in points:
            points[p.step] = ProgressPoint(event.time, p.step, p.loss, p.samples_per_second)
    for point in seen:
        if point.step > 0:
            points.setdefault(point.step, point)
    return sorted(points.values(), key=lambda point: (point.step, point.time))


def devices_over_time(placed: Sequence[Segment], now: float) -> list[tuple[float, dict[str, int]]]:
    """Devices in use by type as a step series: each point holds until the next one (the
    simulator's `usage` has the same form); an open placement is drawn until `now`."""
    series: list[tuple[float, dict[str, int]]] = []
    for segment in placed:
        points = [(segment.start, segment.devices_by_type)]
        if segment.end is None:
            points.append((max(now, segment.start), segment.devices_by_type))
        else:
            points.append((segment.end, {}))
        for when, counts in points:
            if series and series[-1][0] == when:
                series[-1] = (when, counts)  # a placement starting as the last one ends
            else:
                series.append((when, counts))
    return series
