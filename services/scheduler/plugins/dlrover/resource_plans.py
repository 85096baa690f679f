"""DLRover's resource plans applied to live jobs: cores, memory and loader processes per
training process, and the devices a best-effort job starts on (its history's).

The Brain computes the plans (PlanResources); this module decides when to ask and
whether a changed plan is worth a restart, as plain functions over plain data, and
keeps each job's plan (`ResourcePlans`, used by the round). The loop:

- a job without a plan (new, or the scheduler restarted) is asked its INITIAL plan
  before its first placement: from the history of similar finished jobs (same model
  type and dataset, else model type), or the defaults when there is none; the devices
  it names only start the job (history_caps.py says when they give way);
- a running job is asked again every `plan_interval` seconds at the ADJUST stage (the
  Brain measures the job's use from its own runtime samples); a plan whose resources
  differ is applied at the next round through the checkpoint/restart path when
  `restart_pays` says so, else kept for the job's next (re)start, whenever that is;
- every applied plan is a PLAN event of the job, and the Brain records every plan it
  issues with the job's history.

A Brain that is down or does not answer costs a log line: the job runs on the
defaults (its worker's share of cores and memory, no loader processes), never fails.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from gearshift.scheduler.plugins.dlrover.plan_book import PlanBook
from gearshift.scheduler.round.placement import most_devices
from gearshift.v1 import brain_pb2, common_pb2

if TYPE_CHECKING:
    from gearshift.scheduler.state.records import JobRecord
    from gearshift.scheduler.state.state import SchedulerState

log = logging.getLogger("gearshift.scheduler.plans")

T = TypeVar("T")
R = TypeVar("R")
GIB = 1024**3
MIB = 1024**2
MAX_SLOWDOWN = 0.1  # a plan predicted this much slower is never worth a restart

_SOURCES = {
    brain_pb2.PLAN_SOURCE_HISTORY: "history",
    brain_pb2.PLAN_SOURCE_DEFAULT: "defaults",
    brain_pb2.PLAN_SOURCE_OPTIMIZER: "optimizer",
}
_STAGES = {
    brain_pb2.PLAN_STAGE_INITIAL: "initial",
    brain_pb2.PLAN_STAGE_SAMPLE: "sample",
    brain_pb2.PLAN_STAGE_OPTIMIZE: "optimize",
    brain_pb2.PLAN_STAGE_ADJUST: "adjust",
}


@dataclass(frozen=True)
class ProcessPlan:
    """What each of a job's training processes runs with; 0 means the default (its
    worker's share of cores / memory; no bound on devices). `devices` bounds a
    best-effort job until its first ADJUST, or until devices idle while no job waits for
    them lift it (history_caps.py): where similar jobs ended."""

    plan_id: str
    stage: str
    source: str
    devices: int
    cpu_cores: int
    memory_bytes: int
    loader_procs: int
    predicted_steps_per_second: float = 0.0
    reason: str = ""

    def same_resources(self, other: ProcessPlan) -> bool:
        return (self.cpu_cores, self.memory_bytes, self.loader_procs) == (
            other.cpu_cores,
            other.memory_bytes,
            other.loader_procs,
        )


def from_message(plan: brain_pb2.ResourcePlan) -> ProcessPlan:
    """The worker group of a Brain plan as per-process resources (whole cores, rounded up;
    memory to the MiB). Only a history plan bounds the devices: its worker count is what
    similar data-parallel jobs ran on (the Brain reads it from their samples); the
    defaults' count is a sampling guess and an optimizer's a core count, so those leave
    the devices to the allocator, as does the job's own first ADJUST (`ResourcePlans`).
    The defaults' memory is left to the worker's share."""
    workers = plan.workers
    source = _SOURCES.get(plan.source, "optimizer")
    return ProcessPlan(
        plan_id=plan.plan_id,
        stage=_STAGES.get(plan.stage, "adjust"),
        source=source,
        devices=max(workers.count, 0) if source == "history" and plan.ps.count == 0 else 0,
        cpu_cores=max(math.ceil(workers.cpu_cores - 1e-9), 0),
        # The defaults' memory is a sampling guess: the worker's share serves better.
        memory_bytes=math.ceil(workers.memory_bytes / MIB) * MIB
        if workers.memory_bytes and source != "defaults"
        else 0,
        loader_procs=max(workers.loader_procs, 0),
        predicted_steps_per_second=plan.predicted_steps_per_second,
        reason=plan.reason,
    )


def to_message(plan: ProcessPlan, processes: int) -> brain_pb2.ResourcePlan:
    """A data-parallel job's current plan for an ADJUST request (no PS)."""
    return brain_pb2.ResourcePlan(
        plan_id=plan.plan_id,
        stage=brain_pb2.PLAN_STAGE_ADJUST,
        workers=brain_pb2.NodeGroupPlan(
            count=max(processes, 1),
            cpu_cores=float(max(plan.cpu_cores, 1)),
            memory_bytes=plan.memory_bytes,
            loader_procs=plan.loader_procs,
        ),
        ps=brain_pb2.NodeGroupPlan(),
        source=brain_pb2.PLAN_SOURCE_OPTIMIZER,
        predicted_steps_per_second=plan.predicted_steps_per_second,
    )


