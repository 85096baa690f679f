"""Parameter-server jobs sized by the Brain (DLRover) and scaled by restarts.

A PS job (spec.parameter_server) is placed like a one-device job: one process, the PS
launcher, on one worker daemon (its file-store rendezvous needs one host), holding
cores = PS x PS cores + workers x worker cores of that worker, at most the cores of its
slot (the worker's cores per device; the launcher shares them when a plan asks more).
The Brain plans the counts and cores, DLRover's stages in turn:

- INITIAL before the first placement (history of similar jobs, else the sampling
  defaults); counts the spec fixes (parameter_server.ps / workers > 0) win;
- OPTIMIZE once the task measured ŵ and ŝ under its current plan (TaskStatus.ps_metrics
  through heartbeats): N_w, N_ps from Eq. 10-11 for the job's core budget;
- ADJUST every plan interval after that, with the measurements: a hot PS replaced by a
  larger one, idle PS CPU turned into workers.

Every plan is clamped to the spec's bounds (max_ps, max_workers) and the budget. A plan
whose counts or per-PS cores differ from the running one is applied at the next round
through stop (checkpoint) -> restart with the new counts: the launcher re-partitions
the embedding rows from the checkpoint. Each applied plan is a PLAN job event with the
Brain's reason. PS jobs are asynchronous: not bitwise reproducible.

A user (its own jobs) or an admin may set the counts instead (`ScaleJob`, `gearshift
scale JOB --ps 3 --workers 4`): `pinned` checks them against the spec's bounds and the
slot's cores, and the pinned plan replaces the Brain's, applied through the same
stop -> restart and announced as "set by <identity>: 3 PS x 4 workers", until cleared
(`--auto`), when the Brain's ADJUST stage takes the job from the pinned plan on.

Plain functions over plain data here, plus `PsPlans`, the per-job table the round uses.
A Brain that does not answer leaves the job on its plan (or the spec's counts, 1 core
each), never fails it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gearshift.common.errors import ValidationError
from gearshift.common.jobspec import is_ps_job, ps_defaults
from gearshift.scheduler.plugins.dlrover.plan_book import PlanBook
from gearshift.scheduler.plugins.dlrover.resource_plans import Asker
from gearshift.scheduler.round.process_resources import launcher_cores
from gearshift.v1 import brain_pb2, common_pb2

if TYPE_CHECKING:
    from gearshift.scheduler.state.records import JobRecord
    from gearshift.scheduler.state.state import SchedulerState

log = logging.getLogger("gearshift.scheduler.ps_jobs")

MIN_MEASURED_S = 2.0  # seconds of measured training before ŵ and ŝ count
_STAGES = {
    brain_pb2.PLAN_STAGE_INITIAL: "initial",
    brain_pb2.PLAN_STAGE_SAMPLE: "sample",
    brain_pb2.PLAN_STAGE_OPTIMIZE: "optimize",
    brain_pb2.PLAN_STAGE_ADJUST: "adjust",
}
_STAGE_ENUM = {name: value for value, name in _STAGES.items()}
_SOURCES = {
    brain_pb2.PLAN_SOURCE_HISTORY: "history",
    brain_pb2.PLAN_SOURCE_DEFAULT: "defaults",
    brain_pb2.PLAN_SOURCE_OPTIMIZER: "optimizer",
}


@dataclass(frozen=True)
class PsPlan:
    """PS and worker counts and cores of a PS job; `ps_cores_each` per PS (a replaced hot
    PS has more than `ps_cores`)."""

    ps: int
    workers: int
    ps_cores: float
    worker_cores: float
    ps_cores_each: tuple[float, ...] = ()
    stage: str = "initial"
    source: str = "defaults"
    plan_id: str = ""
    memory_bytes: int = 0  # per worker, from the Brain (shown; not enforced per process)
    predicted_steps_per_second: float = 0.0
    reason: str = ""

    @property
    def cores_each(self) -> tuple[float, ...]:
        return self.ps_cores_each or (self.ps_cores,) * self.ps

    @property
    def total_cores(self) -> float:
        return sum(self.cores_each) + self.workers * self.worker_cores

    def same_shape(self, other: PsPlan) -> bool:
        """The same processes and cores: nothing to restart for."""
        return (self.ps, self.workers, self.cores_each, self.worker_cores) == (
            other.ps,
            other.workers,
            other.cores_each,
            other.worker_cores,
        )


def _cores(value: float, budget: float) -> float:
    """Whole cores (at least 1, at most the budget); a Brain's 0 means 1."""
    return float(min(max(math.ceil(value - 1e-9), 1), max(math.floor(budget + 1e-9), 1)))


