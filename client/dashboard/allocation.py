"""The cluster's allocation over time, as plain data: which job held which device when
(a Gantt across workers), and each tenant's devices over time.

Built from the jobs' placement events (gearshift.client.timeline.segments): a job
holds the devices of a placement from its STARTED or RESCALED event until it leaves
RUNNING or the next placement starts. Everything is clipped to a window [since, now].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from gearshift.client.timeline import Segment


@dataclass(frozen=True)
class JobRun:
    """A job and its placements over time (oldest first)."""

    job_id: str
    name: str
    tenant: str
    segments: Sequence[Segment]


@dataclass(frozen=True)
class Bar:
    """One device held by one job for a while; `open` while it still holds it."""

    worker_id: str
    device_index: int
    accelerator_type: str
    job_id: str
    name: str
    tenant: str
    rank: int
    ests: int
    start: float
    end: float
    open: bool


@dataclass(frozen=True)
class Lane:
    """A device of the cluster: one row of the Gantt."""

    worker_id: str
    device_index: int
    accelerator_type: str


def bars(runs: Iterable[JobRun], since: float, now: float) -> list[Bar]:
    """Every device each job held within [since, now], clipped to it, by start time."""
    if now < since:
        raise ValueError(f"the window ends ({now}) before it starts ({since})")
    out: list[Bar] = []
    for run in runs:
        for segment in run.segments:
            end = now if segment.end is None else min(segment.end, now)
            start = max(segment.start, since)
            if end < since or start > now or (end <= start and segment.end is not None):
                continue
            for slot in segment.slots:
                out.append(
                    Bar(
                        slot.worker_id,
                        slot.device_index,
                        slot.accelerator_type,
                        run.job_id,
                        run.name,
                        run.tenant,
                        slot.rank,
                        slot.ests,
                        start,
                        end,
                        segment.end is None,
                    )
                )
    out.sort(key=lambda b: (b.start, b.worker_id, b.device_index))
    return out


def lanes(devices: Iterable[Lane], held: Iterable[Bar]) -> list[Lane]:
    """The cluster's devices, and any device a bar names that is no longer registered
    (its worker left), sorted by worker then device."""
    found = {(d.worker_id, d.device_index): d for d in devices}
    for bar in held:
        found.setdefault(
            (bar.worker_id, bar.device_index),
            Lane(bar.worker_id, bar.device_index, bar.accelerator_type),
        )
    return [found[key] for key in sorted(found)]


def use_over_time(
    held: Sequence[Bar], since: float, now: float, key: str = "tenant"
) -> dict[str, list[tuple[float, int]]]:
    """Devices held per tenant (or per `key` "job_id") as step series over [since, now]:
    (time, devices) points, each value holding until the next point; a series starts at
    `since` and ends with a point at `now`. Changes at one instant count once."""
    if key not in ("tenant", "job_id"):
        raise ValueError(f"key must be 'tenant' or 'job_id' (got {key!r})")
    changes: dict[str, dict[float, int]] = {}
    for bar in held:
        by_time = changes.setdefault(getattr(bar, key), {})
        by_time[bar.start] = by_time.get(bar.start, 0) + 1
        if not bar.open:
            by_time[bar.end] = by_time.get(bar.end, 0) - 1
    out: dict[str, list[tuple[float, int]]] = {}
    for name in sorted(changes):
        series: list[tuple[float, int]] = [] if since in changes[name] else [(since, 0)]
        count = 0
        for when in sorted(changes[name]):
            count += changes[name][when]
            series.append((when, count))
        if series[-1][0] < now:
            series.append((now, count))
        out[name] = series
    return out


def mean_use(series: Sequence[tuple[float, int]]) -> float:
    """The time-weighted mean of a step series (its value over its span, not per point)."""
    span = series[-1][0] - series[0][0] if series else 0.0
    if span <= 0:
        return float(series[-1][1]) if series else 0.0
    total = sum((b[0] - a[0]) * a[1] for a, b in pairwise(series))
    return total / span
