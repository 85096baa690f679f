"""Rubick's traces on simulated time, through the scheduler's round pipeline (`plan_round`:
the allocator, then the place stage), on the paper's nodes (8 A800 GPUs, 96 vCPUs each).

Event-driven, as Rubick schedules: a round at every arrival and completion. A job runs
`steps` iterations; each iteration takes what the perf source gives for the target's plan
on the GPUs per node the place stage gave it and its CPU cores per GPU
(gearshift.common.rubick.perf). A running job whose plan, placement or CPUs change (or that
is preempted and resumes) makes no progress for `rescale_seconds` (checkpoint, relaunch,
resume: the paper measured 78 s on average).

Results: the simulator's SimulationResult (JCTs, makespan, utilization), plus, per job,
whether it was guaranteed and the lowest ratio of its speed to its speed with its original
plan on its request placed on the fewest nodes at its requested CPUs per GPU (the
guarantee: >= 1 for guaranteed jobs). The speed is the one of the plan, GPUs per node and
CPUs the job holds after each round; the `rescale_seconds` pause of a reconfiguration is
not counted as a slowdown, and a job preempted after its first start counts 0. A job's
first start waits `start_seconds` (launch; 0 by default).

`tick_seconds` > 0 runs the artifact's clock instead (its `simulator/simulator.py`): a
round every tick (arrivals wait for the next one), and a job that ends between ticks
records its exact end but holds its GPUs until the tick (`ARTIFACT_OVERHEADS`: 60 s ticks,
260 s for every placement, the first start included).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gearshift.common.rubick.perf import PerfSource
from gearshift.common.rubick.plans import Plan, consolidated
from gearshift.scheduler.round.pipeline import plan_round
from gearshift.scheduler.sim.rubick_trace import RubickJob
from gearshift.scheduler.sim.simulator import JobResult, SimulationError, SimulationResult
from gearshift.scheduler.types import Allocator, Assignment, Device, JobSnapshot, Snapshot

GPU_TYPE = "a800"
RECONFIGURE_SECONDS = 78.0  # the paper's mean checkpoint-relaunch-resume time (section 7)


@dataclass(frozen=True)
class Overheads:
    """The simulator's clock and what starts and restarts cost (seconds)."""

    tick_seconds: float = 0.0  # 0: a round at every arrival and completion
    start_seconds: float = 0.0
    rescale_seconds: float = RECONFIGURE_SECONDS


# The artifact's simulator: `--interval 60`, `reallocate_time = 260` at every placement.
ARTIFACT_OVERHEADS = Overheads(tick_seconds=60.0, start_seconds=260.0, rescale_seconds=260.0)


def rubick_devices(nodes: int, gpus_per_node: int, kind: str = GPU_TYPE) -> tuple[Device, ...]:
    return tuple(
        Device(f"node-{n:02d}", i, kind) for n in range(nodes) for i in range(gpus_per_node)
    )


@dataclass(frozen=True)
class RubickRun:
    """A simulation's result with the guarantee's evidence per job (by job id)."""

    result: SimulationResult
    guaranteed: dict[str, bool]
    worst_ratio: dict[str, float]  # lowest speed while running / speed as requested
    decision_seconds: tuple[float, ...] = ()

    def average_jct(self, guaranteed: bool | None = None) -> float:
        jobs = [
            j
            for j in self.result.jobs
            if guaranteed is None or self.guaranteed[j.job_id] == guaranteed
        ]
        return sum(j.jct for j in jobs) / len(jobs) if jobs else 0.0


@dataclass
class _State:
    job: RubickJob
    remaining: float
    base_rate: float
    held: tuple[Plan, tuple[tuple[str, int], ...], int] | None = None
    assignment: Assignment = field(default_factory=list)
    rate: float = 0.0
    resume_at: float = 0.0
    first_run: float | None = None
    attained: float = 0.0
    rescales: int = 0
    worst: float = math.inf


def _rate(perf: PerfSource, job: RubickJob, plan: Plan, nodes: Sequence[int], cpus: int) -> float:
    ms = perf.iter_ms(job.application, plan, nodes, cpus)
    return 1e3 / ms if ms else 0.0


