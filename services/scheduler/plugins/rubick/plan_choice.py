"""Rubick's plan choice beside another objective (`profile.executionPlans: {name: rubick}`):
once the objective and the place stage have chosen a job's devices, the execution plan on
them that the job's fitted model (Rubick's Eq. 1, the Brain's fit: fits.py, as the `rubick`
allocator reads it) predicts fastest, among the plans that fit the memory of its devices (the
smallest on the workers it was placed on).

- Which jobs: those whose spec allows a plan dimension (gradient checkpointing, or
  optimizer offload on GPUs). Every other job keeps its own plan, untouched; so does a job
  without a fit yet (its events say so).
- Which plans: the runtime's (fits.py): data parallel over the devices the objective gave,
  GA = the ESTs per device it gave (the most on one device where they differ: the slowest
  process sets the step), GC on or off where the spec allows it, offload on or off where
  it allows it and the devices are GPUs; never TP, PP or ZeRO-DP. The devices and ESTs stay
  the objective's: only the plan on them is chosen.
- Restarts: a job started or moved this round takes the fastest plan (it starts anyway); a
  running job kept on its devices restarts for another plan only when the model predicts
  it `min_gain` faster than the plan it runs. A plan it runs does fit, whatever the model's
  memory estimate says, so that estimate alone never restarts it.
- Profiling: a job that allows a plan dimension and has no fit of its own runs Rubick's
  profiling run at its first placement (`profile`), as under the `rubick` allocator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from gearshift.common.rubick.perf import Choice, ModelPerf, PerfSource
from gearshift.common.rubick.plans import Plan, Zero
from gearshift.scheduler.plugins.rubick.fits import (
    FitBook,
    Fitted,
    JobFacts,
    brain_fits,
    model_note,
    model_perf,
    wants_profile,
)
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.round.reconcile import same_assignment
from gearshift.scheduler.state.records import JobRecord, WorkerRecord
from gearshift.scheduler.types import Device, Target

CPUS_PER_DEVICE = 1  # Eq. 1 reads cores only under offload; the live default is one


def allows_plans(facts: JobFacts, *, gpus: bool) -> bool:
    """Whether the job's spec lets it run another plan on these devices."""
    return facts.gc or (facts.offload and gpus)


def shape_of(assignment: Sequence[tuple[Device, int]]) -> tuple[tuple[int, ...], int]:
    """The devices per worker (most first) and the most ESTs on one device."""
    per: dict[str, int] = {}
    most = 1
    for device, ests in assignment:
        per[device.worker_id] = per.get(device.worker_id, 0) + 1
        most = max(most, ests)
    return tuple(sorted(per.values(), reverse=True)), most


def running_plan(facts: JobFacts, devices: int, ga: int) -> Plan:
    """The plan the job runs now, on `devices` devices with `ga` ESTs on each."""
    return Plan(
        dp=devices,
        ga=ga,
        gc=facts.plan.gradient_checkpointing,
        zero=Zero.OFFLOAD if facts.plan.offload_optimizer else Zero.NONE,
    )


def plan_choices(facts: JobFacts, devices: int, ga: int, *, gpus: bool) -> list[Plan]:
    """The plans the runtime can run for the job on `devices` devices with `ga` ESTs each:
    GC and offload each as the spec allows, else as the job runs now."""
    now = running_plan(facts, devices, ga)
    gcs = (False, True) if facts.gc else (now.gc,)
    zeros = (Zero.NONE, Zero.OFFLOAD) if facts.offload and gpus else (now.zero,)
    return [Plan(dp=devices, ga=ga, gc=gc, zero=z) for z in zeros for gc in gcs]


def fastest_plan(
    model: ModelPerf, facts: JobFacts, shape: tuple[int, ...], ga: int, *, gpus: bool
) -> Choice | None:
    """The plan the model predicts fastest on `shape` (devices per worker) among those that
    fit in memory; None when none does."""
    perf = PerfSource({facts.job_id: model})
    best: Choice | None = None
    for plan in plan_choices(facts, sum(shape), ga, gpus=gpus):
        ms = perf.iter_ms(facts.job_id, plan, shape, CPUS_PER_DEVICE)
        if ms is not None and ms > 0 and (best is None or ms < best.iter_ms):
            best = Choice(plan, ms)
    return best


