"""Gavel's round mechanism for elastic jobs: from time shares of configurations to rounds.

An elastic objective (policies.configs) gives x[m, c], the share of wall-clock
time job m should spend in device configuration c. As Gavel does for rigid jobs,
each round serves first the (job, configuration) pairs that received least of
their share, with the same steps:

1. allocate - recompute x when jobs arrived or left, when the types or a job's
   configurations changed, or when estimates moved (`stale`), spaced by
   `min_recompute_seconds`; the ledger starts afresh. With `in_background` (the
   daemon's `--recompute-in-background`) a recomputation after the first is solved on a
   thread of its own while the rounds go on with the x in force, and taken at the first
   round after it is done, as Gavel's physical scheduler does with its allocation
   thread: a solve over thousands of jobs (about a second at 8,000) no longer makes the
   round that asked for it that long. The simulator solves in the round (its results
   must not depend on a thread's timing).
2. score    - priority = x[m, c] / fraction of time received in c since then,
   counting half a round as received (as Gavel's Ledger does). A job that never
   ran scores 1e9 times more (Gavel's rule for new jobs: short jobs must not wait
   a round behind long ones). A job's current configuration scores
   (1 + hysteresis) times more: moving costs a checkpoint and a restart.
3. select   - highest priority first, one configuration per job, while its devices
   are free.
   A running job placed less than `preempt_exempt_seconds` ago is not scored: it
   keeps its configuration, and the others are selected on what it leaves (Slurm's
   PreemptExemptTime; off by default). With `max_moves_per_round` M, when the round
   would preempt, resize or move more than M running jobs, only the M with the oldest
   placements are let go (Slurm's sched_max_job_start, for moves), the others are kept
   where they are, and the round is chosen again.
   A placement within its residency (`restart`: a multiple of its restart seconds, a
   restart counted one round at most) is exempt the same way, so that priorities do not
   flip a job out right after it paid to start; but when the round, free of residencies,
   would shrink or preempt a resident job to admit or grow others, that is done if it pays
   over the job's horizon for every job it changes (`_release`).
4. hold     - hysteresis: a running job is not grown or moved for a gain below
   `hysteresis` (or one its restart would not pay for over its remaining time, capped at
   `restart.horizon_seconds`); it keeps its
   configuration if that is still free. Shrinking to make room for others is not
   held back: that is what fairness asks.
5. fill     - work conservation: a running job that was not selected keeps its
   configuration if its devices are free (no restart is cheaper than any other
   use of them), waiting jobs start on their smallest configuration that fits,
   then jobs grow into what is left, the largest gain per device first - a running
   job only when the gain beats `hysteresis` and the time it saves over the job's
   remaining work pays for its restart (`restart_seconds`).
6. account  - the time each job ran in its configuration goes to the ledger
   (the snapshot's `ran` entries).

The ESTs of a chosen configuration are split by EasyScale's planner
(gearshift.common.estplan.plan_on) with the job's measured capabilities.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from gearshift.scheduler.plugins.gavel.mechanism import NEW_JOB_PRIORITY_SCALE
from gearshift.scheduler.plugins.gavel.policies.base import Policy, PolicyInput
from gearshift.scheduler.plugins.gavel.policies.configs import Configurations, ElasticAllocation
from gearshift.scheduler.round.ests import ElasticJob, configurations, elastic_job, rate, split_ests
from gearshift.scheduler.round.restart_cost import Reallocated, RestartCost, work_gain
from gearshift.scheduler.types import Config, EntityPolicy, JobSnapshot, Snapshot, Target

Rows = list[tuple[Config, float]]
log = logging.getLogger("gearshift.scheduler")
T = TypeVar("T")


def _signature(rows: Rows) -> tuple[tuple[Config, float], ...]:
    """Rows with rates to two significant digits: small estimate drifts do not re-solve."""

    def coarse(value: float) -> float:
        if value <= 0:
            return 0.0
        return round(value, 1 - math.floor(math.log10(value)))

    return tuple((c, coarse(r)) for c, r in rows)


def fits(config: Config, free: Mapping[str, int]) -> bool:
    return all(free.get(t, 0) >= n for t, n in config)


def _room(free: Mapping[str, int]) -> bool:
    """Whether some configuration may still fit: a device of some type is free. (Not the
    sum: jobs sharing devices, DeepPool's, can leave a type below zero.)"""
    return any(n > 0 for n in free.values())


def _take(free: dict[str, int], config: Config, sign: int = -1) -> None:
    for t, n in config:
        free[t] = free.get(t, 0) + sign * n


def _per_kind(rows: Mapping[str, Rows], make: Callable[[Rows], T]) -> dict[str, T]:
    """`make` of each job's configurations, once per kind: the jobs of a kind share one
    list (`ElasticRounds._rows`), thousands of jobs and a few kinds (made per job, the
    rates of step 5 alone took 8% of a round's decision at 8,000 jobs). What is made is
    shared too: read it, do not change it."""
    made: dict[int, T] = {}
    out: dict[str, T] = {}
    for job_id, job_rows in rows.items():
        key = id(job_rows)  # the lists outlive the call: `rows` holds them
        if key not in made:
            made[key] = make(job_rows)
        out[job_id] = made[key]
    return out


def _left(capacity: Mapping[str, int], chosen: Mapping[str, Config]) -> dict[str, int]:
    """Devices of each type that the chosen configurations leave free."""
    free = dict(capacity)
    for config in chosen.values():
        _take(free, config)
    return free


def _placed(job: JobSnapshot, rows: Mapping[str, Rows]) -> bool:
    """Running, on a configuration it may still have (its devices are all still there)."""
    return bool(job.current) and any(config == job.current for config, _ in rows[job.job_id])


def _within(small: Config, big: Config) -> bool:
    have = dict(big)
    return all(have.get(t, 0) >= n for t, n in small)


class _Solve:
    """A policy solved on a thread of its own (ElasticRounds.in_background)."""

    def __init__(
        self, solve: Callable[[PolicyInput], ElasticAllocation], inp: PolicyInput, since: float
    ) -> None:
        self.since = since  # when its input was taken
        self.done = threading.Event()
        self.result: ElasticAllocation | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0  # how long it took
        self.jobs = 0
        threading.Thread(
            target=self._run, args=(solve, inp), name="allocation-solve", daemon=True
        ).start()

    def _run(self, solve: Callable[[PolicyInput], ElasticAllocation], inp: PolicyInput) -> None:
        began = time.perf_counter()
        try:
            self.result = solve(inp)
        except Exception as exc:  # handed to the rounds' thread, which logs it
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - began
            self.jobs = len(inp.job_ids)
            self.done.set()


# The least re-allocation factor a current configuration's priority is divided by: a job
# whose restarts ate all its time keeps its configuration 1,000-fold, not infinitely.
_LEAST_FACTOR = 1e-3

# Entries a memo (the splits, ElasticRounds._rows) keeps before it starts afresh.
_MEMO_SIZE = 1 << 14


@dataclass
class ElasticRounds:
    """The allocate stage for an elastic Gavel objective; see the module docstring."""

    policy: Policy
    round_seconds: float
    min_recompute_seconds: float = 0.0
    hysteresis: float = 0.1
    # Slurm's PreemptExemptTime: a job whose placement started less than this ago keeps it
    # (not preempted, shrunk, grown or moved). Under a stream of new jobs, which Gavel's
    # rule puts first, each round would otherwise swap most of the cluster.
    preempt_exempt_seconds: float = 0.0
    # Slurm's sched_max_job_start, for moves: at most this many running jobs preempted,
    # resized or moved a round (0: no bound); the oldest placements go first.
    max_moves_per_round: int = 0
    # How moves are weighed against their restarts (round/restart_cost.py): a placement is
    # exempt for its residency, and a running job grows or moves only when that pays over
    # its capped remaining time. Off: only `hysteresis` and the uncapped remaining work.
    restart: RestartCost = field(default_factory=RestartCost.off)
    prices: Mapping[str, float] = field(default_factory=dict)
    entity_weights: Mapping[str, float] = field(default_factory=dict)
    entity_policies: Mapping[str, EntityPolicy] = field(default_factory=dict)
    seed: int = 0
    replans_on_events: bool = True
    in_background: bool = False  # recomputations after the first beside the rounds (step 1)
    shares: dict[str, dict[Config, float]] = field(default_factory=dict)
    received: dict[str, dict[Config, float]] = field(default_factory=dict)
    last_reset: float | None = None  # when x was last computed (None: never)
    stale: bool = True
    solves: int = 0
    _solving: _Solve | None = None  # the recomputation under way beside the rounds
    _ranked: dict[str, float] = field(default_factory=dict)  # each job's best priority (step 2)
    _resident: set[str] = field(default_factory=set)  # exempt by residency alone: may grow
    # restart.realloc_factor: each job's placement seen last (its placed_at) and the
    # restarts since its first start (Sia's num_restarts: every later placement, a resume
    # after a preemption included)
    _restarts: dict[str, tuple[float, int]] = field(default_factory=dict)
    _now: float = 0.0  # the round's time (for _worth)
    _known: dict[str, object] = field(default_factory=dict)
    _types: tuple[str, ...] = ()
    # Per job, what step 1 made of its snapshot last round: reused while the round hands in
    # the same snapshot object and capacity (the daemon's rounds do for unchanged jobs), or
    # one with only its attained service moved on (a running job's, each round).
    _worked: dict[str, tuple[JobSnapshot, Hashable, ElasticJob, Rows, Hashable]] = field(
        default_factory=dict
    )
    # (ElasticJob.key, capacity) -> the configurations and their signature: what a job's
    # kind decides, shared by the thousands of jobs of a few kinds, and by a running job's
    # new snapshot each round (its attained service changed, not its kind).
    _rows: dict[Hashable, tuple[Rows, tuple[tuple[Config, float], ...]]] = field(
        default_factory=dict
    )

    @property
    def name(self) -> str:
        return self.policy.name

    def priorities(self) -> Mapping[str, float]:
        """Each job's best priority in the last round (round/hooks.Ranks: its reasons)."""
        return self._ranked

    # The stage -----------------------------------------------------------------
    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        capacity = snapshot.capacity
        self._now = snapshot.now
        models, rows, signatures = self._work_out(snapshot.jobs, capacity)
        for ran in snapshot.ran:  # step 5 of the last round
            entry = self.received.setdefault(ran.job_id, {})
            entry[ran.config] = entry.get(ran.config, 0.0) + ran.seconds
        self._take_solved()
        self._sync(snapshot, signatures)
        if self.stale and self._due(snapshot.now) and self._solving is None:
            self._recompute(snapshot, models, rows)
        if self.restart.realloc_factor:
            self._count_restarts(snapshot)
        exempt = self._exempt(snapshot, rows)
        chosen = self._choose(snapshot, models, rows, capacity, exempt)
        if self._resident:
            exempt, chosen = self._release(
                snapshot, models, rows, capacity, exempt=exempt, kept=chosen
            )
        moved = self._moved(snapshot, rows, exempt, chosen)
        if self.max_moves_per_round and len(moved) > self.max_moves_per_round:
            held = {j.job_id: j.current for j in moved[self.max_moves_per_round :]}
            chosen = self._choose(snapshot, models, rows, capacity, {**exempt, **held})
        return {
            job_id: Target(job_id, config, split_ests(models[job_id], config))
            for job_id, config in chosen.items()
        }

    # Step 1 ----------------------------------------------------------------------
    def _work_out(
        self, jobs: Sequence[JobSnapshot], capacity: Mapping[str, int]
    ) -> tuple[dict[str, ElasticJob], dict[str, Rows], dict[str, Hashable]]:
        """Each job's model, configurations and their signature (see `_worked`)."""
        where = tuple(sorted(capacity.items()))
        models: dict[str, ElasticJob] = {}
        rows: dict[str, Rows] = {}
        signatures: dict[str, Hashable] = {}
        worked: dict[str, tuple[JobSnapshot, Hashable, ElasticJob, Rows, Hashable]] = {}
        for job in jobs:
            entry = self._worked.get(job.job_id)
            if entry is None or entry[1] != where:
                entry = self._work_out_one(job, capacity, where)
            elif entry[0] is not job:  # a running job's new snapshot each round
                if job.moved_on_from(entry[0]):
                    entry = (job, *entry[1:])
                else:
                    entry = self._work_out_one(job, capacity, where)
            worked[job.job_id] = entry
            models[job.job_id], rows[job.job_id], signatures[job.job_id] = entry[2:]
        self._worked = worked
        return models, rows, signatures

    def _work_out_one(
        self, job: JobSnapshot, capacity: Mapping[str, int], where: Hashable
    ) -> tuple[JobSnapshot, Hashable, ElasticJob, Rows, Hashable]:
        model = self._model(job)
        job_rows, signature = self._rows_of(model, capacity, where)
        return job, where, model, job_rows, (signature, job.priority_weight, job.entity)

    def _rows_of(
        self, model: ElasticJob, capacity: Mapping[str, int], where: Hashable
    ) -> tuple[Rows, tuple[tuple[Config, float], ...]]:
        kind = (model.key, where)
        found = self._rows.get(kind)
        if found is None:
            if len(self._rows) >= _MEMO_SIZE:
                self._rows.clear()
            rows = configurations(model, capacity)
            found = self._rows[kind] = (rows, _signature(rows))
        return found

    def _model(self, job: JobSnapshot) -> ElasticJob:
        model = elastic_job(job)
        if self.policy.heterogeneity_aware:
            return model
        speeds = [model.capability[t] for t in model.types()]
        mean = float(np.mean(speeds)) if speeds else 0.0
        return replace(model, capability={t: mean for t in model.types()})

    def _sync(self, snapshot: Snapshot, signatures: Mapping[str, Hashable]) -> None:
        ids = {job.job_id for job in snapshot.jobs}
        for job_id in [j for j in self._known if j not in ids]:
            del self._known[job_id]
            self.shares.pop(job_id, None)
            self.received.pop(job_id, None)
            self.stale = True
        types = tuple(snapshot.worker_types)
        if types != self._types:
            self._types = types
            self.stale = True
        for job in snapshot.jobs:
            key = signatures[job.job_id]
            if self._known.get(job.job_id) != key:
                self._known[job.job_id] = key
                self.stale = True

    def _due(self, now: float) -> bool:
        return self.last_reset is None or now - self.last_reset >= self.min_recompute_seconds

    def _recompute(
        self,
        snapshot: Snapshot,
        models: Mapping[str, ElasticJob],
        rows: Mapping[str, Rows],
    ) -> None:
        jobs = [job for job in snapshot.jobs if rows[job.job_id]]
        types = snapshot.worker_types
        capacity = snapshot.capacity
        now = snapshot.now
        configs = Configurations.build(types, [rows[job.job_id] for job in jobs])
        unit = np.array(
            [[self._unit_rate(job, models[job.job_id], t) for t in types] for job in jobs]
        )
        inp = PolicyInput.create(
            [job.job_id for job in jobs],
            types,
            unit.reshape(len(jobs), len(types)),
            [capacity[t] for t in types],
            priority_weights=[job.priority_weight for job in jobs],
            steps_remaining=[job.steps_remaining for job in jobs],
            times_since_start=[now - job.arrival_time for job in jobs],
            deadlines=[job.deadline - now for job in jobs],
            costs=[self.prices.get(t, 1.0) for t in types],
            entities=[job.entity for job in jobs],
            entity_weights=self.entity_weights,
            entity_policies=self.entity_policies,
            seed=self.seed,
            configs=configs,
            max_devices=[models[job.job_id].most for job in jobs],
        )
        self.stale = False
        if self.in_background and self.last_reset is not None:
            self._solving = _Solve(self.policy.allocate_elastic, inp, now)
        else:  # the first x: no round can go on without one
            self._take(self.policy.allocate_elastic(inp), now)

    def _take(self, result: ElasticAllocation, now: float) -> None:
        """x in force from now (the time its input was taken), the ledger afresh; the
        shares of jobs gone while it was solved are left out."""
        self.shares = {
            job_id: dict(v) for job_id, v in result.shares.items() if job_id in self._known
        }
        self.received = {}
        self.last_reset = now
        self.solves += 1

    def _take_solved(self) -> None:
        """The recomputation solved beside the rounds, once it is done; one that failed
        is logged and tried again when due (the x in force stays)."""
        solving = self._solving
        if solving is None or not solving.done.is_set():
            return
        self._solving = None
        if solving.error is not None:
            log.error("recomputing the allocation failed", exc_info=solving.error)
            self.stale = True
            return
        assert solving.result is not None
        self._take(solving.result, solving.since)
        log.info(
            "allocation recomputed beside the rounds",
            extra={"jobs": solving.jobs, "seconds": round(solving.seconds, 3)},
        )

    @staticmethod
    def _unit_rate(job: JobSnapshot, model: ElasticJob, kind: str) -> float:
        """The job's rate on one device of `kind`: for a rigid job its rate on its devices
        divided by their number (Gavel's normalization), else one device's rate."""
        if kind not in model.types():
            return 0.0
        if job.rigid:
            return rate(model, {kind: model.max_devices}) / model.max_devices
        return model.capability[kind] * model.scaling(1) / model.slowdown

    def _choose(
        self,
        snapshot: Snapshot,
        models: Mapping[str, ElasticJob],
        rows: Mapping[str, Rows],
        capacity: Mapping[str, int],
        exempt: Mapping[str, Config],
    ) -> dict[str, Config]:
        """Steps 2-5, the exempt jobs kept where they are."""
        chosen = self._select(snapshot, rows, _left(capacity, exempt), exempt)
        chosen.update(exempt)
        chosen = self._hold(snapshot, rows, capacity, chosen)
        return self._fill(snapshot, models, rows, capacity, chosen, exempt=exempt)

    @staticmethod
    def _moved(
        snapshot: Snapshot,
        rows: Mapping[str, Rows],
        exempt: Mapping[str, Config],
        chosen: Mapping[str, Config],
    ) -> list[JobSnapshot]:
        """The running jobs the round would preempt, resize or move (each a checkpoint and a
        restart), the oldest placement first: those are the ones max_moves_per_round lets
        go, and the newer ones wait for a later round."""
        moved = [
            job
            for job in snapshot.jobs
            if job.job_id not in exempt
            and _placed(job, rows)
            and chosen.get(job.job_id) != job.current
        ]
        return sorted(moved, key=lambda j: j.placed_at)

    def _exempt(self, snapshot: Snapshot, rows: Mapping[str, Rows]) -> dict[str, Config]:
        """The running jobs placed less than preempt_exempt_seconds ago, or within their
        residency (a multiple of their restart seconds), on their devices, as many as the
        capacity holds (a tenant's guarantee may have taken some: the oldest keep theirs).
        The residency holds against other started jobs' priorities only: while a job that
        never ran waits, it does not apply (a newcomer is served as Gavel serves it), and a
        resident job may still grow when that pays (`_resident`)."""
        self._resident = set()
        residency = self.restart.residency_multiple > 0 and not snapshot.newcomer_waits
        if self.preempt_exempt_seconds <= 0 and not residency:
            return {}
        since = snapshot.now - self.preempt_exempt_seconds
        free = dict(snapshot.capacity)
        out: dict[str, Config] = {}
        for job in snapshot.jobs:
            if not job.current or not _placed(job, rows) or not fits(job.current, free):
                continue
            if job.placed_at > since:
                out[job.job_id] = job.current
            elif residency and self.restart.resident(
                job.placed_at, snapshot.now, job.restart_seconds, self.round_seconds
            ):
                out[job.job_id] = job.current
                self._resident.add(job.job_id)
            else:
                continue
            _take(free, job.current)
        return out

    def _release(
        self,
        snapshot: Snapshot,
        models: Mapping[str, ElasticJob],
        rows: Mapping[str, Rows],
        capacity: Mapping[str, int],
        *,
        exempt: dict[str, Config],
        kept: dict[str, Config],
    ) -> tuple[dict[str, Config], dict[str, Config]]:
        """The resident jobs that the objective, free of residencies, would shrink or preempt
        to admit or grow others are let go when that pays over their horizon for every job
        it changes (round/restart_cost.work_gain): a shrink never pays for the job itself,
        only for the others. (exempt, chosen): as they were when it does not pay."""
        ranked = self._ranked  # the priorities the reasons show: those of the round kept
        free = self._choose(
            snapshot,
            models,
            rows,
            capacity,
            {j: c for j, c in exempt.items() if j not in self._resident},
        )
        given = {
            j
            for j in self._resident
            if free.get(j) != exempt[j] and _within(free.get(j, ()), exempt[j])
        }
        if not given:
            self._ranked = ranked
            return exempt, kept
        rest = {j: c for j, c in exempt.items() if j not in given}
        if given != self._resident:
            free = self._choose(snapshot, models, rows, capacity, rest)
        by_id = {job.job_id: job for job in snapshot.jobs}
        rates = _per_kind(rows, dict)
        window = min(
            self.restart.horizon(by_id[j].steps_remaining, rates[j].get(by_id[j].current, 0.0))
            for j in given
        )
        changed = []
        for job_id in kept.keys() | free.keys():
            before, after = kept.get(job_id, ()), free.get(job_id, ())
            if before == after:
                continue
            job = by_id[job_id]
            running = _placed(job, rows)
            changed.append(
                Reallocated(
                    unit=max(models[job_id].capability.values(), default=1.0),
                    steps_remaining=job.steps_remaining,
                    restart_seconds=job.restart_seconds,
                    rate_without=rates[job_id].get(before, 0.0),
                    restarts_without=running and bool(before) and before != job.current,
                    rate_with=rates[job_id].get(after, 0.0)
                    * (
                        self._factor(job, snapshot.now)
                        if running and bool(after) and after != job.current
                        else 1.0
                    ),
                    restarts_with=running and bool(after) and after != job.current,
                )
            )
        if work_gain(changed, window) <= 0:
            self._ranked = ranked
            return exempt, kept
        self._resident -= given
        return rest, free

    def _count_restarts(self, snapshot: Snapshot) -> None:
        """Each running job's restarts: a placement it had not been seen on is one, its
        first excepted."""
        seen: dict[str, tuple[float, int]] = {}
        for job in snapshot.jobs:
            at, count = self._restarts.get(job.job_id, (math.nan, -1))
            if job.current and job.placed_at != at:
                at, count = job.placed_at, count + 1
            seen[job.job_id] = (at, count)
        self._restarts = seen

    def restarts(self, job_id: str) -> int:
        """The restarts restart.realloc_factor counts for a job (0: none or not counted)."""
        return max(self._restarts.get(job_id, (math.nan, 0))[1], 0)

    def _factor(self, job: JobSnapshot, now: float) -> float:
        """The job's re-allocation factor (RestartCost.factor; 1 when off)."""
        if not self.restart.realloc_factor:
            return 1.0
        return self.restart.factor(
            now - job.arrival_time, self.restarts(job.job_id), job.restart_seconds
        )

    # Steps 2-3 -------------------------------------------------------------------
    def _select(
        self,
        snapshot: Snapshot,
        rows: Mapping[str, Rows],
        capacity: Mapping[str, int],
        exempt: Mapping[str, Config],
    ) -> dict[str, Config]:
        elapsed = max(snapshot.now - (self.last_reset or snapshot.now), 0.0)
        half = self.round_seconds / 2.0
        ranked: list[tuple[float, float, float, int, str, Config]] = []
        allowed_of = _per_kind(rows, lambda r: {c for c, _ in r})
        for order, job in enumerate(snapshot.jobs):
            shares = self.shares.get(job.job_id)
            if not shares or job.job_id in exempt:
                continue
            allowed = allowed_of[job.job_id]
            got = self.received.get(job.job_id, {})
            for config, share in shares.items():
                if share <= 0 or config not in allowed:
                    continue
                fraction = (half + got.get(config, 0.0)) / (half + elapsed)
                priority = share / fraction
                if job.attained_seconds <= 0:  # never ran: first, as Gavel's new jobs
                    priority *= NEW_JOB_PRIORITY_SCALE
                if config == job.current:
                    priority *= 1.0 + self.hysteresis
                    # Sia's re-allocation factor (restart.realloc_factor): the other
                    # configurations' worth to this job is scaled by it, so its own is
                    # worth 1/factor more (1 when off)
                    priority /= max(self._factor(job, snapshot.now), _LEAST_FACTOR)
                deficit = share * elapsed - got.get(config, 0.0)
                ranked.append((priority, deficit, share, -order, job.job_id, config))
        ranked.sort(key=lambda c: c[:4], reverse=True)
        best: dict[str, float] = {}
        for priority, *_, job_id, _config in ranked:
            best.setdefault(job_id, priority)  # sorted: the first is its best
        self._ranked = best
        free = dict(capacity)
        chosen: dict[str, Config] = {}
        room = _room(free)
        for *_, job_id, config in ranked:
            if not room:
                break  # nothing fits any more
            if job_id not in chosen and fits(config, free):
                chosen[job_id] = config
                _take(free, config)
                room = _room(free)
        return chosen

    # Step 4 ----------------------------------------------------------------------
    def _hold(
        self,
        snapshot: Snapshot,
        rows: Mapping[str, Rows],
        capacity: Mapping[str, int],
        chosen: dict[str, Config],
    ) -> dict[str, Config]:
        free = _left(capacity, chosen)
        for job in snapshot.jobs:
            new = chosen.get(job.job_id)
            old = job.current
            if not old or new is None or new == old or (_within(new, old) and new != old):
                continue  # not running, stopped, unchanged, or shrunk for others
            rates = dict(rows[job.job_id])
            keeps = _within(old, new)  # a grow where it runs (in place, where it can)
            if old not in rates or self._worth(job, rates[old], rates.get(new, 0.0), keeps):
                continue
            _take(free, new, sign=+1)
            if fits(old, free):
                chosen[job.job_id] = old
                _take(free, old)
            else:
                _take(free, new)
        return chosen

    # Step 5 ----------------------------------------------------------------------
    def _fill(
        self,
        snapshot: Snapshot,
        models: Mapping[str, ElasticJob],
        rows: Mapping[str, Rows],
        capacity: Mapping[str, int],
        chosen: dict[str, Config],
        *,
        exempt: Mapping[str, Config],
    ) -> dict[str, Config]:
        free = _left(capacity, chosen)
        rates = _per_kind(rows, dict)
        for job in snapshot.jobs:  # keep running where nothing else wants the devices
            kept = job.job_id not in chosen and job.current in rates[job.job_id]
            if kept and fits(job.current, free):
                chosen[job.job_id] = job.current
                _take(free, job.current)
        room = _room(free)
        for job in snapshot.jobs:  # start waiting jobs small
            if not room:
                break  # a full cluster: nothing fits
            if job.job_id in chosen or not rows[job.job_id]:
                continue
            for config, _ in rows[job.job_id]:  # smallest first
                if fits(config, free):
                    chosen[job.job_id] = config
                    _take(free, config)
                    room = _room(free)
                    break
        self._grow(snapshot, models, rates, free, chosen, exempt=exempt)
        return chosen

    def _grow(
        self,
        snapshot: Snapshot,
        models: Mapping[str, ElasticJob],
        rates: Mapping[str, Mapping[Config, float]],
        free: dict[str, int],
        chosen: dict[str, Config],
        *,
        exempt: Mapping[str, Config],
    ) -> None:
        """Grow the chosen jobs (not the exempt ones) into the free devices, the largest
        gain per device first, one step at a time (ties: the job chosen first, then its
        first configuration).

        Candidates wait in a heap, so a round over thousands of jobs and devices costs a
        sort, not a pass over every job per device handed out: a job's candidates are
        renewed when it grows (older ones are skipped), and one that no longer fits is
        dropped for good, since each step only takes devices."""
        by_id = {job.job_id: job for job in snapshot.jobs}
        order = {job_id: i for i, job_id in enumerate(chosen)}
        heap: list[tuple[float, int, int, int, str, Config, Config]] = []
        version: dict[str, int] = {}

        def offer(job_id: str) -> None:
            config = chosen[job_id]
            version[job_id] = version.get(job_id, 0) + 1
            job = by_id[job_id]
            now_rate = rates[job_id].get(config, 0.0)
            unit = max(models[job_id].capability.values(), default=1.0) or 1.0
            have = dict(config)
            for k, (bigger, bigger_rate) in enumerate(rates[job_id].items()):
                if bigger == config or not _within(config, bigger):
                    continue
                gain = bigger_rate - now_rate
                if gain <= 0:
                    continue
                if (
                    job.current
                    and job.current == config
                    and not self._worth(job, now_rate, bigger_rate, keeps=True)
                ):
                    continue
                extra = tuple((t, n - have.get(t, 0)) for t, n in bigger)
                score = gain / unit / max(sum(n for _, n in extra), 1)
                entry = (-score, order[job_id], k, version[job_id], job_id, bigger, extra)
                heapq.heappush(heap, entry)

        if not _room(free):
            return  # a full cluster: nothing to grow into
        for job_id in chosen:
            if job_id not in exempt or job_id in self._resident:
                offer(job_id)
        while heap and any(n > 0 for n in free.values()):
            _, _, _, seen, job_id, bigger, extra = heapq.heappop(heap)
            if seen != version[job_id] or not fits(extra, free):
                continue
            _take(free, chosen[job_id], sign=+1)
            chosen[job_id] = bigger
            _take(free, bigger)
            offer(job_id)

    def _worth(self, job: JobSnapshot, now_rate: float, new_rate: float, keeps: bool) -> bool:
        """Whether a running job should change to go from now_rate to new_rate (`keeps`:
        the change keeps its devices, in place where the job can)."""
        if now_rate <= 0:
            return True
        if new_rate * self._factor(job, self._now) < now_rate * (1.0 + self.hysteresis):
            return False
        # The restart must pay for itself over the work the job has left (capped).
        cost = job.change_seconds(keeps)
        return self.restart.move_pays(now_rate, new_rate, job.steps_remaining, cost)


def describe_shares(shares: Mapping[str, Mapping[Config, float]]) -> dict[str, list[str]]:
    """Human-readable x (for logs and tests): job -> ["2xv100: 0.50", ...]."""
    return {
        job: [
            "+".join(f"{n}x{t}" for t, n in config) + f": {share:.2f}"
            for config, share in sorted(rows.items(), key=lambda item: -item[1])
        ]
        for job, rows in shares.items()
    }
