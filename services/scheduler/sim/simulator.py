"""Trace simulation: the daemon's round pipeline (gearshift.scheduler.round.pipeline) on simulated
time and a simulated cluster - the same allocate and place stages the daemon runs.

Every round the simulator builds a Snapshot from its jobs (each trace job is
rigid - its scale factor on one type - or, with `elastic`, an EST job of N =
scale factor ESTs on 1..N devices), runs `plan_round`, applies the changes at
once, and advances its clock:

- Gavel's rounds (allocators that do not re-plan on events: the rigid Gavel
  objectives): each running job does int(throughput * round) steps (fewer when
  fewer remain) and the round ends when the last one is done, as in Gavel's own
  simulator; jobs arriving meanwhile join at its end. Gavel's simulator charges
  nothing for preemptions, and neither does this mode unless `rescale_seconds`
  says so.
- Event rounds (elastic objectives, EasyScale, YARN-CS): jobs progress
  continuously, and a round ends at `round_seconds`, at the next arrival or at the
  next completion, whichever comes first. A job that resumes on new devices
  (grown, shrunk, moved, preempted and resumed) makes no progress for
  `rescale_seconds` - the checkpoint and restart.

Rates: in Gavel's rounds a job runs at Gavel's measured throughput on its type
(alone, or when sharing devices); elsewhere at what EasyScale's planner predicts
for its configuration (gearshift.scheduler.plugins.easyscale.elastic.rate), with scaling measured
per type from Gavel's multi-GPU throughputs - on N devices of one type exactly
Gavel's rigid throughput - divided by the D2 cost for jobs that run under D2.

Determinism (`determinism`): "none" is Gavel's world - results need not be
bitwise reproducible, so any job may run on any type at any time and elastic
jobs may mix types for free (Gavel's and EasyScale's simulators assume it). The
others are Gearshift's guarantee, for every policy alike: under "D1" a job runs
on one type, kept for its life (EasyScale's D1 holds bits on one kind of device
only); under "D2" it may mix types and pays `D2_SLOWDOWN` of its model family;
"auto" is EasyScale's own rule - D2 where it costs nothing (transformers,
LSTMs, recommendation models), D1 for convolutional models.

Collocation (`multiplexing`, DeepPool): the Multiplexing collocate stage lends a
device of every job whose plan idles at least its minimum (the trace carries no
layer profiles: `Multiplexed.idle_fraction` stands for every job's) to a waiting
one-device job; the pair then runs at rates measured on real workers
(bench/multiplex.py): the foreground `foreground_slowdown` slower than alone, the
background at `background_share` of its rate alone on that device.

Metrics: average and 99th-percentile JCT, makespan, utilization (busy
device-seconds over capacity x makespan), rescales, cost (device-hours in use x
`prices`), and - once `with_isolated` has seen a run of the same workload under
Gavel's `isolated` policy (every job 1/N of the cluster) - each job's
finish-time-fairness ratio rho = JCT / its JCT there, as Gavel's evaluation
measures Themis's metric: one yardstick for every policy.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from gearshift.common.gavel import JobKey, ThroughputTable
from gearshift.scheduler.plugins.allocators import GavelRounds, Greedy
from gearshift.scheduler.plugins.deeppool.collocation import Multiplexing
from gearshift.scheduler.plugins.easyscale.elastic import ElasticPolicy
from gearshift.scheduler.plugins.gavel.mechanism import RoundScheduler
from gearshift.scheduler.plugins.gavel.policies.base import Policy
from gearshift.scheduler.plugins.gavel.prices import GAVEL_PRICES
from gearshift.scheduler.round.ests import elastic_job, rate
from gearshift.scheduler.round.pipeline import plan_round
from gearshift.scheduler.round.placement import count_by_type
from gearshift.scheduler.sim.trace import TraceJob
from gearshift.scheduler.types import (
    Allocator,
    Assignment,
    Config,
    Device,
    JobSnapshot,
    Ran,
    Role,
    Snapshot,
    config_of,
    config_size,
)

# Gavel's simulator spaces allocation recomputations by at least this long.
GAVEL_RECOMPUTE_SECONDS = 1920.0
# EasyScale section 5.1.3 / Figure 12: D2 turns off vendor convolution kernels, +236% on
# average for ResNet50, VGG19, ShuffleNetV2, YOLOv3; < 1% for NeuMF, BERT, Electra, Swin.
# Gavel's job types by family (an LSTM language model is GEMM work like a transformer's).
D2_SLOWDOWN: dict[str, float] = {
    "ResNet": 2.36,
    "CycleGAN": 2.36,
    "A3C": 2.36,
    "Transformer": 1.0,
    "LM": 1.0,
    "Recommendation": 1.0,
}
DETERMINISM_CHOICES = ("none", "auto", "D1", "D2")


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
    isolated_seconds: float = 0.0  # its JCT under the isolated policy (see with_isolated)
    rescales: int = 0
    restart_seconds_lost: float = 0.0  # seconds it held devices while restarting
    in_place_rescales: int = 0  # of its rescales, those made in place

    @property
    def jct(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def ftf(self) -> float:
        """Finish-time fairness rho: JCT over the isolated-share duration (<= 1 is fair)."""
        return self.jct / self.isolated_seconds if self.isolated_seconds > 0 else 0.0


@dataclass(frozen=True)
class SimulationResult:
    """Metrics of a simulation; `jobs` in arrival order; `usage` is (time, devices in use
    by type) at every round, each holding until the next point (the last one, empty, at
    the end)."""

    policy: str
    jobs: tuple[JobResult, ...]
    makespan: float
    utilization: float
    rounds: int
    allocations: int
    wall_seconds: float
    rescales: int = 0
    cost: float = 0.0
    usage: tuple[tuple[float, dict[str, int]], ...] = ()

    @property
    def average_jct(self) -> float:
        return sum(j.jct for j in self.jobs) / len(self.jobs) if self.jobs else 0.0

    @property
    def p99_jct(self) -> float:
        if not self.jobs:
            return 0.0
        ordered = sorted(j.jct for j in self.jobs)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]

    @property
    def worst_ftf(self) -> float:
        return max((j.ftf for j in self.jobs), default=0.0)

    @property
    def rescales_per_job(self) -> float:
        return sum(j.rescales for j in self.jobs) / len(self.jobs) if self.jobs else 0.0

    @property
    def in_place_rescales(self) -> int:
        return sum(j.in_place_rescales for j in self.jobs)

    @property
    def restart_seconds_lost(self) -> float:
        """Seconds all jobs together spent restarting (first starts included when charged)."""
        return sum(j.restart_seconds_lost for j in self.jobs)

    def with_isolated(self, isolated: SimulationResult) -> SimulationResult:
        """This result with each job's finish-time-fairness yardstick: its JCT in `isolated`
        (the same workload under the `isolated` policy)."""
        if len(isolated.jobs) != len(self.jobs):
            raise ValueError("the isolated run is of another workload")
        jobs = tuple(
            replace(job, isolated_seconds=ref.jct)
            for job, ref in zip(self.jobs, isolated.jobs, strict=True)
        )
        return replace(self, jobs=jobs)

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "num_jobs": len(self.jobs),
            "average_jct_seconds": self.average_jct,
            "p99_jct_seconds": self.p99_jct,
            "makespan_seconds": self.makespan,
            "utilization": self.utilization,
            "worst_ftf": self.worst_ftf,
            "cost_dollars": self.cost,
            "rounds": self.rounds,
            "allocations_computed": self.allocations,
            "rescales": self.rescales,
            "rescales_per_job": self.rescales_per_job,
            "in_place_rescales": self.in_place_rescales,
            "restart_seconds_lost": self.restart_seconds_lost,
            "wall_seconds": self.wall_seconds,
            "jobs": [{**asdict(j), "jct": j.jct, "ftf": j.ftf} for j in self.jobs],
        }


def cluster_devices(cluster: Mapping[str, int]) -> list[Device]:
    """One device per simulated server, as Gavel's simulator does by default."""
    return [
        Device(f"{kind}-{i}", 0, kind) for kind in sorted(cluster) for i in range(cluster[kind])
    ]


