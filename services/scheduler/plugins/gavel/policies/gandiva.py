"""Gandiva (Xiao et al., OSDI'18) as Gavel runs it (Gavel's `gandiva` baseline): random pairs
that share devices, kept while they pay, and the cluster split equally among what runs.

Every computation of the allocation:

1. A pair is dropped when either member has left, or when its normalized throughput (each
   member's steps/s in the pair over its steps/s alone, summed over members and types; 0 if
   either member makes no progress in the pair on some type) is below 1. A job held alone
   is regrouped every time.
2. If the jobs' devices (their scale factors) fit in the cluster, nothing is packed: every
   job gets an equal share of every type, and the pairs are kept for later.
3. Otherwise the jobs in no pair are grouped at random: as many draws as there are such
   jobs, each drawing two of them (`random.Random.sample`, so a seed gives Gavel's own
   draws), a draw of two different scale factors wasted; the jobs left run alone.
4. The pairs and the jobs alone share the cluster equally: each gets num_workers[type] / M
   of every type (M of them), over its scale factor, rows scaled down to sum to at most 1.

The member of a pair whose partner completed keeps a row at 0 until the next computation:
it runs only on devices nothing else claims, as in Gavel.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    FloatArray,
    Policy,
    PolicyInput,
    ProblemClass,
)

Pairs = dict[int, int]  # job index -> its partner's index, both ways


def normalized_throughput(inp: PolicyInput, a: int, b: int) -> float:
    """Sum over types and members of steps/s in the pair over steps/s alone; 0 when either
    member makes no progress in the pair on some type (Gavel's rule, types summed)."""
    pair = inp.colocated.get((min(a, b), max(a, b)))
    if pair is None:
        return 0.0
    total = 0.0
    for j in range(inp.num_types):
        for pos, job in enumerate(sorted((a, b))):
            together, alone = float(pair[j, pos]), float(inp.throughputs[job, j])
            if together <= 0.0 or alone <= 0.0:
                return 0.0
            total += together / alone
    return total


def regroup(
    kept: Pairs, scale_factors: Sequence[float], rng: random.Random
) -> tuple[Pairs, list[int]]:
    """Step 3: random pairs among the jobs not in `kept` (indices in arrival order); returns
    every pair and the jobs left alone."""
    pairs = dict(kept)
    waiting = [i for i in range(len(scale_factors)) if i not in kept]
    draws = len(waiting)
    for _ in range(draws):
        if len(waiting) <= 1:
            break
        a, b = rng.sample(waiting, 2)
        if scale_factors[a] != scale_factors[b]:
            continue
        waiting.remove(a)
        waiting.remove(b)
        pairs[a], pairs[b] = b, a
    return pairs, waiting


def equal_split(
    combos: Sequence[tuple[int, ...]], scale_factors: Sequence[float], num_workers: FloatArray
) -> FloatArray:
    """Step 4: num_workers / M of every type for each of the M combinations, over its scale
    factor, each row scaled down to sum to at most 1."""
    x = np.zeros((len(combos), len(num_workers)))
    for r, combo in enumerate(combos):
        x[r] = num_workers / len(combos) / scale_factors[combo[0]]
    return np.asarray(x / np.maximum(x.sum(axis=1), 1.0)[:, None], dtype=np.float64)


class Gandiva(Policy):
    """Random pairs kept while they pay, equal shares; see the module docstring."""

    name: str = "gandiva"
    problem_class: ClassVar[ProblemClass] = "greedy"
    no_elastic_form_because: ClassVar[str] = (
        "it pairs jobs at random on devices and splits the cluster equally; pairs are "
        "measured only at one equal scale factor"
    )

    def __init__(self, *, seed: int = 0) -> None:
        self.space_sharing = True
        self._rng = random.Random(seed)
        self._pairs: dict[str, str] = {}  # job -> partner, both ways, between computations

    def solve(self, inp: PolicyInput) -> Allocation:
        index = {job: i for i, job in enumerate(inp.job_ids)}
        kept: Pairs = {}
        for job, other in self._pairs.items():
            a, b = index.get(job), index.get(other)
            if a is not None and b is not None and normalized_throughput(inp, a, b) >= 1.0:
                kept[a] = b
        sf = [float(s) for s in inp.scale_factors]
        if sum(sf) <= float(inp.num_workers.sum()):
            pairs, alone = kept, list(range(inp.num_jobs))
            combos: list[tuple[int, ...]] = [(i,) for i in alone]
        else:
            pairs, alone = regroup(kept, sf, self._rng)
            combos = [(i,) for i in alone] + sorted(
                {(min(a, b), max(a, b)) for a, b in pairs.items()}
            )
        self._pairs = {inp.job_ids[a]: inp.job_ids[b] for a, b in pairs.items()}
        x = equal_split(combos, sf, inp.num_workers)
        rows = [tuple(inp.job_ids[i] for i in combo) for combo in combos]
        # Every other combination has a row at 0, as in Gavel's allocation: a job whose
        # partner completed, or a pair of such jobs, runs on devices nothing else claims.
        listed = set(combos)
        idle: list[tuple[int, ...]] = [(i,) for i in range(inp.num_jobs) if (i,) not in listed]
        idle += [pair for pair in sorted(inp.colocated) if pair not in listed]
        rows += [tuple(inp.job_ids[i] for i in combo) for combo in idle]
        fractions = np.vstack([x, np.zeros((len(idle), inp.num_types))])
        return Allocation(inp.worker_types, tuple(rows), fractions)
