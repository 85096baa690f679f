"""Trace simulation: the service's policies and mechanism on simulated time.

Rigid jobs (Gavel): `simulate` runs rounds of `round_seconds`. In a round each
selected combination runs int(throughput * round) steps (fewer when fewer
remain) and finishes after steps / throughput seconds; the round ends when the
last one finishes, like Gavel's simulator. Jobs arriving during a round join
at its end; a job's completion time is its finish minus its arrival. No
checkpoint or restart overhead is modelled (Gavel's simulator has none).

Elastic EST jobs (EasyScale): `simulate_elastic` (see gearshift.scheduler.elastic)
shares the workload, results and metrics defined here.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from gearshift.common.gavel import JobKey, ThroughputTable
from gearshift.scheduler.elastic import Devices, ElasticJob, ElasticPolicy, rate
from gearshift.scheduler.mechanism import Device, JobView, RoundScheduler
from gearshift.scheduler.policies.base import Policy
from gearshift.scheduler.trace import TraceJob

# Gavel's simulator spaces allocation recomputations by at least this long.
GAVEL_RECOMPUTE_SECONDS = 1920.0


class SimulationError(RuntimeError):
    """The workload cannot finish (a job fits on no type of the cluster)."""


@dataclass(frozen=True)
class JobResult:
    """How one job fared."""

    job_id: str
    job_type: str
    scale_factor: int
    arrival_time: float
    start_time: float
    finish_time: float

    @property
    def jct(self) -> float:
        return self.finish_time - self.arrival_time


@dataclass(frozen=True)
class SimulationResult:
    """Metrics of a simulation; `jobs` in arrival order."""

    policy: str
    jobs: tuple[JobResult, ...]
    makespan: float
    utilization: float
    rounds: int
    allocations: int
    wall_seconds: float
    rescales: int = 0

    @property
    def average_jct(self) -> float:
        return sum(j.jct for j in self.jobs) / len(self.jobs) if self.jobs else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "num_jobs": len(self.jobs),
            "average_jct_seconds": self.average_jct,
            "makespan_seconds": self.makespan,
            "utilization": self.utilization,
            "rounds": self.rounds,
            "allocations_computed": self.allocations,
            "rescales": self.rescales,
            "wall_seconds": self.wall_seconds,
            "jobs": [{**asdict(j), "jct": j.jct} for j in self.jobs],
        }


def cluster_devices(cluster: Mapping[str, int]) -> list[Device]:
    """One device per simulated server, as Gavel's simulator does by default."""
    return [
        Device(f"{kind}-{i}", 0, kind) for kind in sorted(cluster) for i in range(cluster[kind])
    ]


def job_throughputs(table: ThroughputTable, key: JobKey, types: Sequence[str]) -> dict[str, float]:
    return {t: table.throughput(key, t) for t in types}


def colocated_rates(
    table: ThroughputTable, jobs: Mapping[str, TraceJob], job_id: str, types: Sequence[str]
) -> dict[tuple[str, str], float]:
    """This job's steps/s when sharing a device with each other active job of its scale."""
    me = jobs[job_id]
    out: dict[tuple[str, str], float] = {}
    for other_id, other in jobs.items():
        if other_id == job_id or other.scale_factor != me.scale_factor:
            continue
        for t in types:
            mine, _ = table.pair(me.key, other.key, t)
            if mine > 0:
                out[(other_id, t)] = mine
    return out