def job_throughputs(table: ThroughputTable, key: JobKey, types: Sequence[str]) -> dict[str, float]:
    return {t: table.throughput(key, t) for t in types}


def d2_slowdown(job_type: str) -> float:
    """EasyScale's D2 cost for a Gavel job type's model family (1.0 when unknown)."""
    for family, factor in D2_SLOWDOWN.items():
        if job_type.startswith(family):
            return factor
    return 1.0


@dataclass(frozen=True)
class SimJob:
    """What never changes about a trace job in a simulation."""

    job_id: str
    trace: TraceJob
    num_ests: int
    min_devices: int
    max_devices: int
    types: tuple[str, ...]  # types it can run on at all
    capability: Mapping[str, float]
    throughputs: Mapping[str, float]
    efficiency: Mapping[int, float]
    type_efficiency: Mapping[str, Mapping[int, float]]
    mixing: bool
    locked_types: bool  # held to the type of its first placement (D1)
    slowdown: float
    deadline: float


def sim_job(
    table: ThroughputTable,
    job_id: str,
    job: TraceJob,
    types: Sequence[str],
    *,
    elastic: bool,
    determinism: str = "auto",
) -> SimJob:
    """A trace job as the simulator runs it: rigid, or an EST job of N = scale factor ESTs
    on 1..N devices whose speed per device and scaling come from Gavel's measurements.

    capability[t] is the job type's single-device throughput on t (one EST's
    mini-batches/s); the scaling efficiency of d devices of type t is Gavel's
    measured d-device throughput over d times the single-device one, so N ESTs on
    N devices of a type run exactly as fast as Gavel's rigid job there.
    """
    single = JobKey(job.job_type, 1)
    capability = {t: table.throughput(single, t) for t in types}
    if not any(capability.values()):  # measured only at its scale: use that, per device
        capability = {t: table.throughput(job.key, t) / job.scale_factor for t in types}
    per_type: dict[str, dict[int, float]] = {}
    overall: dict[int, float] = {1: 1.0}
    scales = sorted({k.scale_factor for k in table.job_keys if k.job_type == job.job_type})
    for d in scales:
        ratios: list[float] = []
        for t in types:
            measured = table.throughput(JobKey(job.job_type, d), t)
            if capability[t] > 0 and measured > 0:
                per_type.setdefault(t, {1: 1.0})[d] = measured / (d * capability[t])
                ratios.append(measured / (d * capability[t]))
        if ratios and d > 1:
            overall[d] = sum(ratios) / len(ratios)
    throughputs = job_throughputs(table, job.key, types)
    d2 = determinism == "D2" or (determinism == "auto" and d2_slowdown(job.job_type) <= 1.01)
    free = determinism == "none"
    runnable = tuple(t for t in types if throughputs[t] > 0 or (elastic and capability[t] > 0))
    return SimJob(
        job_id=job_id,
        trace=job,
        num_ests=job.scale_factor,
        min_devices=1 if elastic else job.scale_factor,
        max_devices=job.scale_factor,
        types=runnable,
        capability=capability,
        throughputs=throughputs,
        efficiency=overall,
        type_efficiency=per_type,
        mixing=elastic and (d2 or free) and not job.one_type,
        locked_types=not (d2 or free),
        slowdown=d2_slowdown(job.job_type) if d2 else 1.0,
        deadline=job.arrival_time + job.slo * _isolated_duration(table, job, types)
        if job.slo
        else math.inf,
    )


