"""How close the estimated start (sim/forward.py) comes to the start that then happens.

    python bench/estimated_start.py [--jobs 200] [--jobs-per-hour 8] [--seeds 3] [--json FILE]

A generated workload (Gavel section 7.1, Poisson arrivals) runs through the simulator under
the scheduler's default profile on a small cluster, so that jobs queue. At every
`--every` hours of simulated time the round's snapshot is taken, and the estimator runs
forward from it (a fresh allocator, as the live scheduler's estimates do: no future
arrivals, no memory of past rounds); each job waiting there (new, or preempted) is then
compared with its next start in the full run. Prints the median and p90 of the relative error
|estimate - start| / max(start - snapshot time, 1 s) and of the absolute error in hours, and the
estimator's wall time per snapshot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.common.gavel import load_throughputs
from gearshift.scheduler.plugins.stages import allocator_for
from gearshift.scheduler.sim.forward import Bounds, copy_allocator, estimate_starts
from gearshift.scheduler.sim.simulate import DEFAULT_PROFILE, profile_of
from gearshift.scheduler.sim.simulator import Multiplexed, simulate_pipeline
from gearshift.scheduler.sim.trace import generate_workload
from gearshift.scheduler.types import Allocator, Assignment, Snapshot

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel"
CLUSTER = {"v100": 4, "p100": 4, "k80": 8}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    table = load_throughputs(args.data / "simulation_throughputs.json")
    workload = generate_workload(table, args.jobs, args.jobs_per_hour, seed=seed)
    settings = profile_of(DEFAULT_PROFILE).settings
    multiplexed = Multiplexed()
    taken: list[tuple[Snapshot, dict[str, Assignment], Allocator | None]] = []
    allocator = allocator_for(settings)
    placed_at: dict[str, list[float]] = {}  # job -> the rounds that gave it devices
    next_at = [args.every * 3600.0]

    def take(snapshot: Snapshot, current: Mapping[str, Assignment]) -> None:
        if snapshot.now >= next_at[0]:
            next_at[0] = snapshot.now + args.every * 3600.0
            copy = copy_allocator(allocator) if args.copy else None
            taken.append((snapshot, {j: list(a) for j, a in current.items()}, copy))

    def placed(now: float, configs: Mapping[str, object]) -> None:
        for job_id in configs:
            placed_at.setdefault(job_id, []).append(now)

    simulate_pipeline(
        workload,
        CLUSTER,
        table,
        allocator,
        round_seconds=settings.round_seconds,
        rescale_seconds=settings.restart_seconds,
        elastic=True,
        determinism="auto",
        multiplexed=multiplexed,
        on_snapshot=take,
        on_round=placed,
    )
    relative: list[float] = []
    absolute: list[float] = []
    walls: list[float] = []
    missing = 0
    bounds = Bounds(round_seconds=settings.round_seconds, max_rounds=2000, budget_seconds=60.0)
    for snapshot, current, copied in taken:
        began = time.perf_counter()
        forward = copied or allocator_for(settings)
        estimates = estimate_starts(snapshot, current, forward, bounds, multiplexed.collocator())
        walls.append(time.perf_counter() - began)
        for job in snapshot.jobs:
            if current.get(job.job_id):
                continue
            # its next start: the first round from this one on that gave it devices
            actual = next((t for t in placed_at.get(job.job_id, ()) if t >= snapshot.now), None)
            if actual is None:
                continue
            if job.job_id not in estimates:
                missing += 1
                continue
            error = abs(estimates[job.job_id] - actual)
            relative.append(error / max(actual - snapshot.now, 1.0))
            absolute.append(error / 3600.0)
    return {"relative": relative, "absolute_h": absolute, "walls": walls, "missing": missing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--jobs-per-hour", type=float, default=8.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--every", type=float, default=2.0, help="hours between snapshots")
    parser.add_argument("--data", type=Path, default=DATA, help="Gavel's data folder")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--copy",
        action="store_true",
        help="run forward a copy of the live allocator, not a fresh one",
    )
    args = parser.parse_args(argv)
    relative: list[float] = []
    absolute: list[float] = []
    walls: list[float] = []
    missing = 0
    for seed in range(args.seeds):
        out = one_seed(args, seed)
        relative += out["relative"]
        absolute += out["absolute_h"]
        walls += out["walls"]
        missing += out["missing"]
    summary = {
        "waiting_jobs_compared": len(relative),
        "without_estimate": missing,
        "median_relative_error": statistics.median(relative) if relative else None,
        "p90_relative_error": percentile(relative, 0.9) if relative else None,
        "median_abs_error_h": statistics.median(absolute) if absolute else None,
        "p90_abs_error_h": percentile(absolute, 0.9) if absolute else None,
        "estimator_wall_s_median": statistics.median(walls) if walls else None,
        "estimator_wall_s_max": max(walls) if walls else None,
        "snapshots": len(walls),
    }
    for key, value in summary.items():
        print(f"{key:<28} {value if not isinstance(value, float) else round(value, 3)}")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
