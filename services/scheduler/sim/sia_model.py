"""How Sia's artifact (SOSP'23, `sia-simulator/`) counts a job's work and times its steps, at a
fixed global batch size: plain functions over the tables that `sia_trace` reads.

- Work. Progress is counted in the unit of the model's validation tables (steps at its smallest
  validated batch). Epoch e ends at progress P(e) = the least `progress` of row e-1 over its
  validation tables; the job ends at P(epochs). A step at batch B adds the statistical gain
  (var + sqr) / (var / (B / B0) + sqr), the gradient statistics of epoch e interpolated
  linearly between the validated batch sizes around B (Pollux's goodput model).
- Step time on n GPUs of a type. The n replicas sit on as few nodes as the type's node size
  allows; each takes ceil(B / n) samples, split into accumulation steps when that exceeds the
  largest local batch profiled for the placement (at least one on one GPU above B0), clipped to
  the largest local batch profiled at n replicas and to the largest validated batch. The time
  of one micro-step comes from `placements-<type>.csv` (linear in the local batch) or, for a
  placement never profiled, from a linear interpolation over (nodes, replicas, local batch) of
  those rows averaged and `scalability-<type>.csv`; accumulation adds (step - sync) per extra
  micro-step. The artifact divides goodput by a per-model calibration factor (SLOWDOWNS).

`completion_seconds` is what a job alone on n GPUs of a type takes in the artifact's simulator
(without its restart delay and its rounds' rounding to whole seconds per epoch).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.interpolate import LinearNDInterpolator

# The artifact interpolates over at most this many nodes.
MAX_NODES = 16


@dataclass(frozen=True)
class EpochStats:
    """One row of a validation table: progress at the end of the epoch, gradient statistics
    during it."""

    progress: float
    grad_sqr: float
    grad_var: float


@dataclass(frozen=True)
class StepRow:
    """A profiled step: (nodes, replicas, local batch) -> seconds per step and of it syncing."""

    num_nodes: int
    num_replicas: int
    local_bsz: float
    step_time: float
    sync_time: float


@dataclass
class StepTable:
    """One model's step times on one GPU type: profiled placements (placement id -> rows sorted
    by local batch) and the scalability rows."""

    placements: Mapping[int, Sequence[StepRow]]
    scalability: Sequence[StepRow]
    _grid: Any = field(default=None, repr=False)

    @property
    def min_local_bsz(self) -> float:
        return min(r.local_bsz for rows in self.placements.values() for r in rows)

    def max_local_at_replicas(self, replicas: int) -> float | None:
        """The largest local batch profiled at `replicas` replicas, any placement."""
        sizes = [
            r.local_bsz
            for rows in self.placements.values()
            for r in rows
            if r.num_replicas == replicas
        ]
        return max(sizes) if sizes else None

    def grid(self) -> Any:
        """The artifact's fallback: placements averaged per (nodes, replicas, local batch),
        then the scalability rows, interpolated linearly (scipy's LinearNDInterpolator)."""
        if self._grid is None:
            groups: dict[tuple[int, int, float], list[StepRow]] = {}
            for rows in self.placements.values():
                for r in rows:
                    groups.setdefault((r.num_nodes, r.num_replicas, r.local_bsz), []).append(r)
            points = [
                (*key, sum(r.step_time for r in g) / len(g), sum(r.sync_time for r in g) / len(g))
                for key, g in sorted(groups.items())
            ]
            points += [
                (r.num_nodes, r.num_replicas, r.local_bsz, r.step_time, r.sync_time)
                for r in self.scalability
            ]
            data = np.asarray(points, dtype=float)
            self._grid = LinearNDInterpolator(data[:, :3], data[:, 3:])
        return self._grid


def consolidated(devices: int, per_node: int) -> tuple[int, ...]:
    """n GPUs on as few nodes as possible: (per_node, ..., the rest)."""
    full, rest = divmod(devices, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


def placement_id(placement: Sequence[int]) -> int:
    """The artifact's key of a placement: its lexicographically smallest rotation's digits."""
    kept = tuple(p for p in placement if p)
    smallest = min(kept[i:] + kept[:i] for i in range(len(kept)))
    return int("".join(map(str, smallest)))


def micro_step(table: StepTable, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
    """(step seconds, sync seconds) of one micro-step at `local_bsz` per replica; NaN where the
    artifact's tables do not reach."""
    rows = table.placements.get(placement_id(placement))
    if rows:
        sizes = [r.local_bsz for r in rows]
        if not sizes[0] <= local_bsz <= sizes[-1]:
            return math.nan, math.nan
        i = min(max(bisect.bisect_left(sizes, local_bsz), 1), len(rows) - 1)
        lo, hi = rows[i - 1], rows[i]
        w = (local_bsz - lo.local_bsz) / (hi.local_bsz - lo.local_bsz) if len(rows) > 1 else 0.0
        return (
            lo.step_time + w * (hi.step_time - lo.step_time),
            lo.sync_time + w * (hi.sync_time - lo.sync_time),
        )
    nodes = min(len([p for p in placement if p]), MAX_NODES)
    step, sync = table.grid()([[nodes, sum(placement), local_bsz]])[0]
    return float(step), float(sync)


def max_local_bsz(table: StepTable, placement: Sequence[int]) -> float:
    """The largest local batch before accumulation: profiled for the placement, else the
    largest scalability row at least as large."""
    rows = table.placements.get(placement_id(placement))
    if rows:
        return rows[-1].local_bsz
    nodes, replicas = len([p for p in placement if p]), sum(placement)
    sizes = [
        r.local_bsz
        for r in table.scalability
        if r.num_nodes >= nodes and r.num_replicas >= replicas
    ]
    return max(sizes) if sizes else math.nan


def local_batch(
    table: StepTable,
    placement: Sequence[int],
    batch_size: int,
    init_batch_size: int,
    max_batch_size: int,
) -> tuple[int, int]:
    """(samples per micro-step per replica, extra accumulation steps) at a fixed batch size."""
    replicas = sum(placement)
    local = math.ceil(batch_size / replicas - 1e-8)
    accum = math.ceil(local / max_local_bsz(table, placement) - 1e-8) - 1
    if replicas == 1 and batch_size > init_batch_size:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    memory = table.max_local_at_replicas(replicas)
    if memory is not None:
        atomic = int(min(atomic, memory))
    atomic = min(atomic, int(max_batch_size / (replicas * (accum + 1))))
    return atomic, accum


def progress_marks(validation: Mapping[int, Sequence[EpochStats]], epochs: int) -> list[float]:
    """P(0..epochs): progress at the end of each epoch, the least over the tables."""
    return [0.0] + [
        min(v[e - 1].progress for v in validation.values()) for e in range(1, epochs + 1)
    ]


def gain(validation: Mapping[int, Sequence[EpochStats]], batch_size: float, epoch: int) -> float:
    """Progress a step at `batch_size` adds during `epoch`."""
    sizes = sorted(validation)
    lower = max(b for b in sizes if b <= batch_size)
    upper = min(b for b in sizes if b >= batch_size)
    lo, hi = validation[lower][epoch], validation[upper][epoch]
    w = (batch_size - lower) / (upper - lower) if upper != lower else 0.0
    sqr = lo.grad_sqr + w * (hi.grad_sqr - lo.grad_sqr)
    var = lo.grad_var + w * (hi.grad_var - lo.grad_var)
    scale = batch_size / sizes[0]
    return (var + sqr) / (var / scale + sqr)


def work_steps(
    validation: Mapping[int, Sequence[EpochStats]], epochs: int, batch_size: float
) -> float:
    """Steps at `batch_size` from no progress to the model's target."""
    marks = progress_marks(validation, epochs)
    return sum((marks[e + 1] - marks[e]) / gain(validation, batch_size, e) for e in range(epochs))


def completion_seconds(
    table: StepTable,
    validation: Mapping[int, Sequence[EpochStats]],
    epochs: int,
    *,
    devices: int,
    per_node: int,
    batch_size: int,
    slowdown: float,
) -> float:
    """Seconds a job takes from start to target alone on `devices` GPUs of one type (inf where
    the tables do not reach): the batch it really runs (rounded per replica, clipped to
    memory) sets both its step time and its gain."""
    sizes = sorted(validation)
    placement = consolidated(devices, per_node)
    atomic, accum = local_batch(table, placement, batch_size, sizes[0], sizes[-1])
    if atomic < 1:
        return math.inf
    step, sync = micro_step(table, placement, atomic)
    per_step = step + (step - sync) * accum
    if not per_step > 0:
        return math.inf
    real_batch = devices * atomic * (accum + 1)
    if real_batch < sizes[0]:
        return math.inf
    return work_steps(validation, epochs, real_batch) * per_step * slowdown
