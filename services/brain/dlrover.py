"""DLRover's resource planning for parameter-server jobs, as plain functions over plain data.

Paper: ../shared/papers/dlrover-*.txt, section 4; our reading of its draft
numbers is ../shared/notes/dlrover.md. Stages:

- initial: from the history of similar jobs (same model type and dataset,
  else same model type), weighted by recency; else the sampling defaults;
- sample: a few PS and one worker at C_max cores with default memory; a PS
  above 90% CPU gets more cores;
- optimize: Eq. 10-11 with per-node sizes fixed: w = ŵ, s = 16 cores per PS,
  N_w = min(C_total/(ŵ+ŝ), s_total/ŝ) rounded down, s_total = C_total - N_w*ŵ,
  N_ps = s_total/s rounded down, per-node cores rounded up (Table 1 is a test);
- adjust: a hot PS is replaced by one with
  s = min((ŝ_hot/ŝ_total)*ŝ*N_w, C_max) cores; idle PS CPU becomes more
  workers (ŝ re-measured as ŝ_total/N_w);
- OOM at any stage: a worker OOM doubles worker memory, a PS OOM doubles the
  PS count; new workers' memory follows the observed use.

Data-parallel jobs (no PS: Gearshift's EST jobs) use the worker group only: a
"worker" is one training process, with its cores, memory and shared loader
processes (`loader_procs`, one core less than the process has, at most
`max_loader_procs`). Their adjust stage shrinks (or grows) the cores of a
process to its measured use: `data_parallel_adjust`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

GIB = 1024**3
MIB = 1024**2


class Stage(StrEnum):
    """DLRover's optimization stages."""

    INITIAL = "initial"
    SAMPLE = "sample"
    OPTIMIZE = "optimize"
    ADJUST = "adjust"


class Source(StrEnum):
    """Where a plan came from."""

    HISTORY = "history"
    DEFAULT = "default"
    OPTIMIZER = "optimizer"


class Role(StrEnum):
    """Role of a node in a parameter-server job."""

    WORKER = "worker"
    PS = "ps"


@dataclass(frozen=True)
class NodeGroup:
    """`count` identical nodes of `cpu_cores` cores and `memory_bytes` memory each."""

    count: int
    cpu_cores: float
    memory_bytes: int
    loader_procs: int = 0

    @property
    def total_cores(self) -> float:
        return self.count * self.cpu_cores


@dataclass(frozen=True)
class PsReplacement:
    """Replace the PS at `ps_index` by one with `cpu_cores` cores."""

    ps_index: int
    cpu_cores: float


@dataclass(frozen=True)
class ResourcePlan:
    """Workers and parameter servers for a job, and why."""

    stage: Stage
    workers: NodeGroup
    ps: NodeGroup
    source: Source
    reason: str
    ps_replacements: tuple[PsReplacement, ...] = ()
    predicted_steps_per_second: float = 0.0


@dataclass(frozen=True)
class Budget:
    """A job's CPU limits: C_total cores in all, C_max per node."""

    cpu_total: float
    cpu_max_per_node: float


@dataclass(frozen=True)
class PsMetrics:
    """Measurements of a running PS job (zeros where not measured)."""

    worker_cores_needed: float = 0.0  # ŵ
    ps_cores_per_worker: float = 0.0  # ŝ
    ps_cores_used: tuple[float, ...] = ()  # per PS
    worker_memory_bytes_used: int = 0
    ps_memory_bytes_used: int = 0
    steps_per_second: float = 0.0


@dataclass(frozen=True)
class PlanDefaults:
    """Constants of the planner. `ps_cores` is the paper's s = 16."""

    worker_memory_bytes: int = 4 * GIB
    ps_memory_bytes: int = 4 * GIB
    sample_ps_count: int = 1
    ps_cores: float = 16.0
    memory_headroom: float = 1.2
    ps_busy_utilization: float = 0.9
    ps_idle_utilization: float = 0.6
    hot_ps_factor: float = 1.5
    history_jobs: int = 5
    max_loader_procs: int = 2
    worker_idle_utilization: float = 0.6
    worker_busy_utilization: float = 0.95


@dataclass(frozen=True)
class PastJob:
    """What a similar, finished job ran with and what it measured."""

    job_id: str
    finished_at: float
    workers: NodeGroup
    ps: NodeGroup
    worker_memory_peak: int = 0
    ps_memory_peak: int = 0
    steps_per_second: float = 0.0