def simulate(
    workload: Sequence[TraceJob],
    cluster: Mapping[str, int],
    table: ThroughputTable,
    policy: Policy,
    *,
    round_seconds: float = 360.0,
    seed: int = 0,
    min_recompute_seconds: float = GAVEL_RECOMPUTE_SECONDS,
    space_sharing: bool = False,
) -> SimulationResult:
    """Run `workload` (arrival order) to completion; see the module docstring."""
    started = time.perf_counter()
    types = sorted(t for t, n in cluster.items() if n > 0)
    capacity = {t: cluster[t] for t in types}
    devices = cluster_devices(capacity)
    for i, job in enumerate(workload):
        rates = job_throughputs(table, job.key, types)
        if not any(rate > 0 and capacity[t] >= job.scale_factor for t, rate in rates.items()):
            raise SimulationError(
                f"job {i} ({job.job_type} x{job.scale_factor}) fits on no type of the cluster"
            )
    sched = RoundScheduler(
        policy,
        round_seconds=round_seconds,
        min_recompute_seconds=min_recompute_seconds,
        seed=seed,
    )
    pending = deque((str(i), job) for i, job in enumerate(workload))
    active: dict[str, TraceJob] = {}
    views: dict[str, JobView] = {}
    remaining: dict[str, int] = {}
    first_run: dict[str, float] = {}
    results: dict[str, JobResult] = {}
    busy = 0.0
    rounds = 0
    now = workload[0].arrival_time if workload else 0.0
    begin = now
    while pending or active:
        while pending and pending[0][1].arrival_time <= now:
            job_id, job = pending.popleft()
            active[job_id] = job
            remaining[job_id] = job.total_steps
            views[job_id] = JobView(
                job_id=job_id,
                scale_factor=job.scale_factor,
                throughputs=job_throughputs(table, job.key, types),
                steps_remaining=job.total_steps,
                arrival_time=job.arrival_time,
                priority_weight=job.priority_weight,
                deadline=job.arrival_time + job.slo * _isolated_duration(table, job, types)
                if job.slo
                else math.inf,
                entity=job.entity,
                colocated=colocated_rates(table, active, job_id, types) if space_sharing else {},
            )
            if space_sharing:  # earlier jobs learn their rates with the newcomer
                for other_id in active:
                    views[other_id].colocated = colocated_rates(table, active, other_id, types)
            sched.add_job(views[job_id], types)
        if not active:
            now = pending[0][1].arrival_time
            continue
        plan = sched.plan(capacity, devices, now)
        if not plan.placements:
            if not pending:
                raise SimulationError(f"no job can run at t={now:.0f}s and none will arrive")
            now = pending[0][1].arrival_time
            continue
        rounds += 1
        end = now
        finished: list[tuple[str, float]] = []
        for combo, placed in plan.placements.items():
            kind = plan.worker_type[combo]
            longest = 0.0
            for job_id in combo:
                rate_now = views[job_id].rate(combo, kind)
                steps = min(max(int(rate_now * round_seconds), 1), remaining[job_id])
                took = steps / rate_now
                longest = max(longest, took)
                remaining[job_id] -= steps
                views[job_id].steps_remaining = remaining[job_id]
                first_run.setdefault(job_id, now)
                if remaining[job_id] <= 0:
                    finished.append((job_id, now + took))
            sched.record(combo, kind, longest)
            busy += longest * len(placed)
            end = max(end, now + longest)
        for job_id, finish in finished:
            job = active.pop(job_id)
            results[job_id] = JobResult(
                job_id, job.job_type, job.scale_factor, job.arrival_time, first_run[job_id], finish
            )
            sched.remove_job(job_id)
            views.pop(job_id)
        now = end
    return _result(
        policy.name,
        results=results,
        begin=begin,
        capacity=capacity,
        busy=busy,
        rounds=rounds,
        allocations=sched.solves,
        started=started,
        rescales=0,
    )


def _result(
    policy: str,
    *,
    results: Mapping[str, JobResult],
    begin: float,
    capacity: Mapping[str, int],
    busy: float,
    rounds: int,
    allocations: int,
    started: float,
    rescales: int,
) -> SimulationResult:
    """The metrics of a finished run; job ids are the workload's indices."""
    ordered = tuple(results[str(i)] for i in range(len(results)))
    makespan = max((r.finish_time for r in ordered), default=begin) - begin
    total = sum(capacity.values()) * makespan
    return SimulationResult(
        policy=policy,
        jobs=ordered,
        makespan=makespan,
        utilization=busy / total if total > 0 else 0.0,
        rounds=rounds,
        allocations=allocations,
        wall_seconds=time.perf_counter() - started,
        rescales=rescales,
    )


def _isolated_duration(table: ThroughputTable, job: TraceJob, types: Sequence[str]) -> float:
    """Seconds the job takes alone on its fastest type (the unit of a Gavel trace's SLO)."""
    best = max((table.throughput(job.key, t) for t in types), default=0.0)
    return job.total_steps / best if best > 0 else math.inf