@dataclass(frozen=True)
class Multiplexed:
    """DeepPool's multiplexing in the simulator: how idle every job's plan leaves its devices,
    and the rates of a pair as measured (bench/multiplex.py)."""

    idle_fraction: float = 0.3
    foreground_slowdown: float = 0.1
    background_share: float = 0.3
    min_idle: float = 0.1
    max_slowdown: float = 0.2

    def collocator(self) -> Multiplexing:
        return Multiplexing(self.min_idle, self.max_slowdown)


@dataclass
class _Running:
    """A job's changing state in the simulation."""

    job: SimJob
    remaining: float
    held: Config = ()
    assignment: Assignment = field(default_factory=list)
    partners: tuple[str, ...] = ()
    role: Role = ""
    locked: str = ""
    first_run: float | None = None
    resume_at: float = 0.0
    rescales: int = 0
    attained: float = 0.0
    placed_at: float = -math.inf
    restart_seconds: float = 0.0  # what each of its restarts costs (its model's prior)
    resize_seconds: float | None = None  # a change keeping a device, in place (None: restart)
    lost: float = 0.0  # seconds spent restarting so far
    in_place: int = 0  # its rescales made in place


def _snapshot(
    run: _Running,
    colocated: Mapping[tuple[str, str], float],
    restart_seconds: float | None = None,
    multiplexed: Multiplexed | None = None,
) -> JobSnapshot:
    job = run.job
    types = (run.locked,) if run.locked else job.types
    return JobSnapshot(
        job_id=job.job_id,
        num_ests=job.num_ests,
        min_devices=job.min_devices,
        max_devices=job.max_devices,
        types=types,
        capability=job.capability,
        throughputs=job.throughputs,
        steps_remaining=run.remaining,
        arrival_time=job.trace.arrival_time,
        mixing=job.mixing,
        efficiency=job.efficiency,
        type_efficiency=job.type_efficiency,
        slowdown=job.slowdown,
        priority_weight=job.trace.priority_weight,
        deadline=job.deadline,
        entity=job.trace.entity,
        current=run.held,
        attained_seconds=run.attained,
        placed_at=run.placed_at,
        restart_seconds=run.restart_seconds if restart_seconds is None else restart_seconds,
        resize_seconds=run.resize_seconds,
        colocated=colocated,
        background=multiplexed is not None and job.max_devices == 1,
        idle_fraction=multiplexed.idle_fraction if multiplexed is not None else 0.0,
        partners=run.partners if run.held else (),
        guaranteed=job.trace.guaranteed,
    )