def _up(value: float) -> float:
    """Cores rounded up to whole cores (tolerating float noise)."""
    return float(math.ceil(value - 1e-9))


def _memory(used: int, headroom: float) -> int:
    """Memory for observed peak use `used`, with headroom, rounded up to MiB."""
    return math.ceil(used * headroom / MIB) * MIB


def optimize_counts(
    worker_cores: float, ps_cores_per_worker: float, cpu_total: float, ps_cores: float = 16.0
) -> tuple[int, float, int]:
    """DLRover Eq. 10-11: (N_w, s_total, N_ps) for measured ŵ and ŝ under C_total.

    N_w = floor(min(C_total/(ŵ+ŝ), s_total/ŝ)) with s_total = C_total - N_w*ŵ,
    N_ps = floor(s_total/s). At least one worker and one PS.
    """
    if worker_cores <= 0 or ps_cores_per_worker <= 0 or cpu_total <= 0 or ps_cores <= 0:
        raise ValueError("ŵ, ŝ, C_total and s must be > 0")
    first = math.floor(cpu_total / (worker_cores + ps_cores_per_worker) + 1e-9)
    s_total = cpu_total - first * worker_cores
    workers = max(1, min(first, math.floor(s_total / ps_cores_per_worker + 1e-9)))
    s_total = cpu_total - workers * worker_cores
    return workers, s_total, max(1, math.floor(s_total / ps_cores + 1e-9))


def loader_procs_for(cores: float, defaults: PlanDefaults = PlanDefaults()) -> int:
    """Shared loader processes for a process of `cores` cores: the cores beside the one
    that trains, at most max_loader_procs (a one-core process loads its own data)."""
    return max(0, min(math.floor(cores + 1e-9) - 1, defaults.max_loader_procs))


def sample_plan(budget: Budget, defaults: PlanDefaults = PlanDefaults()) -> ResourcePlan:
    """The sampling run: one worker at C_max cores and a few PS, default memory."""
    cores = budget.cpu_max_per_node
    ps_cores = min(defaults.ps_cores, budget.cpu_max_per_node)
    return ResourcePlan(
        Stage.SAMPLE,
        NodeGroup(1, cores, defaults.worker_memory_bytes, loader_procs_for(cores, defaults)),
        NodeGroup(defaults.sample_ps_count, ps_cores, defaults.ps_memory_bytes),
        Source.DEFAULT,
        f"sampling: 1 worker x C_max={cores:g} cores, {defaults.sample_ps_count} PS x "
        f"{ps_cores:g} cores, default memory",
    )


def handle_oom(current: ResourcePlan, role: Role, stage: Stage) -> ResourcePlan:
    """A worker OOM doubles worker memory; a PS OOM doubles the PS count (more total memory)."""
    if role is Role.WORKER:
        workers = replace(current.workers, memory_bytes=current.workers.memory_bytes * 2)
        return replace(
            current,
            stage=stage,
            workers=workers,
            source=Source.OPTIMIZER,
            ps_replacements=(),
            reason=f"worker OOM: worker memory x2 -> {workers.memory_bytes} bytes",
        )
    ps = replace(current.ps, count=max(1, current.ps.count) * 2)
    return replace(
        current,
        stage=stage,
        ps=ps,
        source=Source.OPTIMIZER,
        ps_replacements=(),
        reason=f"PS OOM: PS count x2 -> {ps.count}",
    )


def busy_ps_plan(
    budget: Budget,
    metrics: PsMetrics,
    current: ResourcePlan,
    defaults: PlanDefaults = PlanDefaults(),
) -> ResourcePlan | None:
    """Sampling: a PS above the busy threshold gets 2x cores (up to C_max), or one more PS
    once at C_max. None when no PS is busy."""
    if not metrics.ps_cores_used or current.ps.cpu_cores <= 0:
        return None
    peak = max(metrics.ps_cores_used) / current.ps.cpu_cores
    if peak <= defaults.ps_busy_utilization:
        return None
    if current.ps.cpu_cores < budget.cpu_max_per_node:
        cores = min(current.ps.cpu_cores * 2, budget.cpu_max_per_node)
        ps = replace(current.ps, cpu_cores=cores)
        why = f"PS CPU {peak:.0%} > {defaults.ps_busy_utilization:.0%}: PS cores -> {cores:g}"
    else:
        ps = replace(current.ps, count=current.ps.count + 1)
        why = f"PS CPU {peak:.0%} at C_max: one more PS -> {ps.count}"
    return replace(
        current, stage=Stage.SAMPLE, ps=ps, source=Source.OPTIMIZER, ps_replacements=(), reason=why
    )


