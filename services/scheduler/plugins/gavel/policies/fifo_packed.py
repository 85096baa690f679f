"""FIFO with space sharing (Gavel's `fifo_packed`): the heterogeneity-aware queue, then pairs.

Every call walks the jobs in arrival order and gives each the fastest type with room at
its scale factor, stopping at the first job that fits nowhere (no job jumps ahead). The
jobs still waiting then try, in order, to share a device with a job already placed: the
partner is the placed single job of the same scale factor whose pair has the highest
normalized throughput on the partner's type (each job's steps/s in the pair over its
steps/s alone, summed), if that sum exceeds `threshold` (1.5, Gavel's). The first waiting
job without such a partner ends the packing, again so that no job jumps ahead. Nothing is
kept between calls (Gavel's packing mode resets its queue's allocation every time).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    Policy,
    PolicyInput,
    ProblemClass,
)


class PackedFifo(Policy):
    """Gavel's FIFO queue with packing; see the module docstring."""

    name: str = "fifo_packed"
    problem_class: ClassVar[ProblemClass] = "greedy"
    skip_zero_priority: ClassVar[bool] = True
    no_elastic_form_because: ClassVar[str] = (
        "it is Gavel's queue, not an objective, and it shares devices; the elastic FIFO is "
        "fifo_lp, the paper's FIFO objective over device configurations"
    )

    def __init__(self, *, threshold: float = 1.5) -> None:
        self.threshold = threshold
        self.space_sharing = True

    def solve(self, inp: PolicyInput) -> Allocation:
        free = inp.num_workers.astype(np.float64).copy()
        open_types = [j for j in range(inp.num_types) if free[j] > 0]
        placed: dict[int, int] = {}  # job -> type, in the order they were placed
        queue = list(range(inp.num_jobs))
        while queue and open_types:
            head = queue[0]
            size = float(inp.scale_factors[head])
            options = [j for j in open_types if free[j] >= size]
            if not options:
                break
            kind = max(options, key=lambda j: inp.throughputs[head, j])  # first on ties
            queue.pop(0)
            if inp.throughputs[head, kind] <= 0:
                continue
            placed[head] = kind
            free[kind] -= size
            if free[kind] == 0:
                open_types.remove(kind)
        pairs = self._pack(inp, queue, placed)
        rows: list[tuple[str, ...]] = []
        fractions: list[np.ndarray] = []
        for job, kind in placed.items():
            row = np.zeros(inp.num_types)
            row[kind] = 1.0
            rows.append((inp.job_ids[job],))
            fractions.append(row)
        for (a, b), kind in pairs.items():
            row = np.zeros(inp.num_types)
            row[kind] = 1.0
            rows.append((inp.job_ids[a], inp.job_ids[b]))
            fractions.append(row)
        for job in range(inp.num_jobs):  # every job has a row, the waiting ones at 0
            if job not in placed and not any(job in pair for pair in pairs):
                rows.append((inp.job_ids[job],))
                fractions.append(np.zeros(inp.num_types))
        matrix = np.array(fractions) if fractions else np.zeros((0, inp.num_types))
        return Allocation(inp.worker_types, tuple(rows), matrix)

    def _pack(
        self, inp: PolicyInput, queue: list[int], placed: dict[int, int]
    ) -> dict[tuple[int, int], int]:
        """Pairs (placed job, waiting job) -> type; removes the paired jobs from `placed`."""
        pairs: dict[tuple[int, int], int] = {}
        for waiting in queue:
            best, partner = self.threshold, -1
            for job, kind in placed.items():
                if inp.scale_factors[job] != inp.scale_factors[waiting]:
                    continue
                gain = packed_gain(inp, job, waiting, kind)
                if gain > best:
                    best, partner = gain, job
            if partner < 0:
                break
            kind = placed.pop(partner)
            pairs[(min(partner, waiting), max(partner, waiting))] = kind
        return pairs


def packed_gain(inp: PolicyInput, a: int, b: int, kind: int) -> float:
    """Sum over the pair of each job's steps/s in the pair over alone, on type `kind` (a job
    that makes no progress in the pair adds nothing)."""
    key = (min(a, b), max(a, b))
    pair = inp.colocated.get(key)
    if pair is None:
        return 0.0
    total = 0.0
    for pos, job in enumerate(key):
        together = float(pair[kind, pos])
        alone = float(inp.throughputs[job, kind])
        if together > 0 and alone > 0:
            total += together / alone
    return total
