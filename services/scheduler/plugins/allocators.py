"""The allocate stage's plugins, and the names that choose them.

- `GavelRounds`: a Gavel objective over rigid jobs (a job's scale factor is its
  max_devices, one type at a time), run by Gavel's round mechanism
  (gearshift.scheduler.plugins.gavel.mechanism): exactly Gavel's semantics, so the simulator
  stays within a few percent of Gavel's own.
- `ElasticRounds` (gearshift.scheduler.plugins.gavel.elastic_rounds): the same objectives over
  elastic jobs' device configurations - counts and, for D2 jobs, mixes of types.
- `Greedy`: EasyScale's greedy inter-job allocator or the YARN-CS gang baseline
  (gearshift.scheduler.plugins.easyscale.elastic), re-planned at every arrival and completion.

`make_allocator("las", elastic=True)` is elastic LAS; every objective with an
elastic form (`Policy.has_elastic_form`) takes `elastic=True`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gearshift.common.errors import ValidationError
from gearshift.scheduler.plugins.easyscale.elastic import (
    ELASTIC_POLICIES,
    ElasticPolicy,
    Left,
    make_elastic_policy,
)
from gearshift.scheduler.plugins.gavel.elastic_rounds import ElasticRounds
from gearshift.scheduler.plugins.gavel.mechanism import Combo, JobView, RoundScheduler
from gearshift.scheduler.plugins.gavel.policies import elastic_refusal, make_policy, policy_names
from gearshift.scheduler.plugins.gavel.policies.max_min_fairness import MaxMinFairness
from gearshift.scheduler.round.ests import elastic_job, split_ests
from gearshift.scheduler.round.restart_cost import RestartCost
from gearshift.scheduler.types import (
    Allocator,
    EntityPolicy,
    JobSnapshot,
    LasShares,
    Snapshot,
    Target,
    config_of,
)


class GavelRounds:
    """A rigid Gavel policy in rounds; see the module docstring."""

    replans_on_events = False

    def __init__(self, mechanism: RoundScheduler, restart: RestartCost | None = None) -> None:
        self.mechanism = mechanism
        self.restart = restart or RestartCost.off()
        self._last: dict[str, Combo] = {}
        self._capacity: dict[str, int] = {}
        self._shared_at: float | None = None  # the last round that re-shared the devices

    @property
    def name(self) -> str:
        return self.mechanism.policy.name

    @property
    def space_sharing(self) -> bool:
        """Whether the policy pairs jobs on devices (the round then tells it pair rates)."""
        return bool(getattr(self.mechanism.policy, "space_sharing", False))

    def priorities(self) -> dict[str, float]:
        """Each job's best priority over the types in the last round (round/hooks.Ranks)."""
        out: dict[str, float] = {}
        for per_type in self.mechanism.scores.values():
            for combo, score in per_type.items():
                for job_id in combo:
                    out[job_id] = max(out.get(job_id, score), score)
        return out

    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        mech = self.mechanism
        types = snapshot.worker_types
        if snapshot.capacity != self._capacity:  # a worker joined or was lost: X now
            if self._capacity:
                mech.workers_changed()
            self._capacity = snapshot.capacity
            self._shared_at = None
        seen: set[Combo] = set()
        for ran in snapshot.ran:  # account the last round, as Gavel: once per combination
            combo = self._last.get(ran.job_id, (ran.job_id,))
            if combo in seen or not ran.config:
                continue
            seen.add(combo)
            longest = max(r.seconds for r in snapshot.ran if r.job_id in combo)
            mech.record(combo, ran.config[0][0], longest)
        ids = {job.job_id for job in snapshot.jobs}
        for job_id in [j for j in mech.jobs if j not in ids]:
            mech.remove_job(job_id)
        for job in snapshot.jobs:
            view = self._view(job, snapshot)
            if job.job_id in mech.jobs:
                mech.update_job(view, types)
            else:
                mech.add_job(view, types)
        period = self.restart.share_period(job.restart_seconds for job in snapshot.jobs)
        share = self._shares(snapshot.now, period)
        chosen = mech.choose(
            snapshot.capacity, snapshot.now, self._pinned(snapshot, share, period), share=share
        )
        self._last = {job: combo for combo in chosen for job in combo}
        by_id = {job.job_id: job for job in snapshot.jobs}
        out: dict[str, Target] = {}
        for combo, kind in chosen.items():
            for job_id in combo:
                job = by_id[job_id]
                config = config_of({kind: mech.jobs[job_id].scale_factor})
                out[job_id] = Target(
                    job_id,
                    config,
                    split_ests(elastic_job(job), config),
                    tuple(j for j in combo if j != job_id),
                    "shared" if len(combo) > 1 else "",
                )
        return out

    def _lasted(self, since: float, now: float, period: float) -> bool:
        """Whether the span from `since` to `now` has lasted `period`, to the nearest round
        (within half a round: at 57 s restarts the period is 456 s, so 60 s rounds reach it
        every 8th round and 360 s rounds every one)."""
        return now - since + self.mechanism.round_seconds / 2 >= period

    def _shares(self, now: float, period: float) -> bool:
        """Whether this round re-shares the devices: the first, the first after a worker
        change, and then the round nearest the end of each share period."""
        if self._shared_at is not None and not self._lasted(self._shared_at, now, period):
            return False
        self._shared_at = now
        return True

    def _pinned(self, snapshot: Snapshot, share: bool, period: float) -> dict[Combo, str]:
        """The running combinations that keep their type. Between shares, all of them; at a
        share, a job that ends before the next one (its flip would buy less than a restart)
        and those within their residency: Gavel's priorities would otherwise swap a job out
        the round after it paid to start. A waiting job that never ran is served as Gavel
        serves it: the residencies that have lasted a share period lapse for it (all of them
        without the rule), while a job placed since the last share keeps its devices for a
        period, as a 360 s round keeps them for the round."""
        out: dict[Combo, str] = {}
        lapse = snapshot.newcomer_waits
        for job in snapshot.jobs:
            combo = self._last.get(job.job_id)
            if combo is None or not job.current:
                continue
            kind = job.current[0][0]
            rate = job.throughputs.get(kind, 0.0)
            if not share or (rate > 0 and job.steps_remaining / rate < period):
                keep = True
            elif lapse and self._lasted(job.placed_at, snapshot.now, period):
                keep = False
            else:
                keep = self.restart.resident(
                    job.placed_at, snapshot.now, job.restart_seconds, self.mechanism.round_seconds
                )
            if keep:
                out[combo] = kind
        return out

    def _view(self, job: JobSnapshot, snapshot: Snapshot) -> JobView:
        old = self.mechanism.jobs.get(job.job_id)
        throughputs = {
            t: job.throughputs.get(t, 0.0) if t in job.types else 0.0 for t in snapshot.capacity
        }
        # A pair's rates live in the older job's view: a view kept after a newcomer arrived
        # would hide every pair with it from packed policies, so it is kept only while they
        # are unchanged too.
        if old is not None and old.throughputs == throughputs and old.colocated == job.colocated:
            old.steps_remaining = job.steps_remaining  # what X reads when recomputed
            return old
        return JobView(
            job_id=job.job_id,
            scale_factor=max(job.max_devices, 1),
            throughputs=throughputs,
            steps_remaining=job.steps_remaining,
            arrival_time=job.arrival_time,
            priority_weight=job.priority_weight,
            deadline=job.deadline,
            entity=job.entity,
            colocated=dict(job.colocated),
        )