def optimize_plan(
    budget: Budget,
    metrics: PsMetrics,
    current: ResourcePlan | None = None,
    defaults: PlanDefaults = PlanDefaults(),
) -> ResourcePlan:
    """The optimize stage from measured ŵ and ŝ (Table 1 of the paper is the test case).

    Workers get ceil(ŵ) cores (at most C_max) and memory from their observed
    peak use (with headroom); PS get s = min(16, C_max) cores, and memory so
    that the PS side keeps the total it used. The prediction scales the
    measured per-worker rate by the number of workers.
    """
    w_hat, s_hat = metrics.worker_cores_needed, metrics.ps_cores_per_worker
    ps_cores = min(defaults.ps_cores, budget.cpu_max_per_node)
    n_w, s_total, n_ps = optimize_counts(w_hat, s_hat, budget.cpu_total, ps_cores)
    worker_cores = min(_up(w_hat), budget.cpu_max_per_node)
    before = current or sample_plan(budget, defaults)
    worker_memory = (
        _memory(metrics.worker_memory_bytes_used, defaults.memory_headroom)
        if metrics.worker_memory_bytes_used > 0
        else before.workers.memory_bytes
    )
    ps_memory = (
        _memory(
            math.ceil(metrics.ps_memory_bytes_used * max(before.ps.count, 1) / n_ps),
            defaults.memory_headroom,
        )
        if metrics.ps_memory_bytes_used > 0
        else before.ps.memory_bytes
    )
    per_worker = metrics.steps_per_second / max(before.workers.count, 1)
    return ResourcePlan(
        Stage.OPTIMIZE,
        NodeGroup(n_w, worker_cores, worker_memory),
        NodeGroup(n_ps, ps_cores, ps_memory),
        Source.OPTIMIZER,
        f"N_w = min(C_total/(ŵ+ŝ), s_total/ŝ) = {n_w} with ŵ={w_hat:g}, ŝ={s_hat:g}, "
        f"C_total={budget.cpu_total:g}; s_total = {s_total:g}, N_ps = s_total/{ps_cores:g} "
        f"= {n_ps}",
        predicted_steps_per_second=per_worker * n_w,
    )


def hot_ps(ps_cores_used: Sequence[float], allocated: float, defaults: PlanDefaults) -> list[int]:
    """Indexes of hot PS: busy (above the busy utilization of their cores) and using more than
    hot_ps_factor times the median of the others (a single busy PS is hot)."""
    hot: list[int] = []
    for i, used in enumerate(ps_cores_used):
        if allocated <= 0 or used / allocated <= defaults.ps_busy_utilization:
            continue
        others = [u for j, u in enumerate(ps_cores_used) if j != i]
        if not others or used > defaults.hot_ps_factor * statistics.median(others):
            hot.append(i)
    return hot


