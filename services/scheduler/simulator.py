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
            sched.job_added(job_id, types)
        if not active:
            now = pending[0][1].arrival_time
            continue
        views = [
            JobView(
                job_id=job_id,
                scale_factor=job.scale_factor,
                throughputs=job_throughputs(table, job.key, types),
                steps_remaining=remaining[job_id],
                arrival_time=job.arrival_time,
                priority_weight=job.priority_weight,
                deadline=job.arrival_time + job.slo * _isolated_duration(table, job)
                if job.slo
                else math.inf,
                entity=job.entity,
                colocated=colocated_rates(table, active, job_id, types) if space_sharing else {},
            )
            for job_id, job in active.items()
        ]
        plan = sched.plan(views, capacity, devices, now)
        if not plan.placements:
            if not pending:
                raise SimulationError(f"no job can run at t={now:.0f}s and none will arrive")
            now = pending[0][1].arrival_time
            continue
        rounds += 1
        by_id = {v.job_id: v for v in views}
        end = now
        finished: list[tuple[str, float]] = []
        for combo, placed in plan.placements.items():
            kind = plan.worker_type[combo]
            longest = 0.0
            for job_id in combo:
                rate = by_id[job_id].rate(combo, kind)
                steps = min(max(int(rate * round_seconds), 1), remaining[job_id])
                took = steps / rate
                longest = max(longest, took)
                remaining[job_id] -= steps
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
            sched.job_removed(job_id)
        now = end
    ordered = tuple(results[str(i)] for i in range(len(workload)))
    makespan = max((r.finish_time for r in ordered), default=begin) - begin
    total = sum(capacity.values()) * makespan
    return SimulationResult(
        policy=policy.name,
        jobs=ordered,
        makespan=makespan,
        utilization=busy / total if total > 0 else 0.0,
        rounds=rounds,
        allocations=sched.solves,
        wall_seconds=time.perf_counter() - started,
    )


def _isolated_duration(table: ThroughputTable, job: TraceJob) -> float:
    """Seconds the job takes alone on its fastest type (the unit of a Gavel trace's SLO)."""
    best = max((table.throughput(job.key, t) for t in table.worker_types), default=0.0)
    return job.total_steps / best if best > 0 else math.inf