def from_message(
    plan: brain_pb2.ResourcePlan,
    spec: common_pb2.JobSpec,
    budget: float,
    current: PsPlan | None = None,
) -> PsPlan:
    """A Brain plan as a PsPlan within the spec's bounds and the core budget; the hot-PS
    replacements become per-PS cores (on top of the current plan's, while the PS count
    stays: a replaced PS keeps its larger cores)."""
    bounds = ps_defaults(spec.parameter_server)
    ps = min(max(plan.ps.count, 1), bounds.max_ps)
    workers = min(max(plan.workers.count, 1), bounds.max_workers)
    ps_cores = _cores(plan.ps.cpu_cores, budget)
    each = [ps_cores] * ps
    if current is not None and current.ps == ps and current.ps_cores == ps_cores:
        each = list(current.cores_each)
    for r in plan.ps_replacements:
        if 0 <= r.ps_index < ps:
            each[r.ps_index] = max(each[r.ps_index], _cores(r.cpu_cores, budget))
    clamped = [
        f"{name} {asked} -> {got} (spec.parameter_server.max_{name})"
        for name, asked, got in (
            ("ps", plan.ps.count, ps),
            ("workers", plan.workers.count, workers),
        )
        if asked > got
    ]
    return PsPlan(
        ps=ps,
        workers=workers,
        ps_cores=ps_cores,
        worker_cores=_cores(plan.workers.cpu_cores, budget),
        ps_cores_each=tuple(each) if len(set(each)) > 1 else (),
        stage=_STAGES.get(plan.stage, "adjust"),
        source=_SOURCES.get(plan.source, "optimizer"),
        plan_id=plan.plan_id,
        memory_bytes=plan.workers.memory_bytes,
        predicted_steps_per_second=plan.predicted_steps_per_second,
        reason=plan.reason + (f"; clamped: {', '.join(clamped)}" if clamped else ""),
    )


def with_spec_counts(plan: PsPlan, spec: common_pb2.JobSpec) -> PsPlan:
    """The spec's fixed starting counts (parameter_server.ps / workers > 0) over the plan's."""
    ps, workers = spec.parameter_server.ps, spec.parameter_server.workers
    if not ps and not workers:
        return plan
    return replace(
        plan,
        ps=ps or plan.ps,
        workers=workers or plan.workers,
        ps_cores_each=(),
        source="spec" if ps and workers else plan.source,
        reason=f"counts from the spec ({ps or plan.ps} PS x {workers or plan.workers} "
        f"workers); cores from the {plan.stage} plan: {plan.reason}",
    )


def fallback(spec: common_pb2.JobSpec, why: str) -> PsPlan:
    """The plan without a Brain: the spec's counts (else 1 x 1), one core each."""
    ps = spec.parameter_server
    return PsPlan(
        ps=ps.ps or 1, workers=ps.workers or 1, ps_cores=1.0, worker_cores=1.0, reason=why
    )