def restart_seconds_of(job_type: str, prior: Mapping[str, float], default: float) -> float:
    """A job type's restart seconds from a per-model prior: the longest key of `prior` that
    the type starts with (case-insensitive: `resnet-50` matches "ResNet-50 (batch size
    64)"), else `default`."""
    kind = job_type.lower()
    matches = [k for k in prior if kind.startswith(k.lower())]
    return prior[max(matches, key=len)] if matches else default


def simulate_pipeline(
    workload: Sequence[TraceJob],
    cluster: Mapping[str, int],
    table: ThroughputTable,
    allocator: Allocator,
    *,
    round_seconds: float = 360.0,
    rescale_seconds: float = 0.0,
    restart_prior: Mapping[str, float] | None = None,
    charge_first_start: bool = False,
    elastic: bool = False,
    determinism: str = "none",
    space_sharing: bool = False,
    prices: Mapping[str, float] | None = None,
    name: str | None = None,
    on_round: Callable[[float, dict[str, Config]], None] | None = None,
    max_rounds: int | None = None,
    multiplexed: Multiplexed | None = None,
    on_snapshot: Callable[[Snapshot, Mapping[str, Assignment]], None] | None = None,
    in_place_seconds: float | None = None,
) -> SimulationResult:
    """Run `workload` (arrival order) to completion through `allocator` and the place stage;
    see the module docstring. `on_round(now, configs)` sees every round's decision (the
    devices per type of every job that got some); `max_rounds` ends the run early (the
    result then holds only the jobs that finished); `on_snapshot(snapshot, current)` sees
    what every round decides from (bench/estimated_start.py). A job's restart costs its
    model's `restart_prior` (`restart_seconds_of`), else `rescale_seconds`; with
    `charge_first_start` its first start costs as much (Sia's simulator charges it). With
    `in_place_seconds` (round.rescaleInPlace) a rescale that keeps one of the job's devices
    costs that instead, and the allocator weighs such resizes at it (JobSnapshot.resize_seconds)."""
    started = time.perf_counter()
    types = sorted(t for t, n in cluster.items() if n > 0)
    capacity = {t: cluster[t] for t in types}
    devices = tuple(cluster_devices(capacity))
    price = {t: (prices or GAVEL_PRICES).get(t, 0.0) for t in types}
    gavel_rates = isinstance(allocator, GavelRounds)
    events = allocator.replans_on_events
    jobs = [
        sim_job(table, str(i), job, types, elastic=elastic, determinism=determinism)
        for i, job in enumerate(workload)
    ]
    for job in jobs:
        need = job.min_devices if elastic else job.max_devices
        if not any(capacity[t] >= need for t in job.types):
            raise SimulationError(
                f"job {job.job_id} ({job.trace.job_type} x{job.trace.scale_factor}) "
                "fits on no type of the cluster"
            )
    pending = deque(jobs)
    active: dict[str, _Running] = {}
    results: dict[str, JobResult] = {}
    ran: list[Ran] = []
    usage: list[tuple[float, dict[str, int]]] = []
    busy = 0.0
    spent = 0.0
    rounds = 0
    rescales = 0
    now = jobs[0].trace.arrival_time if jobs else 0.0
    begin = now
    while (pending or active) and (max_rounds is None or rounds < max_rounds):
        while pending and pending[0].trace.arrival_time <= now:
            job = pending.popleft()
            active[job.job_id] = _Running(
                job,
                float(job.trace.total_steps),
                restart_seconds=restart_seconds_of(
                    job.trace.job_type, restart_prior or {}, rescale_seconds
                ),
                resize_seconds=in_place_seconds,
            )
        if not active:
            usage.append((now, {}))  # idle until the next arrival
            now = pending[0].trace.arrival_time
            continue
        pairs = _colocated(table, active, types) if space_sharing else {}
        snapshot = Snapshot(
            now,
            devices,
            tuple(
                _snapshot(r, pairs.get(job_id, {}), None, multiplexed)
                for job_id, r in active.items()
            ),
            tuple(ran),
        )
        ran = []
        current = {job_id: r.assignment for job_id, r in active.items() if r.assignment}
        collocator = multiplexed.collocator() if multiplexed is not None else None
        if on_snapshot is not None:
            on_snapshot(snapshot, current)
        targets, desired = plan_round(snapshot, allocator, current, collocator)
        if on_round is not None:
            on_round(
                now,
                {j: config_of(count_by_type(d for d, _ in a)) for j, a in desired.items() if a},
            )
        for job_id, r in active.items():
            new = config_of(count_by_type(d for d, _ in desired.get(job_id, ())))
            if new != r.held:
                if r.held:
                    r.rescales += 1
                    rescales += 1
                if new:
                    charged = r.first_run is not None or charge_first_start
                    cost = r.restart_seconds if charged else 0.0
                    kept = {d for d, _ in r.assignment} & {d for d, _ in desired.get(job_id, ())}
                    if kept and r.resize_seconds is not None:  # processes stay: in place
                        cost = r.resize_seconds
                        r.in_place += 1
                    r.resume_at = now + cost
                    r.placed_at = now
                    if r.first_run is None:
                        r.first_run = now
                    if r.job.locked_types and not r.locked:
                        r.locked = new[0][0]
            r.held = new
            r.assignment = list(desired.get(job_id, ()))
            r.partners = targets[job_id].partners if job_id in targets else ()
            r.role = targets[job_id].role if job_id in targets else ""
        running = [r for r in active.values() if r.held]
        if not running:
            if not pending:
                raise SimulationError(f"no job can run at t={now:.0f}s and none will arrive")
            usage.append((now, {}))  # idle until the next arrival
            now = pending[0].trace.arrival_time
            continue
        rounds += 1
        in_use = count_by_type(
            {d for r in running for d, _ in r.assignment}  # shared devices count once
        )
        usage.append((now, in_use))
        speed = {r.job.job_id: _rate(r, pairs, gavel_rates, multiplexed) for r in running}
        took: dict[str, float] = {}
        if events:
            end = now + round_seconds
            if pending:
                end = min(end, pending[0].trace.arrival_time)
            for r in running:
                if speed[r.job.job_id] > 0:
                    start = max(now, r.resume_at)
                    end = min(end, start + r.remaining / speed[r.job.job_id])
            end = max(end, now + 1e-9)
            for r in running:
                r.lost += max(0.0, min(end, r.resume_at) - now)
                work = speed[r.job.job_id] * max(0.0, end - max(now, r.resume_at))
                r.remaining = max(0.0, r.remaining - work)
                if r.remaining <= 1e-6 * max(1.0, r.job.trace.total_steps):
                    r.remaining = 0.0
                took[r.job.job_id] = end - now
        else:
            end = now
            for r in running:
                rate_now = speed[r.job.job_id]
                charge = max(0.0, r.resume_at - now)
                if charge >= round_seconds:
                    # restarting through the whole round: it does no step and the round keeps
                    # its length (the rest of the restart falls in the next), rather than
                    # every job waiting out a restart longer than the round
                    r.lost += round_seconds
                    took[r.job.job_id] = round_seconds
                    end = max(end, now + round_seconds)
                    continue
                r.lost += charge
                steps = min(max(int(rate_now * (round_seconds - charge)), 1), r.remaining)
                took[r.job.job_id] = charge + steps / rate_now
                r.remaining -= steps
                end = max(end, now + took[r.job.job_id])
        seen: set[frozenset[str]] = set()
        for r in running:
            ran.append(Ran(r.job.job_id, r.held, took[r.job.job_id]))
            r.attained += took[r.job.job_id]
            group = frozenset((r.job.job_id, *r.partners))
            if group in seen:
                continue
            seen.add(group)
            longest = max(took.get(j, 0.0) for j in group)
            held = max((active[j].held for j in group), key=config_size)  # the foreground's
            busy += longest * config_size(held)
            spent += longest * sum(price[t] * n for t, n in held) / 3600.0
        for r in running:
            if r.remaining <= 0:
                job_id = r.job.job_id
                finish = now + took[job_id]
                if gavel_rates and r.role == "shared":
                    # Gavel's simulator ends a pair's members together, when the longer ends.
                    finish = now + max(took.get(j, 0.0) for j in (job_id, *r.partners))
                first = r.first_run if r.first_run is not None else now
                results[job_id] = JobResult(
                    job_id,
                    r.job.trace.job_type,
                    r.job.trace.scale_factor,
                    r.job.trace.arrival_time,
                    first,
                    finish,
                    rescales=r.rescales,
                    restart_seconds_lost=r.lost,
                    in_place_rescales=r.in_place,
                )
                del active[job_id]
        now = end
    usage.append((now, {}))
    solves = getattr(allocator, "solves", None)
    if isinstance(allocator, GavelRounds):
        solves = allocator.mechanism.solves
    if isinstance(allocator, Greedy):
        solves = allocator.decisions
    return _result(
        name or allocator.name,
        results=results,
        begin=begin,
        capacity=capacity,
        busy=busy,
        rounds=rounds,
        allocations=int(solves or 0),
        started=started,
        rescales=rescales,
        cost=spent,
        usage=usage,
    )