def adjust_plan(
    budget: Budget,
    metrics: PsMetrics,
    current: ResourcePlan,
    defaults: PlanDefaults = PlanDefaults(),
) -> ResourcePlan:
    """The adjust stage: replace hot PS, turn idle PS CPU into workers, size worker memory.

    Hot PS j -> s = min((ŝ_j/ŝ_total)*ŝ*N_w, C_max) cores (when that is more than
    it has). With no hot PS and the PS side below the idle utilization, ŝ is
    re-measured as ŝ_total/N_w and workers are added up to s_total/ŝ, within
    C_total (the paper lets such workers exceed the quota at low priority; we
    keep to C_total). Otherwise the plan stays, with memory from observed use.
    """
    n_w = max(current.workers.count, 1)
    used = metrics.ps_cores_used
    used_total = sum(used)
    workers = current.workers
    if metrics.worker_memory_bytes_used > 0:
        workers = replace(
            workers,
            memory_bytes=_memory(metrics.worker_memory_bytes_used, defaults.memory_headroom),
        )
    replacements: list[PsReplacement] = []
    s_hat = metrics.ps_cores_per_worker
    if used_total > 0 and s_hat > 0:
        for i in hot_ps(used, current.ps.cpu_cores, defaults):
            cores = min(_up(used[i] / used_total * s_hat * n_w), budget.cpu_max_per_node)
            if cores > current.ps.cpu_cores:
                replacements.append(PsReplacement(i, cores))
    if replacements:
        detail = ", ".join(f"PS {r.ps_index} -> {r.cpu_cores:g} cores" for r in replacements)
        return _adjusted(
            current,
            workers,
            0.0,
            f"hot PS replaced with s = min((ŝ_hot/ŝ_total)*ŝ*N_w, C_max): {detail}",
            tuple(replacements),
        )
    allocated = current.ps.total_cores
    if allocated > 0 and 0 < used_total < defaults.ps_idle_utilization * allocated:
        s_new = used_total / n_w
        target = math.floor(allocated / s_new + 1e-9)
        spare = budget.cpu_total - allocated - n_w * workers.cpu_cores
        room = math.floor(spare / workers.cpu_cores + 1e-9) if workers.cpu_cores > 0 else 0
        add = max(0, min(target - n_w, room))
        if add > 0:
            per_worker = metrics.steps_per_second / n_w
            return _adjusted(
                current,
                replace(workers, count=n_w + add),
                per_worker * (n_w + add),
                f"idle PS CPU ({used_total:g} of {allocated:g} cores): ŝ = "
                f"{s_new:.3g}, workers {n_w} -> {n_w + add} (s_total/ŝ = {target}, C_total)",
            )
    return _adjusted(
        current,
        workers,
        metrics.steps_per_second,
        "no hot or idle PS: plan kept"
        + (", worker memory from observed use" if workers != current.workers else ""),
    )


def _adjusted(
    current: ResourcePlan,
    workers: NodeGroup,
    rate: float,
    reason: str,
    replacements: tuple[PsReplacement, ...] = (),
) -> ResourcePlan:
    """An ADJUST-stage plan from the optimizer: `current` with these workers and PS swaps."""
    return replace(
        current,
        stage=Stage.ADJUST,
        workers=workers,
        ps_replacements=replacements,
        source=Source.OPTIMIZER,
        predicted_steps_per_second=rate,
        reason=reason,
    )


def data_parallel_adjust(
    budget: Budget,
    metrics: PsMetrics,
    current: ResourcePlan,
    defaults: PlanDefaults = PlanDefaults(),
) -> ResourcePlan:
    """The adjust stage of a data-parallel job (no PS): each process's cores follow its
    measured use ŵ (DLRover's "new workers' resources from observed use").

    ŵ below worker_idle_utilization of its cores: cores -> ceil(ŵ * headroom), at least
    1 (the freed cores go to other jobs; the job is not slower, CPU did not limit it).
    ŵ above worker_busy_utilization: cores x2, up to C_max. Loader processes follow the
    cores; memory follows the observed peak. Otherwise the plan is kept.
    """
    w_hat, cores = metrics.worker_cores_needed, current.workers.cpu_cores
    workers = current.workers
    memory = ""
    if metrics.worker_memory_bytes_used > 0:
        sized = _memory(metrics.worker_memory_bytes_used, defaults.memory_headroom)
        if sized != workers.memory_bytes:
            was = f"{workers.memory_bytes / MIB:.0f}" if workers.memory_bytes else "unset"
            memory = f", memory {was} -> {sized / MIB:.0f} MiB (observed peak x headroom)"
            workers = replace(workers, memory_bytes=sized)
    why = "no CPU measurement yet: plan kept"
    if w_hat > 0 and cores > 0:
        use = w_hat / cores
        new = cores
        if use < defaults.worker_idle_utilization:
            new = max(_up(w_hat * defaults.memory_headroom), 1.0)
        elif use > defaults.worker_busy_utilization:
            new = max(min(cores * 2, budget.cpu_max_per_node), cores)
        if new != cores:
            why = (
                f"CPU use {w_hat:.2f} of {cores:g} cores per process ({use:.0%}): "
                f"cores {cores:g} -> {new:g}"
            )
            workers = replace(workers, cpu_cores=new, loader_procs=loader_procs_for(new, defaults))
        else:
            why = f"CPU use {w_hat:.2f} of {cores:g} cores per process ({use:.0%}): cores kept"
    return replace(
        current,
        stage=Stage.ADJUST,
        workers=workers,
        ps_replacements=(),
        source=Source.OPTIMIZER,
        predicted_steps_per_second=metrics.steps_per_second,
        reason=why + memory,
    )