def to_message(plan: PsPlan) -> brain_pb2.ResourcePlan:
    """The current plan, as the Brain's OPTIMIZE / ADJUST stages take it."""
    return brain_pb2.ResourcePlan(
        plan_id=plan.plan_id,
        stage=_STAGE_ENUM.get(plan.stage, brain_pb2.PLAN_STAGE_ADJUST),
        workers=brain_pb2.NodeGroupPlan(
            count=plan.workers, cpu_cores=plan.worker_cores, memory_bytes=plan.memory_bytes
        ),
        ps=brain_pb2.NodeGroupPlan(count=plan.ps, cpu_cores=plan.ps_cores),
        source=brain_pb2.PLAN_SOURCE_OPTIMIZER,
        predicted_steps_per_second=plan.predicted_steps_per_second,
    )


def to_task(plan: PsPlan) -> common_pb2.ParameterServerPlan:
    """What the worker daemon runs (StartTaskRequest.ps_plan)."""
    return common_pb2.ParameterServerPlan(
        ps=plan.ps,
        workers=plan.workers,
        ps_cores=plan.ps_cores,
        worker_cores=plan.worker_cores,
        ps_cores_each=list(plan.ps_cores_each),
    )


def task_cores(plan: PsPlan, slot_cores: int) -> int:
    """Cores the launcher holds on its worker: the plan's total, at most its slot's."""
    return launcher_cores(plan.total_cores, slot_cores)


def measured(
    metrics: common_pb2.ParameterServerMetrics | None, plan: PsPlan
) -> common_pb2.ParameterServerMetrics | None:
    """The task's measurements when they are of this plan's processes and long enough."""
    if metrics is None or metrics.measured_seconds < MIN_MEASURED_S:
        return None
    if (metrics.ps, metrics.workers) != (plan.ps, plan.workers):
        return None
    if metrics.worker_cores_used <= 0 or metrics.ps_cores_per_worker <= 0:
        return None
    return metrics


def to_brain_metrics(
    metrics: common_pb2.ParameterServerMetrics, steps_per_second: float
) -> brain_pb2.PsJobMetrics:
    return brain_pb2.PsJobMetrics(
        worker_cores_needed=metrics.worker_cores_used,
        ps_cores_per_worker=metrics.ps_cores_per_worker,
        ps_cores_used=list(metrics.ps_cores_used),
        worker_memory_bytes_used=metrics.worker_memory_bytes_used,
        ps_memory_bytes_used=metrics.ps_memory_bytes_used,
        steps_per_second=steps_per_second,
    )


def next_stage(
    plan: PsPlan | None,
    metrics: common_pb2.ParameterServerMetrics | None,
    *,
    running: bool,
    since_asked: float,
    interval: float,
) -> int | None:
    """Which stage to ask the Brain now (a PlanStage), or None: INITIAL without a plan;
    OPTIMIZE once the initial / sampling plan is measured; then ADJUST every `interval`
    (0: never) with fresh measurements of the running plan."""
    if plan is None:
        return brain_pb2.PLAN_STAGE_INITIAL
    if not running or metrics is None:
        return None
    if plan.stage in ("initial", "sample"):
        return brain_pb2.PLAN_STAGE_OPTIMIZE
    if interval > 0 and since_asked >= interval:
        return brain_pb2.PLAN_STAGE_ADJUST
    return None


SET = "set"  # the stage of a plan a user or admin set (`source` says who)


def _whole_cores(value: float, field: str, budget: float) -> float:
    """A requested per-process core count: whole, >= 1, at most the slot's (when known)."""
    if value < 1 or value != math.floor(value):
        raise ValidationError(field, f"must be a whole number of cores >= 1 (got {value:g})")
    if budget > 0 and value > budget:
        raise ValidationError(
            field,
            f"{value:g} cores is more than a worker slot has ({budget:g}: --cpu-cores "
            "per device of the largest live worker)",
        )
    return float(value)