def _rate(
    run: _Running,
    pairs: Mapping[str, Mapping[tuple[str, str], float]],
    gavel_rates: bool,
    multiplexed: Multiplexed | None = None,
) -> float:
    """The job's mini-batches/s where it runs now (sharing devices: its pair rate; lending
    or borrowing one: as measured)."""
    if multiplexed is not None and run.role in ("foreground", "background"):
        alone = _rate(replace(run, role="", partners=()), pairs, gavel_rates)
        if run.role == "foreground":
            return alone * (1.0 - multiplexed.foreground_slowdown)
        return alone * multiplexed.background_share
    job = run.job
    if gavel_rates:
        kind = run.held[0][0]
        if run.partners:
            return pairs.get(job.job_id, {}).get((run.partners[0], kind), 0.0)
        return job.throughputs.get(kind, 0.0)
    model = elastic_job(_snapshot(run, {}, 0.0))
    return rate(model, dict(run.held))


def _colocated(
    table: ThroughputTable, active: Mapping[str, _Running], types: Sequence[str]
) -> dict[str, dict[tuple[str, str], float]]:
    """Each active job's steps/s when sharing a device with each other one of its scale."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    for job_id, run in active.items():
        me = run.job.trace
        rates: dict[tuple[str, str], float] = {}
        for other_id, other in active.items():
            if other_id == job_id or other.job.trace.scale_factor != me.scale_factor:
                continue
            for t in types:
                mine, _ = table.pair(me.key, other.job.trace.key, t)
                if mine > 0:
                    rates[(other_id, t)] = mine
        out[job_id] = rates
    return out


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
    cost: float,
    usage: Sequence[tuple[float, dict[str, int]]],
) -> SimulationResult:
    """The metrics of a finished run; job ids are the workload's indices."""
    ordered = tuple(results[k] for k in sorted(results, key=int))
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
        cost=cost,
        usage=tuple(usage),
    )