def plan_for(
    model: ModelPerf,
    facts: JobFacts,
    assignment: Sequence[tuple[Device, int]],
    *,
    kept: bool,
    min_gain: float,
) -> Plan | None:
    """The plan the job should run on `assignment` (None: the one it has). `kept`: it runs
    there already, so another plan costs a restart (see the module docstring)."""
    gpus = any(d.worker_type != "cpu" for d, _ in assignment)
    if not assignment or not allows_plans(facts, gpus=gpus):
        return None
    shape, ga = shape_of(assignment)
    best = fastest_plan(model, facts, shape, ga, gpus=gpus)
    now = running_plan(facts, sum(shape), ga)
    if best is None or best.plan == now:
        return None
    if kept:
        ms = PerfSource({facts.job_id: model}).iter_ms(facts.job_id, now, shape, CPUS_PER_DEVICE)
        if ms is None or best.iter_ms * (1 + min_gain) > ms:
            return None
    return best.plan


def plan_note(fit: Fitted | None) -> str:
    """Which model a job's plans come from, for its events."""
    if fit is None:
        return "rubick plans: no model fitted yet; the job runs its own plan"
    return model_note(fit, "rubick")


@dataclass
class RubickPlans:
    """The `rubick` plugin of profile.executionPlans (round/hooks.py, `ChoosesPlans`); see
    the module docstring."""

    fits: FitBook
    min_gain: float = 0.05
    profile: bool = True
    # job -> (what its choice was made of, the choice): the same inputs, round after round,
    # need no pricing again (0.38 ms a job; 380 ms a round at 1,000 jobs, uncached)
    _chosen: dict[str, tuple[Hashable, Plan | None]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "rubick"

    def prepare(
        self, jobs: Sequence[JobRecord], workers: Sequence[WorkerRecord]
    ) -> Callable[[float], None]:
        """Under the scheduler's lock: the facts of the jobs that allow a plan dimension;
        the refresh it returns asks the Brain for their fits (outside the lock)."""
        facts = [f for f in (JobFacts.of(j) for j in jobs) if f.gc or f.offload]
        kept = list(workers)
        return lambda now: self.fits.refresh(facts, kept, now)

    def new_notes(self, job_ids: Sequence[str]) -> dict[str, str]:
        return self.fits.new_notes(job_ids, plan_note)

    def wants_profile(self, job_id: str) -> bool:
        """A job that allows a plan dimension and has no fit of its own: its first start
        runs Rubick's profiling run (when `profile`)."""
        known = self.fits.facts_of(job_id) is not None
        return self.profile and known and wants_profile(self.fits.fitted(job_id), "rubick")

    def choose(
        self,
        targets: Mapping[str, Target],
        desired: Mapping[str, Sequence[tuple[Device, int]]],
        current: Mapping[str, Sequence[tuple[Device, int]]],
    ) -> dict[str, Target]:
        """The targets with the plan of each job whose spec allows one (see plan_for)."""
        facts, fits, _ = self.fits.view()
        out = dict(targets)
        chosen, self._chosen = self._chosen, {}
        for job_id, assignment in desired.items():
            f, fit, target = facts.get(job_id), fits.get(job_id), targets.get(job_id)
            if f is None or fit is None or target is None or target.plan is not None:
                continue
            gpus = any(d.worker_type != "cpu" for d, _ in assignment)
            held = current.get(job_id)
            kept = held is not None and same_assignment(assignment, held)
            memory = self.fits.memory_of({d.worker_id for d, _ in assignment})
            runs = (f.plan.gradient_checkpointing, f.plan.offload_optimizer)
            key = (fit, memory, shape_of(assignment), gpus, kept, f.gc, f.offload, runs)
            hit = chosen.get(job_id)
            if hit is not None and hit[0] == key:
                plan = hit[1]
            else:
                model = model_perf(f, fit, memory, gpus)
                plan = plan_for(model, f, assignment, kept=kept, min_gain=self.min_gain)
            self._chosen[job_id] = (key, plan)
            if plan is not None:
                out[job_id] = dataclasses.replace(target, plan=plan)
        return out


def make_rubick_plans(brain: BrainAdvisor, *, min_gain: float, profile: bool) -> RubickPlans:
    """The daemon's plan choice, asking the Brain for its fits."""
    of_job, of_key = brain_fits(brain)
    return RubickPlans(FitBook(of_job, of_key), min_gain, profile)