def elastic_job(
    table: ThroughputTable, job_id: str, job: TraceJob, types: Sequence[str]
) -> ElasticJob:
    """A trace job as an elastic EST job: N = its scale factor ESTs, 1..N devices.

    capability[t] is the job type's single-device throughput on t (one EST's
    mini-batches/s); efficiency(d) is Gavel's measured d-device throughput over
    d times the single-device one, averaged over types, so N ESTs on N devices
    of a type run as fast as Gavel's rigid job there.
    """
    single = JobKey(job.job_type, 1)
    capability = {t: table.throughput(single, t) for t in types}
    if not any(capability.values()):  # measured only at its scale: use that, per device
        capability = {t: table.throughput(job.key, t) / job.scale_factor for t in types}
    efficiency: dict[int, float] = {1: 1.0}
    for d in sorted({k.scale_factor for k in table.job_keys if k.job_type == job.job_type}):
        ratios = [
            table.throughput(JobKey(job.job_type, d), t) / (d * capability[t])
            for t in types
            if capability[t] > 0 and table.throughput(JobKey(job.job_type, d), t) > 0
        ]
        if ratios and d > 1:
            efficiency[d] = min(1.0, sum(ratios) / len(ratios))
    return ElasticJob(
        job_id=job_id,
        num_ests=job.scale_factor,
        min_devices=1,
        max_devices=job.scale_factor,
        capability=capability,
        arrival_time=job.arrival_time,
        efficiency=efficiency,
    )


def simulate_elastic(
    workload: Sequence[TraceJob],
    cluster: Mapping[str, int],
    table: ThroughputTable,
    policy: ElasticPolicy,
    *,
    rescale_seconds: float = 10.0,
) -> SimulationResult:
    """Elastic EST jobs (or the rigid YARN-CS baseline) on simulated time, event by event.

    The allocation is recomputed at every arrival and completion. A job whose
    devices change while it runs checkpoints and restarts: it makes no progress
    for `rescale_seconds`. Work is counted in Gavel's steps (mini-batches summed
    over the job's workers), so results compare with the rigid simulation.
    """
    started = time.perf_counter()
    types = sorted(t for t, n in cluster.items() if n > 0)
    capacity = {t: cluster[t] for t in types}
    jobs = [elastic_job(table, str(i), job, types) for i, job in enumerate(workload)]
    for job, trace_job in zip(jobs, workload, strict=True):
        if not any(
            capacity[t] >= (job.max_devices if policy.name == "yarn_cs" else 1)
            and job.capability[t] > 0
            for t in types
        ):
            raise SimulationError(
                f"job {job.job_id} ({trace_job.job_type} x{trace_job.scale_factor}) "
                "fits on no type of the cluster"
            )
    pending = deque(jobs)
    active: dict[str, ElasticJob] = {}
    remaining: dict[str, float] = {}
    held: dict[str, Devices] = {}
    resume_at: dict[str, float] = {}
    first_run: dict[str, float] = {}
    results: dict[str, JobResult] = {}
    busy = 0.0
    rescales = 0
    decisions = 0
    now = jobs[0].arrival_time if jobs else 0.0
    begin = now
    while pending or active:
        while pending and pending[0].arrival_time <= now:
            job = pending.popleft()
            active[job.job_id] = job
            remaining[job.job_id] = float(workload[int(job.job_id)].total_steps)
        decision = policy.allocate(list(active.values()), capacity, held)
        decisions += 1
        for job_id in active:
            new = {t: n for t, n in decision.get(job_id, {}).items() if n > 0}
            old = held.get(job_id, {})
            if new != old:
                if old:
                    rescales += 1  # grown, shrunk, moved or preempted: checkpoint first
                if new and job_id in first_run:
                    resume_at[job_id] = now + rescale_seconds  # restart from the checkpoint
                elif new:
                    resume_at[job_id] = now
                    first_run[job_id] = now
            if new:
                held[job_id] = new
            else:
                held.pop(job_id, None)
        rates = {job_id: rate(active[job_id], devs) for job_id, devs in held.items()}
        finish = {
            job_id: max(now, resume_at[job_id]) + remaining[job_id] / r
            for job_id, r in rates.items()
            if r > 0
        }
        upcoming = [pending[0].arrival_time] if pending else []
        if finish:
            upcoming.append(min(finish.values()))
        if not upcoming:
            raise SimulationError(f"no job can run at t={now:.0f}s and none will arrive")
        until = min(upcoming)
        for job_id, r in rates.items():
            busy += sum(held[job_id].values()) * (until - now)
            remaining[job_id] -= r * max(0.0, until - max(now, resume_at[job_id]))
        for job_id, done_at in finish.items():
            if done_at <= until + 1e-9:
                job = active.pop(job_id)
                held.pop(job_id, None)
                trace_job = workload[int(job_id)]
                results[job_id] = JobResult(
                    job_id,
                    trace_job.job_type,
                    trace_job.scale_factor,
                    job.arrival_time,
                    first_run[job_id],
                    done_at,
                )
        now = until
    return _result(
        policy.name,
        results=results,
        begin=begin,
        capacity=capacity,
        busy=busy,
        rounds=decisions,
        allocations=decisions,
        started=started,
        rescales=rescales,
    )