def _isolated_duration(table: ThroughputTable, job: TraceJob, types: Sequence[str]) -> float:
    """Seconds the job takes alone on its fastest type (the unit of a Gavel trace's SLO)."""
    best = max((table.throughput(job.key, t) for t in types), default=0.0)
    return job.total_steps / best if best > 0 else math.inf


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
    rescale_seconds: float = 0.0,
    prices: Mapping[str, float] | None = None,
    determinism: str = "none",
) -> SimulationResult:
    """Rigid jobs under a Gavel policy in Gavel's rounds (see the module docstring)."""
    allocator = GavelRounds(
        RoundScheduler(
            policy,
            round_seconds=round_seconds,
            min_recompute_seconds=min_recompute_seconds,
            seed=seed,
            costs=prices or GAVEL_PRICES,
        )
    )
    return simulate_pipeline(
        workload,
        cluster,
        table,
        allocator,
        round_seconds=round_seconds,
        rescale_seconds=rescale_seconds,
        space_sharing=space_sharing,
        prices=prices,
        name=policy.name,
        determinism=determinism,
    )


def simulate_elastic(
    workload: Sequence[TraceJob],
    cluster: Mapping[str, int],
    table: ThroughputTable,
    policy: ElasticPolicy,
    *,
    rescale_seconds: float = 10.0,
    round_seconds: float = 360.0,
    determinism: str = "none",
) -> SimulationResult:
    """Elastic EST jobs under EasyScale's greedy allocator (or the rigid YARN-CS baseline)."""
    return simulate_pipeline(
        workload,
        cluster,
        table,
        Greedy(policy),
        round_seconds=round_seconds,
        rescale_seconds=rescale_seconds,
        elastic=policy.name != "yarn_cs",
        determinism=determinism,
    )


def isolated_reference(
    workload: Sequence[TraceJob],
    cluster: Mapping[str, int],
    table: ThroughputTable,
    *,
    round_seconds: float = 360.0,
    seed: int = 0,
) -> SimulationResult:
    """The workload under Gavel's `isolated` policy (every job 1/N of the cluster, in
    Gavel's rounds): the finish-time-fairness yardstick of `with_isolated`."""
    from gearshift.scheduler.plugins.gavel.policies import make_policy  # noqa: PLC0415 - avoids a cycle

    return simulate(
        workload,
        cluster,
        table,
        make_policy("isolated", seed=seed),
        round_seconds=round_seconds,
        seed=seed,
    )
