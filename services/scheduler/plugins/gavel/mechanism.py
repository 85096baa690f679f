"""Gavel's round-based mechanism (section 5), as named steps over plain data.

A policy gives X, the time share each job (combination) should get on each
type. The mechanism turns X into work for the next round, in steps named like
the extension points of the Kubernetes scheduler framework:

1. allocate  - recompute X when jobs arrived, completed or workers changed
               (`RoundScheduler.allocation_due`). Like Gavel, recomputations
               can be spaced by `min_recompute_seconds` (its simulator uses
               1,920 s; events in between wait for the next due round).
2. score     - priorities = X / fraction of time received on that type since
               the last reset (`priorities`); a job that has run nothing on a
               type it was given scores X * 1e9, so new jobs go first.
3. sort      - per type, candidates by (priority, deficit, X) descending
               (`rank`); the type order is fastest first, shuffled each round
               for heterogeneity-agnostic policies (they cannot tell types apart).
4. filter/reserve - greedy selection (`select`): take the best candidate whose
               scale factor still fits on that type, then drop every other
               candidate holding one of its jobs (one combination and one type
               per job per round).
5. place     - devices for each selected combination (`place`): decreasing
               scale factor; a job keeps the devices it had when they are still
               free (its lease is renewed, no restart); otherwise the fewest
               workers that fit it (consolidation), best fit first.
6. account   - after the round, the time each combination ran is added to
               the ledger that step 2 reads (`Ledger.record`).

Everything here is a plain function over dataclasses, dicts and NumPy arrays;
the simulator drives it with simulated time and the service with the clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gearshift.scheduler.plugins.gavel.policies.base import (
    Allocation,
    FloatArray,
    Policy,
    PolicyInput,
)
from gearshift.scheduler.round.placement import consolidate
from gearshift.scheduler.types import Device, EntityPolicy

Combo = tuple[str, ...]
NEW_JOB_PRIORITY_SCALE = 1e9


@dataclass
class Ledger:
    """Time received per combination and type since the last reset, and deficits.

    Like Gavel, every entry starts at half a round (so a fraction is never 0/0
    and new jobs are not infinitely urgent), and a reset - done whenever X is
    recomputed - folds what each job should have received minus what it got
    into its deficit (used to break ties) and starts counting afresh.
    """

    round_seconds: float
    job_time: dict[Combo, dict[str, float]] = field(default_factory=dict)
    worker_time: dict[str, float] = field(default_factory=dict)
    deficits: dict[str, dict[Combo, float]] = field(default_factory=dict)
    last_reset: float = 0.0

    def add(
        self, combo: Combo, worker_types: Iterable[str], *, seconds: float | None = None
    ) -> None:
        """An entry for `combo`: half a round on each type, or `seconds` (Gavel starts a pair
        at 0 until the next reset gives it half a round too)."""
        entry = self.job_time.setdefault(combo, {})
        for kind in worker_types:
            entry[kind] = self.round_seconds / 2.0 if seconds is None else seconds
            self.worker_time.setdefault(kind, 0.0)
            self.deficits.setdefault(kind, {})[combo] = 0.0

    def ensure(self, combo: Combo, worker_types: Iterable[str]) -> None:
        """Entries for types the combination has none for yet (a type that joined later)."""
        entry = self.job_time.setdefault(combo, {})
        for kind in worker_types:
            if kind not in entry:
                entry[kind] = self.round_seconds / 2.0
                self.worker_time.setdefault(kind, 0.0)
                self.deficits.setdefault(kind, {})[combo] = 0.0

    def remove_job(self, job_id: str) -> None:
        for combo in [c for c in self.job_time if job_id in c]:
            del self.job_time[combo]
        for per_type in self.deficits.values():
            for combo in [c for c in per_type if job_id in c]:
                del per_type[combo]

    def record(self, combo: Combo, worker_type: str, seconds: float) -> None:
        if combo in self.job_time:
            entry = self.job_time[combo]
            entry[worker_type] = entry.get(worker_type, 0.0) + seconds
            self.worker_time[worker_type] = self.worker_time.get(worker_type, 0.0) + seconds

    def reset(self, now: float, allocation: Mapping[Combo, Mapping[str, float]]) -> None:
        elapsed = now - self.last_reset
        half = self.round_seconds / 2.0
        for kind in list(self.worker_time):
            self.worker_time[kind] = 0.0
            for combo, entry in self.job_time.items():
                received = entry.get(kind, half) - half
                should = allocation.get(combo, {}).get(kind, 0.0) * elapsed
                per_type = self.deficits.setdefault(kind, {})
                per_type[combo] = per_type.get(combo, 0.0) + should - received
                entry[kind] = half
                self.worker_time[kind] += half
        self.last_reset = now


def priorities(
    allocation: Mapping[Combo, Mapping[str, float]],
    ledger: Ledger,
    runnable: Mapping[Combo, Mapping[str, bool]],
) -> dict[str, dict[Combo, float]]:
    """Step 2: X / fraction of time received, per type and combination.

    fraction = time the combination got on the type / time all got there. A
    combination that cannot run on a type, or has X = 0 there, scores 0.
    """
    out: dict[str, dict[Combo, float]] = {}
    for kind, total in ledger.worker_time.items():
        scores: dict[Combo, float] = {}
        for combo, entry in ledger.job_time.items():
            share = allocation.get(combo, {}).get(kind, 0.0)
            if share <= 0.0 or not runnable.get(combo, {}).get(kind, False):
                scores[combo] = 0.0
                continue
            fraction = entry.get(kind, 0.0) / total if total > 0 else 0.0
            scores[combo] = share / fraction if fraction > 0 else share * NEW_JOB_PRIORITY_SCALE
        out[kind] = scores
    return out


class Candidate(NamedTuple):
    """A combination that could run on a type in the next round."""

    combo: Combo
    worker_type: str
    priority: float
    deficit: float
    share: float


def type_order(
    worker_types: Sequence[str], speed: Mapping[str, float], rng: random.Random | None
) -> list[str]:
    """Fastest type first (by mean speed over jobs); shuffled when rng is given."""
    order = sorted(worker_types, key=lambda t: (-speed.get(t, 0.0), t))
    if rng is not None:
        rng.shuffle(order)
    return order


def rank(
    scores: Mapping[str, Mapping[Combo, float]],
    ledger: Ledger,
    allocation: Mapping[Combo, Mapping[str, float]],
    order: Sequence[str],
) -> list[Candidate]:
    """Step 3: per type in `order`, candidates by (priority, deficit, X) descending.

    Only combinations in X are candidates: a job that arrived after X was last
    computed waits for the next computation. Ties keep the ledger's order
    (arrival order), as a stable sort does.
    """
    ranked: list[Candidate] = []
    for kind in order:
        per_type = [
            Candidate(
                combo,
                kind,
                score,
                ledger.deficits.get(kind, {}).get(combo, 0.0),
                allocation.get(combo, {}).get(kind, 0.0),
            )
            for combo, score in scores.get(kind, {}).items()
            if combo in allocation
        ]
        per_type.sort(key=lambda c: (c.priority, c.deficit, c.share), reverse=True)
        ranked.extend(per_type)
    return ranked


def select(
    ranked: Iterable[Candidate],
    capacity: Mapping[str, int],
    scale_factor: Mapping[Combo, int],
    runnable: Mapping[Combo, Mapping[str, bool]],
    *,
    skip_zero_priority: bool = False,
) -> dict[str, list[Combo]]:
    """Step 4: greedy selection respecting scale factors and one combination per job."""
    left = dict(capacity)
    taken: set[str] = set()
    chosen: dict[str, list[Combo]] = {kind: [] for kind in capacity}
    for cand in ranked:
        kind = cand.worker_type
        if left.get(kind, 0) <= 0 or any(job in taken for job in cand.combo):
            continue
        if not runnable.get(cand.combo, {}).get(kind, False):
            continue
        if skip_zero_priority and cand.priority <= 0.0:
            continue
        need = scale_factor[cand.combo]
        if need > left[kind]:
            continue
        left[kind] -= need
        taken.update(cand.combo)
        chosen[kind].append(cand.combo)
    return chosen


def place(
    chosen: Mapping[str, Sequence[Combo]],
    scale_factor: Mapping[Combo, int],
    free: Iterable[Device],
    previous: Mapping[Combo, Sequence[Device]],
) -> dict[Combo, tuple[Device, ...]]:
    """Step 5: devices for every chosen combination (see the module docstring)."""
    pools: dict[str, dict[str, list[Device]]] = {}
    for device in sorted(free):
        pools.setdefault(device.worker_type, {}).setdefault(device.worker_id, []).append(device)
    out: dict[Combo, tuple[Device, ...]] = {}
    for kind, combos in chosen.items():
        pool = pools.get(kind, {})
        for size in sorted({scale_factor[c] for c in combos}, reverse=True):
            group = [c for c in combos if scale_factor[c] == size]
            for combo in group:  # keep a job on its devices: lease renewal, no restart
                before = tuple(previous.get(combo, ()))
                if (
                    before
                    and len(before) == size
                    and all(d in pool.get(d.worker_id, ()) for d in before)
                ):
                    out[combo] = before
                    _remove(pool, before)
            for combo in group:
                if combo not in out:
                    picked = consolidate(pool, size)
                    if picked is not None:
                        out[combo] = picked
                        _remove(pool, picked)
    return out


def _remove(pool: dict[str, list[Device]], devices: Iterable[Device]) -> None:
    for device in devices:
        left = pool[device.worker_id]
        left.remove(device)
        if not left:
            del pool[device.worker_id]


@dataclass
class JobView:
    """What the mechanism knows of a job.

    throughputs[type] is steps/s on scale_factor devices of that type (absent or
    0: cannot run there); colocated[(other job, type)] the pair's steps/s for
    this job when space sharing. The owner updates steps_remaining in place as
    the job progresses (read when X is recomputed).
    """

    job_id: str
    scale_factor: int
    throughputs: Mapping[str, float]
    steps_remaining: float
    arrival_time: float
    priority_weight: float = 1.0
    deadline: float = math.inf
    entity: str = "default"
    colocated: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def rate(self, combo: Combo, worker_type: str) -> float:
        """Steps/s of this job on one device set of worker_type, alone or in `combo`."""
        if len(combo) == 1:
            return self.throughputs.get(worker_type, 0.0)
        other = combo[1] if combo[0] == self.job_id else combo[0]
        return self.colocated.get((other, worker_type), 0.0)


@dataclass(frozen=True)
class RoundPlan:
    """Step 1-5 output: which combination runs where in the next round."""

    placements: dict[Combo, tuple[Device, ...]]
    worker_type: dict[Combo, str]
    renewed: frozenset[Combo]
    recomputed: bool


class RoundScheduler:
    """Steps 1-6 with the state they carry between rounds: jobs, X, the ledger, placements.

    Not thread-safe; the service calls it under its lock.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        round_seconds: float,
        min_recompute_seconds: float = 0.0,
        seed: int = 0,
        entity_weights: Mapping[str, float] | None = None,
        entity_policies: Mapping[str, EntityPolicy] | None = None,
        costs: Mapping[str, float] | None = None,
    ) -> None:
        self.policy = policy
        self._costs = dict(costs or {})
        self.round_seconds = round_seconds
        self.min_recompute_seconds = min_recompute_seconds
        self.ledger = Ledger(round_seconds)
        self.jobs: dict[str, JobView] = {}
        self.allocation: dict[Combo, dict[str, float]] = {}
        self._last_solved: dict[Combo, dict[str, float]] = {}
        self.previous_placements: dict[Combo, tuple[Device, ...]] = {}
        self.stale = True
        self.solves = 0
        self._type_rng = random.Random(seed + 5)
        self.scores: dict[str, dict[Combo, float]] = {}  # the last round's priorities (step 2)
        self._seed = seed
        self._entity_weights = dict(entity_weights or {})
        self._entity_policies = dict(entity_policies or {})
        self._info: tuple[dict[Combo, int], dict[Combo, dict[str, bool]]] | None = None
        self._info_key: tuple[str, ...] = ()
        self._speed: dict[str, float] | None = None
        self._unfolded = False  # X was recomputed since the ledger's last reset

    # Step 1 ------------------------------------------------------------------
    def add_job(self, job: JobView, worker_types: Iterable[str]) -> None:
        """A job arrived (or was recovered): it joins the ledger; X is stale.

        With space sharing its pairs with every job of its scale factor join too, as in
        Gavel: at each reset every pair's half round counts in its type's total, so a pair
        the allocation leaves out still lowers every fraction of time received."""
        kinds = list(worker_types)
        self.ledger.add((job.job_id,), kinds)
        if getattr(self.policy, "space_sharing", False):
            for other in self.jobs.values():
                if other.job_id != job.job_id and other.scale_factor == job.scale_factor:
                    self.ledger.add((other.job_id, job.job_id), kinds, seconds=0.0)
        self.jobs[job.job_id] = job
        self._changed()

    def update_job(self, job: JobView, worker_types: Iterable[str]) -> None:
        """A known job with new estimates, or a cluster with new types: X is stale when
        what the policy reads changed."""
        old = self.jobs.get(job.job_id)
        self.jobs[job.job_id] = job
        for combo in [c for c in self.ledger.job_time if job.job_id in c]:
            self.ledger.ensure(combo, worker_types)
        if old is None or (old.throughputs, old.colocated, old.scale_factor) != (
            job.throughputs,
            job.colocated,
            job.scale_factor,
        ):
            self._changed()

    def remove_job(self, job_id: str) -> None:
        """A job completed or was cancelled: X is stale."""
        self.jobs.pop(job_id, None)
        self.ledger.remove_job(job_id)
        self.allocation = {c: v for c, v in self.allocation.items() if job_id not in c}
        self.previous_placements = {
            c: d for c, d in self.previous_placements.items() if job_id not in c
        }
        self._changed()

    def workers_changed(self) -> None:
        """A worker joined or was lost: X must be recomputed at the next round, whatever the
        spacing (a lost worker's jobs must not wait)."""
        self.stale = True
        self.ledger.last_reset = 0.0
        self._info = None

    def _changed(self) -> None:
        self.stale = True
        self._info = None
        self._speed = None

    def allocation_due(self, now: float) -> bool:
        if not self.stale:
            return False
        elapsed = now - self.ledger.last_reset
        return elapsed >= self.min_recompute_seconds or self.ledger.last_reset == 0.0

    def policy_input(self, capacity: Mapping[str, int], now: float) -> PolicyInput:
        """The policy's view of the active jobs (arrival order) and the capacity."""
        jobs = list(self.jobs.values())
        types = sorted(capacity)
        throughputs = np.array([[job.throughputs.get(t, 0.0) for t in types] for job in jobs])
        colocated: dict[tuple[int, int], FloatArray] = {}
        index = {job.job_id: i for i, job in enumerate(jobs)}
        for a, job in enumerate(jobs):
            for other, _ in job.colocated:
                b = index.get(other)
                if b is None or b <= a or (a, b) in colocated:
                    continue
                colocated[(a, b)] = np.array(
                    [
                        [
                            job.colocated.get((other, t), 0.0),
                            jobs[b].colocated.get((job.job_id, t), 0.0),
                        ]
                        for t in types
                    ]
                )
        # Sticky policies (Gavel's FIFO queue) see the X in force, completed jobs included.
        previous = {c[0]: dict(v) for c, v in self._last_solved.items() if len(c) == 1}
        return PolicyInput.create(
            [job.job_id for job in jobs],
            types,
            throughputs.reshape(len(jobs), len(types)),
            [capacity[t] for t in types],
            scale_factors=[job.scale_factor for job in jobs],
            priority_weights=[job.priority_weight for job in jobs],
            steps_remaining=[job.steps_remaining for job in jobs],
            times_since_start=[now - job.arrival_time for job in jobs],
            deadlines=[job.deadline - now for job in jobs],
            entities=[job.entity for job in jobs],
            entity_weights=self._entity_weights,
            entity_policies=self._entity_policies,
            colocated=colocated,
            previous=previous,
            seed=self._seed,
            costs=[self._costs.get(t, 1.0) for t in types],
        )

    def recompute(self, capacity: Mapping[str, int], now: float, *, fold: bool = True) -> None:
        """Reset the ledger against the old X, then solve the policy for the new one. Without
        `fold` the ledger goes on counting from its last reset (a round between two shares,
        `choose`); the next recomputation that folds it weighs that whole span by the X then
        in force."""
        if fold:
            self.ledger.reset(now, self.allocation)
        self._unfolded = not fold
        result = self.policy.allocate(self.policy_input(capacity, now))
        self.allocation = allocation_dict(result)
        self._last_solved = dict(self.allocation)
        for combo in self.allocation:
            if combo not in self.ledger.job_time:
                self.ledger.add(combo, capacity)
        self.stale = False
        self.solves += 1
        self._info = None

    def _combo_info(
        self, capacity: Mapping[str, int]
    ) -> tuple[dict[Combo, int], dict[Combo, dict[str, bool]]]:
        """Scale factor and runnable types of every combination (cached between changes)."""
        key = tuple(sorted(capacity))
        if self._info is not None and self._info_key == key:
            return self._info
        size: dict[Combo, int] = {}
        runnable: dict[Combo, dict[str, bool]] = {}
        for combo in self.ledger.job_time:
            members = [self.jobs[j] for j in combo if j in self.jobs]
            if len(members) != len(combo):
                continue
            size[combo] = members[0].scale_factor
            runnable[combo] = {t: all(m.rate(combo, t) > 0 for m in members) for t in key}
        self._info, self._info_key = (size, runnable), key
        return size, runnable

    def _type_speed(self, capacity: Mapping[str, int]) -> dict[str, float]:
        if self._speed is None or set(self._speed) != set(capacity):
            jobs = list(self.jobs.values())
            self._speed = {
                t: float(np.mean([j.throughputs.get(t, 0.0) for j in jobs])) if jobs else 0.0
                for t in capacity
            }
        return self._speed

    # Steps 2-5 ---------------------------------------------------------------
    def choose(
        self,
        capacity: Mapping[str, int],
        now: float,
        pinned: Mapping[Combo, str] | None = None,
        *,
        share: bool = True,
    ) -> dict[Combo, str]:
        """Steps 1-4 alone: the combinations that run next round and their types (the
        pipeline's place stage does step 5). `pinned` combinations (placements within their
        residency, gearshift.scheduler.round.restart_cost) keep their type before any
        other is selected, whatever their priority. A round that does not `share` (between
        two re-sharings, RestartCost.share_period) brings X up to date for newcomers but
        leaves the ledger unfolded: folded at every event, the time fractions of rounds
        shorter than the period would rank the share by the last minute alone."""
        if share and self._unfolded:
            self.stale = True  # fold what the rounds since the last share counted
        if self.allocation_due(now):
            self.recompute(capacity, now, fold=share)
        chosen = self._select(capacity, pinned or {})
        return {c: k for k, combos in chosen.items() for c in combos}

    def _select(
        self, capacity: Mapping[str, int], pinned: Mapping[Combo, str] | None = None
    ) -> dict[str, list[Combo]]:
        size, runnable = self._combo_info(capacity)
        scores = self.scores = priorities(self.allocation, self.ledger, runnable)
        rng = None if self.policy.heterogeneity_aware else self._type_rng
        order = type_order(
            [t for t in capacity if capacity[t] > 0], self._type_speed(capacity), rng
        )
        ranked = rank(scores, self.ledger, self.allocation, order)
        if pinned:
            first = [
                Candidate(combo, kind, math.inf, 0.0, 0.0)
                for combo, kind in pinned.items()
                if combo in size
            ]
            ranked = first + ranked
        return select(
            ranked,
            capacity,
            size,
            runnable,
            skip_zero_priority=self.policy.skip_zero_priority,
        )

    def plan(self, capacity: Mapping[str, int], free: Iterable[Device], now: float) -> RoundPlan:
        """The next round: recompute X if due, then score, sort, select and place."""
        recomputed = False
        if self.allocation_due(now):
            self.recompute(capacity, now)
            recomputed = True
        size, _ = self._combo_info(capacity)
        chosen = self._select(capacity)
        placements = place(chosen, size, free, self.previous_placements)
        kinds = {c: k for k, combos in chosen.items() for c in combos if c in placements}
        renewed = frozenset(
            c for c, d in placements.items() if self.previous_placements.get(c) == d
        )
        self.previous_placements = dict(placements)
        return RoundPlan(placements, kinds, renewed, recomputed)

    # Step 6 ------------------------------------------------------------------
    def record(self, combo: Combo, worker_type: str, seconds: float) -> None:
        self.ledger.record(combo, worker_type, seconds)


def allocation_dict(result: Allocation) -> dict[Combo, dict[str, float]]:
    return {combo: dict(row) for combo, row in result.as_dict().items()}