def _bytes(value: int) -> str:
    return f"{value / GIB:.2g} GiB" if value >= GIB else f"{value / MIB:.0f} MiB"


def describe(plan: ProcessPlan) -> str:
    """The PLAN event's text: stage, source, the resources per process, and why."""
    parts = [
        f"{plan.cpu_cores} core{'' if plan.cpu_cores == 1 else 's'}"
        if plan.cpu_cores
        else "the worker's share of cores",
        _bytes(plan.memory_bytes) if plan.memory_bytes else "the worker's share of memory",
        f"{plan.loader_procs} loader proc{'' if plan.loader_procs == 1 else 's'}",
    ]
    devices = f"; starting on at most {plan.devices} device(s)" if plan.devices else ""
    return f"{plan.stage} plan from {plan.source}: {', '.join(parts)} per process{devices}" + (
        f" ({plan.reason})" if plan.reason else ""
    )


@dataclass(frozen=True)
class RestartDecision:
    """Whether a changed plan is worth restarting the job now, and the figures why."""

    apply: bool
    why: str


def restart_pays(
    current: ProcessPlan,
    proposed: ProcessPlan,
    *,
    processes: int,
    steps_left: int,
    steps_per_second: float,
    restart_seconds: float,
    max_slowdown: float = MAX_SLOWDOWN,
) -> RestartDecision:
    """The rule: restart for a new plan only when it saves more core-seconds over the rest
    of the job than the restart costs, and is not predicted slower by more than
    `max_slowdown`.

    Before: cores x processes x t_left at the measured rate. After: the new cores over the
    rest at the predicted rate (the measured one when none), plus the current cores held
    idle for `restart_seconds`. A plan that differs only in memory or loader processes
    saves no cores: it waits for the job's next restart.
    """
    if proposed.same_resources(current):
        return RestartDecision(False, "same resources")
    if steps_per_second <= 0 or steps_left <= 0:
        return RestartDecision(False, "no measured rate or no steps left")
    rate = proposed.predicted_steps_per_second or steps_per_second
    if rate < steps_per_second * (1 - max_slowdown):
        return RestartDecision(
            False, f"predicted {rate:.3g} steps/s, slower than {steps_per_second:.3g}"
        )
    now_cores = max(current.cpu_cores, 1) * processes
    new_cores = max(proposed.cpu_cores, 1) * processes
    t_left = steps_left / steps_per_second
    before = now_cores * t_left
    after = new_cores * steps_left / rate + now_cores * restart_seconds
    figures = (
        f"{before:.0f} core-s as is, {after:.0f} with the plan and a {restart_seconds:.0f} s "
        f"restart ({steps_left} steps left at {steps_per_second:.3g} steps/s)"
    )
    return RestartDecision(after < before, figures)


@dataclass(frozen=True)
class PlanAsk:
    """What a round knows of a job when it may ask for its plan (copied under the lock)."""

    job_id: str
    running: bool
    processes: int
    steps_left: int
    steps_per_second: float
    restart_seconds: float
    cpu_max_per_process: float
    max_devices: int
    spec: common_pb2.JobSpec
    submitted_at: float


def plan_asks_of(
    state: SchedulerState, jobs: Sequence[JobRecord], restart_seconds: Callable[[str], float]
) -> list[PlanAsk]:
    """What the resource plans need of the jobs (under the scheduler's lock): the most cores
    a process can get is the largest per-device share of a live worker."""
    shares = [
        w.cpu_cores // max(sum(g.count for g in w.devices), 1)
        for w in state.workers.values()
        if w.alive
    ]
    per = float(max(shares, default=0))
    return [
        PlanAsk(
            job_id=job.job_id,
            running=job.state == common_pb2.JOB_STATE_RUNNING,
            processes=len(job.placement.processes),
            steps_left=max(job.progress.total_steps - job.progress.step, 0),
            steps_per_second=0.0,
            restart_seconds=restart_seconds(job.job_id),
            cpu_max_per_process=per,
            max_devices=most_devices(job.spec),
            spec=job.spec,
            submitted_at=job.submitted_at,
        )
        for job in jobs
    ]


def due(
    asks: Sequence[PlanAsk],
    plans: dict[str, ProcessPlan],
    asked_at: dict[str, float],
    now: float,
    interval: float,
) -> tuple[list[PlanAsk], list[PlanAsk]]:
    """(jobs to ask their initial plan, running jobs to ask an adjusted one): a job without
    a plan is due at once; a running one every `interval` seconds (0: never)."""
    initial = [a for a in asks if a.job_id not in plans]
    adjust = [
        a
        for a in asks
        if a.running
        and a.job_id in plans
        and interval > 0
        and now - asked_at.get(a.job_id, now) >= interval
    ]
    return initial, adjust


