"""DLRover's plans behind the round's hooks (round/hooks.py: `PlansResources` for the
round, `PlansProcesses` for the task control): data-parallel jobs' resource plans
(resource_plans.py, with history_caps.py) and parameter-server jobs' plans (ps_jobs.py).

The plans point of the profile (plugins/registry.py) builds it: `dlrover` with both,
`none` with the parameter-server plans alone. A PS job's launcher needs its counts
whatever the profile says (the Brain's plan when there is a Brain, else the spec's, or
what a user pins), as before the round had hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import TYPE_CHECKING

from gearshift.common.jobspec import is_ps_job
from gearshift.scheduler.plugins.dlrover import plan_book, ps_jobs
from gearshift.scheduler.plugins.dlrover.history_caps import caps_to_lift
from gearshift.scheduler.plugins.dlrover.ps_jobs import PsPlan, PsPlans, ps_asks_of
from gearshift.scheduler.plugins.dlrover.resource_plans import (
    ProcessPlan,
    ResourcePlans,
    describe,
    plan_asks_of,
)
from gearshift.scheduler.round.hooks import CapView, StartPlan
from gearshift.v1 import common_pb2

if TYPE_CHECKING:
    from gearshift.scheduler.round.brain import BrainAdvisor
    from gearshift.scheduler.state.records import JobRecord
    from gearshift.scheduler.state.state import SchedulerSettings, SchedulerState


class DlroverPlans:
    """Both hooks over DLRover's two plan books; `resources` None: no data-parallel plans
    (no Brain, or profile.plans none), every such job on its worker's share."""

    def __init__(self, resources: ResourcePlans | None, ps: PsPlans) -> None:
        self.resources = resources
        self.ps = ps

    # PlansResources ------------------------------------------------------------------------
    def prepare(
        self,
        state: SchedulerState,
        jobs: Sequence[JobRecord],
        restart_seconds: Callable[[str], float],
    ) -> Callable[[], None]:
        resources = self.resources
        asks = (
            plan_asks_of(state, [j for j in jobs if not is_ps_job(j.spec)], restart_seconds)
            if resources is not None
            else []
        )
        ps_asks = ps_asks_of(state, jobs)

        def refresh() -> None:
            if resources is not None:
                resources.refresh(asks)
            self.ps.refresh(ps_asks)

        return refresh

    def device_cap(self, job_id: str) -> int:
        plan = self.resources.plan(job_id) if self.resources is not None else None
        return plan.devices if plan is not None else 0

    def caps(self) -> Mapping[str, int]:
        return self.resources.caps() if self.resources is not None else {}

    def lift_caps(self, jobs: Sequence[CapView], idle: Mapping[str, int]) -> list[str]:
        if self.resources is None:
            return []
        lifted = caps_to_lift(jobs, idle)
        for job_id in lifted:
            self.resources.lift_cap(job_id)
        return lifted

    def restart_reason(self, job_id: str) -> str | None:
        if self.resources is not None and self.resources.restart_wanted(job_id):
            return "restarting with a new resource plan"
        if self.ps.restart_wanted(job_id):
            return "restarting with a new resource plan (PS and worker counts)"
        return None

    def started(self, job_id: str) -> list[str]:
        out = []
        applied = self.resources.started(job_id) if self.resources is not None else None
        if applied is not None:  # what it started with, after the start itself
            out.append(describe(applied))
        ps_applied = self.ps.started(job_id)
        if ps_applied is not None:
            out.append(ps_jobs.describe(ps_applied))
        return out

    def recover(self, job: JobRecord) -> None:
        """The plans the job's row keeps (migration 0009): its running placement is not
        planned afresh (nor restarted for them), a pin holds."""
        running = job.state == common_pb2.JOB_STATE_RUNNING
        resources = self.resources
        if resources is not None and (plan := plan_book.load(ProcessPlan, job.process_plan)):
            # A running job's devices are the allocator's from now on (as after an ADJUST).
            resources.restore(job.job_id, replace(plan, devices=0) if running else plan)
        if job.ps_plan or job.ps_pin:
            self.ps.recover(
                job.job_id,
                plan_book.load(PsPlan, job.ps_plan),
                plan_book.load(PsPlan, job.ps_pin),
                running=running,
            )

    def forget(self, job_id: str) -> None:
        if self.resources is not None:
            self.resources.forget(job_id)
        self.ps.forget(job_id)

    # PlansProcesses ------------------------------------------------------------------------
    def start_plan(self, job: JobRecord) -> StartPlan:
        """A data-parallel job's process plan (cores, memory, loaders; none: the worker's
        share), or a PS job's processes (without a plan yet: the spec's counts, 1 core
        each); both kept in the job's row."""
        resources = self.resources.plan(job.job_id) if self.resources is not None else None
        ps = None
        if is_ps_job(job.spec):
            ps = self.ps.plan(job.job_id) or ps_jobs.fallback(job.spec, "no plan yet")
        return StartPlan(
            cpu_cores=resources.cpu_cores if resources else 0,
            memory_bytes=resources.memory_bytes if resources else 0,
            loader_procs=resources.loader_procs if resources else 0,
            ps=ps_jobs.to_task(ps) if ps is not None else None,
            ps_cores=ps.total_cores if ps is not None else 0.0,
            process_plan=plan_book.dump(resources),
            ps_plan=plan_book.dump(ps),
        )


def make_plans(
    settings: SchedulerSettings,
    brain: BrainAdvisor,
    clock: Callable[[], float],
    pool: Executor | None = None,
    *,
    resources: bool,
) -> DlroverPlans:
    """The plans point's stage: data-parallel plans when `resources` and there is a Brain;
    PS plans always (asking the Brain when there is one)."""
    return DlroverPlans(
        ResourcePlans(brain.plan_resources, settings.plan_interval, clock, pool)
        if resources and brain.address
        else None,
        PsPlans(brain.plan_resources if brain.address else None, settings.plan_interval, clock),
    )
