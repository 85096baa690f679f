"""`gearshift simulate --trace-format sia --sia-data DIR [--workload philly/workload-1,...]`: Sia's
workloads (gearshift.scheduler.sim.sia_trace) through the same profiles as a Gavel trace, one
run per workload and profile, with the artifact's restart delays per model as the restart prior
(first start charged) and each job on one GPU type at a time. Several workloads print one block
each and a pooled line per profile (every job of every workload together)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.scheduler.sim.sia_trace import DEFAULT_WORKLOAD, SiaWorkload, load_sia_workload
from gearshift.scheduler.sim.simulator import SimulationResult


def sia_workloads(
    data: Path | None, names: str | None, trace: Path | None, cluster: dict[str, int] | None
) -> list[SiaWorkload]:
    """The workloads --trace (a CSV) or --workload (names under DIR/workloads) give."""
    if data is None:
        raise ValidationError("--sia-data", "--trace-format sia needs the artifact's folder")
    if trace is not None and names:
        raise ValidationError(
            "--workload", "give a workload by --trace FILE or --workload, not both"
        )
    chosen = (
        [str(trace)]
        if trace is not None
        else [n.strip() for n in (names or DEFAULT_WORKLOAD).split(",") if n.strip()]
    )
    if not chosen:
        raise ValidationError("--workload", "names no workload")
    return [load_sia_workload(data, name, cluster) for name in chosen]


@dataclass(frozen=True)
class Pooled:
    """One profile's figures over every job of several workloads."""

    policy: str
    jobs: int
    average_jct: float
    p99_jct: float
    makespan: float  # the workloads' mean
    gpu_hours_per_job: float
    rescales_per_job: float


def gpu_hours(result: SimulationResult, devices: int) -> float:
    """Device-hours the run's jobs held (restarts included)."""
    return result.utilization * devices * result.makespan / 3600.0


def pooled(runs: Sequence[SimulationResult], devices: int) -> Pooled:
    """Every job of `runs` (one profile on several workloads) together."""
    jcts = sorted(j.jct for r in runs for j in r.jobs)
    n = len(jcts)
    return Pooled(
        policy=runs[0].policy,
        jobs=n,
        average_jct=sum(jcts) / n,
        p99_jct=jcts[min(n - 1, math.ceil(0.99 * n) - 1)],
        makespan=sum(r.makespan for r in runs) / len(runs),
        gpu_hours_per_job=sum(gpu_hours(r, devices) for r in runs) / n,
        rescales_per_job=sum(j.rescales for r in runs for j in r.jobs) / n,
    )


def render_pooled(rows: Sequence[Pooled]) -> str:
    lines = [
        f"{'POOLED':<34} {'JOBS':>5} {'AVG JCT h':>9} {'P99 JCT h':>9} {'MAKESPAN h':>10} "
        f"{'GPU h/JOB':>9} {'RESCALES/JOB':>12}"
    ]
    for p in rows:
        lines.append(
            f"{p.policy:<34} {p.jobs:>5} {p.average_jct / 3600:>9.2f} {p.p99_jct / 3600:>9.2f} "
            f"{p.makespan / 3600:>10.2f} {p.gpu_hours_per_job:>9.2f} {p.rescales_per_job:>12.2f}"
        )
    return "\n".join(lines)
