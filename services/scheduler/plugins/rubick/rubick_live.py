"""Rubick's policy (Algorithm 1, gearshift.scheduler.plugins.rubick.rubick_policy) live in the
daemon: each
job's execution plan is chosen from the Brain's fitted model, not only its devices.

- Models: per job, Rubick's Eq. 1 fitted by the Brain (FitModel) on the runs it holds for
  the job, else for its model key (the spec's model_type). Asked outside the scheduler's
  lock, kept, asked again every `refresh_seconds` (what the Brain learns reaches running
  jobs) and every `retry_seconds` while the job has no fit of its own (a profiling run
  may store its runs at any time), as the burst-parallel plans are
  (gearshift.scheduler.round.estimates). Kept by fits.FitBook, which Rubick's plan choice
  beside another objective (plan_choice.py) shares.
- Plans: only what the runtime executes (gearshift.common.rubick.perf.Runtime): d devices
  with ESTs / d on each (gradient accumulation in EST terms; d divides the ESTs, within the
  job's min/max devices), gradient checkpointing where the spec allows it, optimizer
  offload (ZeRO-Offload) where it allows it and the devices are GPUs. Threads per process
  are kept as they are (Eq. 1 has no term for intra-op threads). Never TP, PP or ZeRO-DP.
- Request (Algorithm 1's input): the job's current plan (its default before its first
  start) on its max_devices (at most the live devices: a job never waits for devices that
  do not exist), ESTs / devices per device, 1 CPU core per device; guaranteed when its
  service class is GUARANTEED and its tenant has a quota. Algorithm 1 counts a tenant's
  quota in GPUs: the tenants file's devices summed over the types.
- Environment: the bandwidths the job was fitted with; GPU memory = the smallest device
  memory among live workers (a device group's registered memory, else its worker's memory
  over its devices - a CPU slot's share), else the fit's; GPUs per node = the most devices
  on one live worker.
- A job without a fit runs its own plan on its request (rubick_n's semantics:
  Runtime.fixed_ms), and a log line says its model is not fitted yet (once per job).
- Profiling: a job the Brain holds no fit of its own for (fewer than 7 runs) is profiled
  at its first placement (`wants_profile`: StartTaskRequest.profile_rubick, its rank 0
  runs gearshift.worker.profiling.rubick_run and stores the runs); its own fit is used
  from the round after it arrives. Which model a job's plans come from (its own fit on N
  configurations, its model key's, none) is a note (`model_note`) the daemon records as
  an event whenever it changes.
- Types: Algorithm 1 keeps a job on nodes of one type among those it allows; its fitted
  model prices every type alike (one fit per job, not per type, and GPU memory the
  smallest of any live worker's).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gearshift.common.rubick.perf import ModelPerf, PerfSource
from gearshift.common.rubick.request import Request
from gearshift.scheduler.plugins.rubick.fits import (
    FitBook,
    Fitted,
    JobFacts,
    brain_fits,
    model_note,
    model_perf,
    original_plan,
    wants_profile,
)
from gearshift.scheduler.plugins.rubick.guarantees import Admission
from gearshift.scheduler.plugins.rubick.rubick_policy import VARIANTS, RubickAdmission, RubickPolicy
from gearshift.scheduler.plugins.rubick.tenants import Quotas
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.ests import elastic_job, split_ests
from gearshift.scheduler.state.records import JobRecord, WorkerRecord
from gearshift.scheduler.types import Device, JobSnapshot, Snapshot, Target

log = logging.getLogger("gearshift.scheduler.rubick")
LIVE_VARIANTS = tuple(sorted(VARIANTS))


@dataclass(frozen=True)
class Shipment:
    """What a decision process's copy needs of the scheduler's (LiveRubick.shipment): the
    quotas, and the facts, fits and device memory the last refresh kept."""

    quotas: Quotas
    facts: Mapping[str, JobFacts]
    fits: Mapping[str, Fitted]
    memory_gb: float


def _gpus_per_node(devices: Sequence[Device]) -> int:
    per: dict[str, int] = {}
    for d in devices:
        per[d.worker_id] = per.get(d.worker_id, 0) + 1
    return max(per.values(), default=1)


@dataclass
class LiveRubick:
    """The `rubick` allocate plugin of the daemon; see the module docstring. `fit_job` and
    `fit_key` ask for the fitted model of a job and of a model key (brain_fits: the
    Brain's FitModel)."""

    fit_job: Callable[[str], Fitted | None]
    fit_key: Callable[[str], Fitted | None] = lambda key: None
    variant: str = "rubick"
    quotas: Callable[[], Quotas] = Quotas
    refresh_seconds: float = 60.0
    retry_seconds: float = 5.0
    replans_on_events: bool = True
    policy: RubickPolicy = field(init=False)
    fits: FitBook = field(init=False)
    _told: set[str] = field(default_factory=set)
    _models: dict[str, ModelPerf] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.policy = RubickPolicy(PerfSource({}), self.variant)
        self.fits = FitBook(self.fit_job, self.fit_key, self.refresh_seconds, self.retry_seconds)

    @property
    def name(self) -> str:
        return self.policy.name

    def refresh(
        self, facts: Sequence[JobFacts], workers: Sequence[WorkerRecord], now: float
    ) -> None:
        """Keep the jobs' facts, and ask the Brain for the fits that are due (RPCs)."""
        self.fits.refresh(facts, workers, now)

    def fitted(self, job_id: str) -> Fitted | None:
        return self.fits.fitted(job_id)

    def admissions(self) -> dict[str, Admission]:
        """The last decision's guaranteed jobs within quota: devices, plan, predicted speed
        and the best-effort jobs shrunk or preempted for them (`gearshift tenants`)."""
        return {
            j: Admission(a.accelerator_type, a.gpus, a)
            for j, a in dict(self.policy.admitted).items()
        }

    def prepare(
        self, jobs: Sequence[JobRecord], workers: Sequence[WorkerRecord]
    ) -> Callable[[float], None]:
        """The round's hook (round/hooks.py, `LearnsModels`): the jobs' facts copied under
        the scheduler's lock, and the refresh (Brain RPCs) to run outside it."""
        facts = [JobFacts.of(j) for j in jobs]
        kept = list(workers)
        return lambda now: self.refresh(facts, kept, now)

    def wants_profile(self, job_id: str) -> bool:
        """Whether the job's start should run Rubick's profiling run (see wants_profile)."""
        return wants_profile(self.fitted(job_id), self.variant)

    def new_notes(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The model notes of these jobs that changed since last asked (their events)."""
        return self.fits.new_notes(job_ids, lambda fit: model_note(fit, self.variant))

    # KeepsDecisionState (round/hooks.py): the scheduler's copy refreshes (the Brain's
    # fits, outside its lock) and ships; a decision process's copy, with no Brain of its
    # own, decides from what it is shipped and says back its admissions.
    def shipment(self) -> Shipment:
        facts, fits, memory = self.fits.view()
        return Shipment(self.quotas(), facts, fits, memory)

    def take(self, shipment: object) -> None:
        assert isinstance(shipment, Shipment)
        self.quotas = lambda: shipment.quotas
        self.fits.take(shipment.facts, shipment.fits, shipment.memory_gb)

    def outcome(self) -> dict[str, RubickAdmission]:
        return dict(self.policy.admitted)

    def told(self, outcome: object) -> None:
        assert isinstance(outcome, dict)
        self.policy.admitted = outcome

    # The allocate stage ------------------------------------------------------------------
    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        facts, fits, memory = self.fits.view()
        self._told &= facts.keys()  # ended jobs
        gpus = any(d.worker_type != "cpu" for d in snapshot.devices)
        quotas = self.quotas().by_tenant
        models: dict[str, ModelPerf] = {}
        jobs: list[JobSnapshot] = []
        for snap in snapshot.jobs:
            f = facts.get(snap.job_id)
            if f is None:  # not seen by refresh yet: next round
                continue
            fit = fits.get(snap.job_id)
            if fit is None and snap.job_id not in self._told:
                self._told.add(snap.job_id)
                log.info(
                    "rubick: model not fitted yet; the job runs its own plan on its request",
                    extra={"job_id": snap.job_id},
                )
            models[snap.job_id] = model_perf(f, fit, memory, gpus)
            guaranteed = snap.guaranteed and sum(quotas.get(snap.entity, {}).values()) > 0
            devices = max(1, min(snap.max_devices, len(snapshot.devices)))  # what exists
            request = Request(snap.job_id, original_plan(f, devices), devices, 1, guaranteed)
            jobs.append(dataclasses.replace(snap, request=request))
        policy = self.policy
        if models != self._models:  # a new source: its cached curves and plans are stale
            policy.perf, self._models = PerfSource(models), models
        policy.gpus_per_node = _gpus_per_node(snapshot.devices)
        policy.cpus_per_node = policy.gpus_per_node  # one core per device: the request's
        policy.quotas = {t: sum(q.values()) for t, q in quotas.items()}
        targets = policy.allocate(dataclasses.replace(snapshot, jobs=tuple(jobs)))
        by_id = {j.job_id: j for j in jobs}
        return {j: self._runtime_target(by_id[j], t, facts[j]) for j, t in targets.items()}

    @staticmethod
    def _runtime_target(job: JobSnapshot, target: Target, facts: JobFacts) -> Target:
        """ESTs per device from the plan's GA (the policy's targets say one), default cores."""
        plan = target.plan
        if plan is not None and plan.dp * plan.ga == facts.num_ests:
            ests: Mapping[str, tuple[int, ...]] = {
                kind: (plan.ga,) * n for kind, n in target.devices
            }
        else:
            ests = split_ests(elastic_job(job), target.devices)
        return dataclasses.replace(target, ests=ests, cpus_per_device=0)


def make_live_rubick(
    name: str, brain: BrainAdvisor, quotas: Callable[[], Quotas] | None = None
) -> LiveRubick:
    """The daemon's `rubick`, `rubick_e`, `rubick_r` or `rubick_n` allocator."""
    if name not in VARIANTS:
        raise ValueError(f"unknown Rubick variant {name!r}; one of {', '.join(LIVE_VARIANTS)}")
    of_job, of_key = brain_fits(brain)
    return LiveRubick(of_job, of_key, name, quotas or Quotas)