@dataclass
class Greedy:
    """EasyScale's greedy allocator or YARN-CS, re-planned at every event."""

    policy: ElasticPolicy
    replans_on_events: bool = True
    decisions: int = field(default=0)

    @property
    def name(self) -> str:
        return self.policy.name

    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        models = [elastic_job(job) for job in snapshot.jobs]
        current = {job.job_id: dict(job.current) for job in snapshot.jobs if job.current}
        left = {
            job.job_id: Left(job.steps_remaining, job.restart_seconds, job.resize_seconds)
            for job in snapshot.jobs
            if job.current
        }
        decision = self.policy.allocate(models, snapshot.capacity, current, left)
        self.decisions += 1
        by_id = {m.job_id: m for m in models}
        out: dict[str, Target] = {}
        for job_id, devices in decision.items():
            config = config_of(devices)
            if config:
                out[job_id] = Target(job_id, config, split_ests(by_id[job_id], config))
        return out


GREEDY = ELASTIC_POLICIES  # easyscale, easyscale_homo, yarn_cs


def allocator_names() -> list[str]:
    """Every name `make_allocator` takes (Gavel objectives, with or without --elastic)."""
    return sorted([*policy_names(), *GREEDY])


def make_allocator(
    name: str,
    *,
    elastic: bool = False,
    round_seconds: float = 360.0,
    min_recompute_seconds: float = 0.0,
    recompute_in_background: bool = False,
    seed: int = 0,
    hysteresis: float = 0.1,
    preempt_exempt_seconds: float = 0.0,
    max_moves_per_round: int = 0,
    prices: Mapping[str, float] | None = None,
    entity_weights: Mapping[str, float] | None = None,
    entity_policies: Mapping[str, EntityPolicy] | None = None,
    restart: RestartCost | None = None,
    las: LasShares | None = None,
    field_name: str = "policy",
) -> Allocator:
    """The allocator called `name`: a greedy elastic allocator, a Gavel objective in rounds
    (rigid), or with `elastic` the objective over elastic configurations. ValidationError
    (naming `field_name`) for an unknown name or an objective without an elastic form.
    `restart`: how moves are weighed against their restarts (None: moves are free). `las`:
    how an elastic LAS objective divides the devices (None: its class defaults)."""
    if name in GREEDY:
        return Greedy(make_elastic_policy(name, restart))
    policy = make_policy(name, seed=seed, field=field_name)
    if las is not None and isinstance(policy, MaxMinFairness):
        policy.shares = las
    if elastic:
        why = elastic_refusal(name)
        if why is not None:
            forms = sorted(n for n in policy_names() if elastic_refusal(n) is None)
            raise ValidationError(field_name, f"{why}; elastic objectives: {', '.join(forms)}")
        return ElasticRounds(
            policy,
            round_seconds=round_seconds,
            min_recompute_seconds=min_recompute_seconds,
            hysteresis=hysteresis,
            preempt_exempt_seconds=preempt_exempt_seconds,
            max_moves_per_round=max_moves_per_round,
            in_background=recompute_in_background,
            prices=dict(prices or {}),
            entity_weights=dict(entity_weights or {}),
            entity_policies=dict(entity_policies or {}),
            seed=seed,
            restart=restart or RestartCost.off(),
        )
    return GavelRounds(
        RoundScheduler(
            policy,
            round_seconds=round_seconds,
            min_recompute_seconds=min_recompute_seconds,
            seed=seed,
            entity_weights=entity_weights,
            entity_policies=entity_policies,
            costs=prices,
        ),
        restart,
    )