def simulate_rubick(
    jobs: Sequence[RubickJob],
    perf: PerfSource,
    allocator: Allocator,
    *,
    nodes: int = 8,
    gpus_per_node: int = 8,
    rescale_seconds: float = RECONFIGURE_SECONDS,
    start_seconds: float = 0.0,
    tick_seconds: float = 0.0,
    name: str | None = None,
) -> RubickRun:
    """Run `jobs` (arrival order) to completion; see the module docstring."""
    if tick_seconds < 0 or start_seconds < 0 or rescale_seconds < 0:
        raise SimulationError("tick, start and rescale seconds must be >= 0")

    def tick_at(t: float) -> float:
        """The first tick at or after t (the artifact's first round is at one tick)."""
        return max(tick_seconds, math.ceil(t / tick_seconds) * tick_seconds)

    started = time.perf_counter()
    devices = rubick_devices(nodes, gpus_per_node)
    capacity = len(devices)
    for job in jobs:
        if job.gpus > capacity and job.request().plan.gpus > capacity:
            raise SimulationError(
                f"job {job.name} asks for {job.gpus} GPUs, the cluster has {capacity}"
            )
    pending = deque(sorted(range(len(jobs)), key=lambda i: jobs[i].arrival_time))
    active: dict[str, _State] = {}
    results: dict[str, JobResult] = {}
    worst: dict[str, float] = {}
    usage: list[tuple[float, dict[str, int]]] = []
    busy = 0.0
    rounds = rescales = 0
    now = jobs[pending[0]].arrival_time if pending else 0.0
    begin = now
    if tick_seconds:
        now = tick_at(now)
    while pending or active:
        while pending and jobs[pending[0]].arrival_time <= now:
            i = pending.popleft()
            job = jobs[i]
            shape = consolidated(job.gpus, gpus_per_node)
            base = _rate(perf, job, job.plan, shape, job.request().cpus_per_gpu)
            if base <= 0 and job.duration > 0:  # the trace ran it: its own speed
                base = job.steps / job.duration
            active[str(i)] = _State(job, float(job.steps), base or 1.0)
        if not active:
            now = jobs[pending[0]].arrival_time
            now = tick_at(now) if tick_seconds else now
            continue
        snapshot = Snapshot(
            now,
            devices,
            tuple(_snapshot(job_id, s, rescale_seconds) for job_id, s in active.items()),
        )
        current = {j: s.assignment for j, s in active.items() if s.assignment}
        targets, desired = plan_round(snapshot, allocator, current)
        rounds += 1
        for job_id, s in active.items():
            got = desired.get(job_id, [])
            target = targets.get(job_id)
            if not got or target is None:
                new = None
            else:
                per_node: dict[str, int] = {}
                for d, _ in got:
                    per_node[d.worker_id] = per_node.get(d.worker_id, 0) + 1
                plan = target.plan or s.job.plan
                cpus = target.cpus_per_device or s.job.request().cpus_per_gpu
                new = (plan, tuple(sorted(per_node.items())), cpus)
            if new != s.held:
                if s.held is not None:
                    s.rescales += 1
                    rescales += 1
                if new is not None:
                    s.resume_at = now + (
                        rescale_seconds if s.first_run is not None else start_seconds
                    )
                    if s.first_run is None:
                        s.first_run = now
                    s.rate = _rate(perf, s.job, new[0], [k for _, k in new[1]], new[2])
                else:
                    s.rate = 0.0
                    if s.first_run is not None:  # preempted: it runs at 0 until resumed
                        s.worst = 0.0
            s.held = new
            s.assignment = list(got) if new else []
        running = [s for s in active.values() if s.held is not None and s.rate > 0]
        for s in running:
            s.worst = min(s.worst, s.rate / s.base_rate)
        if not running and not pending:
            stuck = ", ".join(
                f"{s.job.name}({s.job.gpus} GPUs, {s.job.plan_code})" for s in active.values()
            )
            raise SimulationError(f"no job can run at t={now:.0f}s and none will arrive: {stuck}")
        done_at: dict[int, float] = {}  # id(state) -> its exact end
        if tick_seconds:
            end = now + tick_seconds
            for s in running:
                t = max(now, s.resume_at) + s.remaining / s.rate
                if t <= end:
                    done_at[id(s)] = t
        else:
            end = jobs[pending[0]].arrival_time if pending else math.inf
            for s in running:
                end = min(end, max(now, s.resume_at) + s.remaining / s.rate)
            end = max(end, now + 1e-9)
        usage.append((now, {GPU_TYPE: sum(len(s.assignment) for s in running)}))
        for s in running:
            if id(s) in done_at:  # ended between ticks: holds its GPUs until the tick
                s.remaining = 0.0
            else:
                s.remaining -= s.rate * max(0.0, end - max(now, s.resume_at))
            s.attained += end - now
            busy += (end - now) * len(s.assignment)
        for job_id in [
            j for j, s in active.items() if s.held and s.remaining <= 1e-6 * max(1, s.job.steps)
        ]:
            s = active.pop(job_id)
            results[job_id] = JobResult(
                job_id,
                s.job.application,
                s.job.gpus,
                s.job.arrival_time,
                s.first_run if s.first_run is not None else end,
                done_at.get(id(s), end),
                rescales=s.rescales,
            )
            worst[job_id] = s.worst
        now = end
    usage.append((now, {}))
    ordered = tuple(results[k] for k in sorted(results, key=int))
    makespan = max((r.finish_time for r in ordered), default=begin) - begin
    result = SimulationResult(
        policy=name or allocator.name,
        jobs=ordered,
        makespan=makespan,
        utilization=busy / (capacity * makespan) if makespan > 0 else 0.0,
        rounds=rounds,
        allocations=int(getattr(allocator, "decisions", rounds)),
        wall_seconds=time.perf_counter() - started,
        rescales=rescales,
        usage=tuple(usage),
    )
    return RubickRun(
        result,
        {str(i): job.guaranteed for i, job in enumerate(jobs)},
        worst,
        tuple(getattr(allocator, "decision_seconds", ())),
    )


def _snapshot(job_id: str, s: _State, restart_seconds: float) -> JobSnapshot:
    job = s.job
    return JobSnapshot(
        job_id=job_id,
        num_ests=job.gpus,
        min_devices=job.gpus,
        max_devices=job.gpus,
        types=(GPU_TYPE,),
        capability={GPU_TYPE: s.base_rate / job.gpus},
        throughputs={GPU_TYPE: s.base_rate},
        steps_remaining=s.remaining,
        arrival_time=job.arrival_time,
        entity=job.tenant,
        current=((GPU_TYPE, len(s.assignment)),) if s.assignment else (),
        attained_seconds=s.attained,
        restart_seconds=restart_seconds,
        request=job.request(),
    )