#: BrainAdvisor.plan_resources: (request, the job's spec, when it was submitted) -> plan.
Asker = Callable[
    [brain_pb2.PlanResourcesRequest, common_pb2.JobSpec, float], "brain_pb2.ResourcePlan | None"
]


class ResourcePlans(PlanBook[ProcessPlan]):
    """Each job's plan, the changed plans waiting for a restart, and the asking."""

    def __init__(
        self,
        ask: Asker,
        interval: float,
        clock: Callable[[], float],
        pool: Executor | None = None,
    ) -> None:
        super().__init__(clock)
        self._ask = ask
        self._pool = pool  # the asks of one round run side by side (a slow Brain, once)
        self.interval = interval
        self._restart: set[str] = set()  # changed and worth restarting for (restart_pays)

    def restart_wanted(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._restart

    def _on_start(self, job_id: str) -> None:
        self._restart.discard(job_id)

    def _on_forget(self, job_id: str) -> None:
        self._restart.discard(job_id)

    def refresh(self, asks: Sequence[PlanAsk]) -> None:
        """Ask the Brain what is due (outside the scheduler's lock)."""
        now = self.clock()
        with self._lock:
            initial, adjust = due(asks, self._plans, self._asked_at, now, self.interval)
            for a in initial + adjust:
                self._asked_at[a.job_id] = now
        replies = self._map(
            lambda a: self._ask(
                self._request(a, brain_pb2.PLAN_STAGE_INITIAL, None), a.spec, a.submitted_at
            ),
            initial,
        )
        for a, reply in zip(initial, replies, strict=True):
            plan = (
                from_message(reply)
                if reply is not None
                else ProcessPlan("", "initial", "defaults", 0, 0, 0, 0, reason="Brain unavailable")
            )
            with self._lock:
                self._plans.setdefault(a.job_id, plan)
        with self._lock:
            currents = [self._plans.get(a.job_id) for a in adjust]
        replies = self._map(
            lambda pair: (
                self._ask(
                    self._request(pair[0], brain_pb2.PLAN_STAGE_ADJUST, pair[1]),
                    pair[0].spec,
                    pair[0].submitted_at,
                )
                if pair[1] is not None
                else None
            ),
            list(zip(adjust, currents, strict=True)),
        )
        for a, asked_with, reply in zip(adjust, currents, replies, strict=True):
            if asked_with is None or reply is None:
                continue
            current = self._uncap(a.job_id, asked_with)
            proposed = from_message(reply)
            decision = restart_pays(
                current,
                proposed,
                processes=a.processes,
                steps_left=a.steps_left,
                steps_per_second=a.steps_per_second or proposed.predicted_steps_per_second,
                restart_seconds=a.restart_seconds,
            )
            log.info(
                "adjusted plan",
                extra={
                    "job_id": a.job_id,
                    "restart": decision.apply,
                    "why": decision.why,
                    "plan": describe(proposed),
                },
            )
            if proposed.same_resources(current):
                continue
            with self._lock:
                if decision.apply:
                    proposed = replace(proposed, reason=f"{proposed.reason}; {decision.why}")
                    self._restart.add(a.job_id)
                self._next[a.job_id] = proposed

    def caps(self) -> dict[str, int]:
        """The jobs whose next start a history plan caps: job id -> its devices."""
        with self._lock:
            plans = {j: self._next.get(j) or p for j, p in self._plans.items()}
        return {j: p.devices for j, p in plans.items() if p.devices}

    def lift_cap(self, job_id: str) -> None:
        """The job's devices are the allocator's from now on (history_caps.caps_to_lift)."""
        with self._lock:
            plan = self._plans.get(job_id)
        if plan is not None:
            self._uncap(job_id, plan)

    def _uncap(self, job_id: str, plan: ProcessPlan) -> ProcessPlan:
        """From its first ADJUST on, a job's own measurements and the allocator decide its
        devices: the history's bound is dropped (without a new PLAN event)."""
        if not plan.devices:
            return plan
        uncapped = replace(plan, devices=0)
        with self._lock:
            if self._plans.get(job_id) is plan:
                self._plans[job_id] = uncapped
            if self._announced.get(job_id) is plan:
                self._announced[job_id] = uncapped
        return uncapped

    def _map(self, call: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self._pool is None or len(items) < 2:
            return [call(i) for i in items]
        return list(self._pool.map(call, items))

    @staticmethod
    def _request(
        ask: PlanAsk, stage: int, current: ProcessPlan | None
    ) -> brain_pb2.PlanResourcesRequest:
        per = max(ask.cpu_max_per_process, 1.0)
        request = brain_pb2.PlanResourcesRequest(
            job_id=ask.job_id,
            stage=stage,  # type: ignore[arg-type]
            cpu_total=per * max(ask.max_devices, 1),
            cpu_max_per_node=per,
        )
        if current is not None:
            request.current.CopyFrom(to_message(current, ask.processes))
        return request