def pinned(
    spec: common_pb2.JobSpec,
    current: PsPlan | None,
    *,
    ps: int,
    workers: int,
    ps_cores: float,
    worker_cores: float,
    budget: float,
    who: str,
) -> PsPlan:
    """The plan a user or admin sets: the counts within the spec's bounds, the cores (0:
    the current plan's, else 1) whole and within a slot. ValidationError names the field."""
    bounds = ps_defaults(spec.parameter_server)
    for field, value, most in (("ps", ps, bounds.max_ps), ("workers", workers, bounds.max_workers)):
        if not 1 <= value <= most:
            raise ValidationError(
                field,
                f"must be 1..{most} (spec.parameter_server.max_{field} of this job; got {value})",
            )
    ps_each = _whole_cores(ps_cores or (current.ps_cores if current else 1.0), "ps_cores", budget)
    worker_each = _whole_cores(
        worker_cores or (current.worker_cores if current else 1.0), "worker_cores", budget
    )
    return PsPlan(
        ps=ps,
        workers=workers,
        ps_cores=ps_each,
        worker_cores=worker_each,
        stage=SET,
        source=who,
        memory_bytes=current.memory_bytes if current else 0,
        reason="pinned until `gearshift scale JOB --auto`",
    )


def describe(plan: PsPlan) -> str:
    """The PLAN event's and `gearshift job`'s text."""
    each = plan.cores_each
    ps_cores = (
        f"{each[0]:g} cores each"
        if len(set(each)) <= 1
        else "cores " + "/".join(f"{c:g}" for c in each)
    )
    head = (
        f"set by {plan.source}: "
        if plan.stage == SET
        else f"{plan.stage} plan from {plan.source}: "
    )
    return (
        f"{head}{plan.ps} PS ({ps_cores}) x {plan.workers} "
        f"workers ({plan.worker_cores:g} cores each), {plan.total_cores:g} cores; "
        "asynchronous, not bitwise reproducible" + (f" ({plan.reason})" if plan.reason else "")
    )


@dataclass(frozen=True)
class PsAsk:
    """What a round knows of a PS job when it may ask its plan (copied under the lock)."""

    job_id: str
    running: bool
    spec: common_pb2.JobSpec
    submitted_at: float
    budget: float  # C_total = C_max: the cores of the job's slot
    metrics: common_pb2.ParameterServerMetrics | None
    steps_per_second: float