@dataclass(frozen=True)
class ProcessSample:
    """One runtime sample of a training process: cores used, memory, steps/s."""

    cpu_cores_used: float
    memory_bytes_used: int
    steps_per_second: float


def metrics_from_samples(samples: Sequence[ProcessSample]) -> PsMetrics:
    """A data-parallel job's measurements from its processes' samples: ŵ the median cores
    used (robust to a slow first step), the peak memory, the median steps/s."""
    if not samples:
        return PsMetrics()
    return PsMetrics(
        worker_cores_needed=statistics.median(s.cpu_cores_used for s in samples),
        worker_memory_bytes_used=max(s.memory_bytes_used for s in samples),
        steps_per_second=statistics.median(s.steps_per_second for s in samples),
    )


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def initial_plan(
    budget: Budget,
    similar: Sequence[PastJob],
    match: str,
    defaults: PlanDefaults = PlanDefaults(),
) -> ResourcePlan:
    """The plan before a job starts: the recency-weighted configuration of similar finished
    jobs (newest weight 1, then 1/2, 1/4, ...), memory from their observed peaks, fitted to
    the budget; with no similar job, the sampling defaults.

    `similar` is newest first; `match` says how they were matched (for the reason).
    """
    past = list(similar[: defaults.history_jobs])
    if not past:
        plan = sample_plan(budget, defaults)
        return replace(
            plan, stage=Stage.INITIAL, reason="no similar job in history; " + plan.reason
        )
    weights = [0.5**i for i in range(len(past))]

    def group(pick: str) -> NodeGroup:
        groups = [getattr(p, pick) for p in past]
        if all(g.count == 0 for g in groups):  # data-parallel jobs have no PS
            return NodeGroup(0, 0.0, 0)
        peaks = [getattr(p, f"{'worker' if pick == 'workers' else 'ps'}_memory_peak") for p in past]
        memory = [
            _memory(peak, defaults.memory_headroom) if peak > 0 else g.memory_bytes
            for g, peak in zip(groups, peaks, strict=True)
        ]
        return NodeGroup(
            max(1, round(_weighted([g.count for g in groups], weights))),
            min(
                max(_up(_weighted([g.cpu_cores for g in groups], weights)), 1.0),
                max(budget.cpu_max_per_node, 1.0),
            ),
            math.ceil(_weighted(memory, weights) / MIB) * MIB,
            round(_weighted([g.loader_procs for g in groups], weights)),
        )

    workers, ps = group("workers"), group("ps")
    fitted = ""
    if workers.total_cores + ps.total_cores > budget.cpu_total:
        room = math.floor((budget.cpu_total - ps.total_cores) / workers.cpu_cores + 1e-9)
        fitted = f"; workers cut {workers.count} -> {max(room, 1)} to fit C_total"
        workers = replace(workers, count=max(room, 1))
    rates = [p.steps_per_second for p in past]
    known = [
        (r / max(p.workers.count, 1), w)
        for r, p, w in zip(rates, past, weights, strict=True)
        if r > 0
    ]
    predicted = (
        _weighted([r for r, _ in known], [w for _, w in known]) * workers.count if known else 0.0
    )
    return ResourcePlan(
        Stage.INITIAL,
        workers,
        ps,
        Source.HISTORY,
        f"from {len(past)} similar finished job(s) ({match}), newest "
        f"{past[0].job_id}, weighted by recency{fitted}",
        predicted_steps_per_second=predicted,
    )


def plan_to_dict(plan: ResourcePlan) -> dict[str, Any]:
    """A plan as JSON-able data (how plans are stored)."""
    return {
        "stage": plan.stage.value,
        "source": plan.source.value,
        "workers": asdict(plan.workers),
        "ps": asdict(plan.ps),
        "ps_replacements": [asdict(r) for r in plan.ps_replacements],
        "predicted_steps_per_second": plan.predicted_steps_per_second,
        "reason": plan.reason,
    }


def plan_from_dict(data: Mapping[str, Any]) -> ResourcePlan:
    """The inverse of plan_to_dict."""
    return ResourcePlan(
        stage=Stage(data["stage"]),
        workers=NodeGroup(**data["workers"]),
        ps=NodeGroup(**data["ps"]),
        source=Source(data["source"]),
        reason=str(data.get("reason", "")),
        ps_replacements=tuple(PsReplacement(**r) for r in data.get("ps_replacements", ())),
        predicted_steps_per_second=float(data.get("predicted_steps_per_second", 0.0)),
    )