class PsPlans(PlanBook[PsPlan]):
    """Each PS job's plan, the changed plans waiting for their restart, and the asking."""

    def __init__(self, ask: Asker | None, interval: float, clock: Callable[[], float]) -> None:
        super().__init__(clock)
        self._ask = ask  # None: no Brain (the spec's counts, or what a user pins)
        self.interval = interval
        self._pinned: set[str] = set()  # set by a user or admin: the Brain is not asked

    def restart_wanted(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._next

    def _on_forget(self, job_id: str) -> None:
        self._pinned.discard(job_id)

    def pinned(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._pinned

    def pin(self, job_id: str, plan: PsPlan, *, running: bool) -> bool:
        """Run `plan` from now on instead of the Brain's; True when it waits for the job's
        next (re)start (announced then), False when the running job already has that shape
        (the caller announces it at once)."""
        with self._lock:
            self._pinned.add(job_id)
            current = self._plans.get(job_id)
            if running and current is not None and plan.same_shape(current):
                self._next.pop(job_id, None)
                self._plans[job_id] = plan
                self._announced[job_id] = plan
                return False
            self._next[job_id] = plan
            return True

    def recover(
        self, job_id: str, last: PsPlan | None, pin: PsPlan | None, *, running: bool
    ) -> None:
        """From the job's row: the plan its last placement ran (PlanBook.restore) and a
        user's pin (the Brain stays unasked; a pin the job does not run yet waits for its
        next start, as it did)."""
        if last is not None:
            self.restore(job_id, last)
        if pin is not None:
            self.pin(job_id, pin, running=running and last is not None)

    def unpin(self, job_id: str) -> bool:
        """Let the Brain plan the job again (ADJUST from its current plan, every interval);
        False when nothing was pinned."""
        with self._lock:
            if job_id not in self._pinned:
                return False
            self._pinned.discard(job_id)
            self._asked_at[job_id] = self.clock()
            return True

    def refresh(self, asks: Sequence[PsAsk]) -> None:
        """Ask the Brain what is due (outside the scheduler's lock), one job after another;
        never for a job whose counts are pinned."""
        if self._ask is None:
            return
        for a in asks:
            now = self.clock()
            with self._lock:
                if a.job_id in self._pinned:
                    continue
                current = self._next.get(a.job_id) or self._plans.get(a.job_id)
                since = now - self._asked_at.get(a.job_id, now)
            metrics = measured(a.metrics, current) if current is not None else None
            stage = next_stage(
                current, metrics, running=a.running, since_asked=since, interval=self.interval
            )
            if stage is None:
                continue
            with self._lock:
                self._asked_at[a.job_id] = now
            request = brain_pb2.PlanResourcesRequest(
                job_id=a.job_id,
                stage=stage,  # type: ignore[arg-type]
                cpu_total=max(a.budget, 1.0),
                cpu_max_per_node=max(a.budget, 1.0),
            )
            if metrics is not None:
                request.metrics.CopyFrom(to_brain_metrics(metrics, a.steps_per_second))
            if current is not None:
                request.current.CopyFrom(to_message(current))
            reply = self._ask(request, a.spec, a.submitted_at)
            if current is None:
                plan = (
                    with_spec_counts(from_message(reply, a.spec, a.budget), a.spec)
                    if reply is not None
                    else fallback(a.spec, "Brain unavailable: the spec's counts, 1 core each")
                )
                with self._lock:
                    if a.job_id not in self._pinned:
                        self._plans.setdefault(a.job_id, plan)
                continue
            if reply is None:
                continue
            proposed = from_message(reply, a.spec, a.budget, current)
            log.info(
                "PS plan",
                extra={
                    "job_id": a.job_id,
                    "plan": describe(proposed),
                    "changed": not proposed.same_shape(current),
                },
            )
            with self._lock:
                if a.job_id in self._pinned:  # pinned while the Brain was asked: it wins
                    continue
                if proposed.same_shape(current):
                    # Measured and kept: later asks are ADJUST (the stage moves on).
                    kept = replace(current, stage=proposed.stage, plan_id=proposed.plan_id)
                    if a.job_id in self._next:
                        self._next[a.job_id] = kept
                    else:
                        self._plans[a.job_id] = kept
                        self._announced[a.job_id] = kept
                else:
                    self._next[a.job_id] = proposed


def slot_cores(workers: Sequence[tuple[int, int]]) -> float:
    """A PS job's core budget (DLRover's C_total, and C_max: it runs on one worker): the
    most cores one device slot of a live worker has, (cores, devices) per worker."""
    return float(max((cores // max(devices, 1) for cores, devices in workers), default=0))


def ps_asks_of(state: SchedulerState, jobs: Sequence[JobRecord]) -> list[PsAsk]:
    """The PS jobs' asks (under the scheduler's lock)."""
    ps_jobs = [job for job in jobs if is_ps_job(job.spec) and not job.terminal]
    if not ps_jobs:  # every round asks: no pass over the workers without a PS job
        return []
    budget = slot_cores(
        [(w.cpu_cores, sum(g.count for g in w.devices)) for w in state.workers.values() if w.alive]
    )
    asks = []
    for job in ps_jobs:
        batch = max(job.spec.global_batch_size, 1)
        asks.append(
            PsAsk(
                job_id=job.job_id,
                running=job.state == common_pb2.JOB_STATE_RUNNING,
                spec=job.spec,
                submitted_at=job.submitted_at,
                budget=budget,
                metrics=state.ps_metrics.get(job.job_id),
                steps_per_second=job.progress.samples_per_second / batch,
            )
        )
    return asks
