"""Scheduler benchmarks: policy solve times and simulation speed, measured in one run.

    python bench/policies.py [--sizes 32,256,1024,2048] [--repeat 3] [--sim-jobs 1000]

1. Solve time of heterogeneity-aware LAS and of hierarchical water filling at each
   size: jobs drawn from Gavel's 26 job types (throughputs file in shared/data/gavel),
   a cluster of jobs/4 devices of each of 3 types (k80, p100, v100); water filling
   with 5 entities of weights 1-3 (fairness inside). Each time is the whole
   policy call (building the cvxpy problems and solving them), the median of
   --repeat runs. Baseline, side by side: LAS with every job made distinct (its
   throughputs jittered by up to 1%) so that no two jobs share a row of X - what
   the solve costs without Gavel's grouping of interchangeable jobs.
   Targets: LAS at 2,048 jobs < 0.2 s; water filling at 2,048 jobs < 10 s.
2. Elastic LAS: one allocate stage (configurations, the LP over them, the round
   mechanism's selection and fill) for N elastic EST jobs of Gavel's job types (N =
   scale factor ESTs, 1..N devices; D2 where EasyScale's rule allows, so those mix
   types) on the same cluster, side by side with rigid LAS's allocate stage on the
   same jobs. Target: <= 1 s at 2,048 jobs.
3. Simulation speed: a generated 1,000-job continuous multi-GPU trace (Gavel section
   7.1) through the round simulator with heterogeneity-aware LAS, and through the
   elastic EasyScale simulator. Target: < 60 s.

The CPU is shared: figures are what one run measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shared import shared_data
from gearshift.common.gavel import ThroughputTable, load_throughputs
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.easyscale.elastic import make_elastic_policy
from gearshift.scheduler.plugins.gavel.policies import make_policy
from gearshift.scheduler.plugins.gavel.policies.base import PolicyInput
from gearshift.scheduler.sim.simulator import (
    _Running,
    _snapshot,
    cluster_devices,
    sim_job,
    simulate,
    simulate_elastic,
)
from gearshift.scheduler.sim.trace import generate_workload
from gearshift.scheduler.types import Snapshot

TYPES = ("k80", "p100", "v100")
CLUSTER = {"v100": 8, "p100": 16, "k80": 24}
DEFAULT_DATA = shared_data("gavel")


def problem(table: ThroughputTable, jobs: int, seed: int, distinct: bool) -> PolicyInput:
    rng = np.random.default_rng(seed)
    keys = [k for k in table.job_keys if k.scale_factor == 1]
    chosen = [keys[i] for i in rng.integers(len(keys), size=jobs)]
    throughputs = np.array([[table.throughput(k, t) for t in TYPES] for k in chosen])
    if distinct:
        throughputs *= rng.uniform(0.99, 1.01, size=throughputs.shape)
    entities = [f"e{i % 5}" for i in range(jobs)]
    return PolicyInput.create(
        [f"j{i}" for i in range(jobs)],
        TYPES,
        throughputs,
        [jobs / 4] * 3,
        entities=entities,
        entity_weights={"e0": 1.0, "e1": 2.0, "e2": 3.0, "e3": 1.5, "e4": 2.5},
    )


def elastic_snapshot(table: ThroughputTable, jobs: int, seed: int, elastic: bool) -> Snapshot:
    """`jobs` Gavel trace jobs (multi-GPU mix) on jobs/4 devices of each type, none running."""
    workload = generate_workload(table, jobs, jobs_per_hour=4.0, seed=seed)
    capacity = {t: max(jobs // 4, 1) for t in TYPES}
    runs = [
        _Running(sim_job(table, str(i), j, TYPES, elastic=elastic, determinism="auto"), 1e6)
        for i, j in enumerate(workload)
    ]
    return Snapshot(
        0.0, tuple(cluster_devices(capacity)), tuple(_snapshot(r, {}, 10.0) for r in runs)
    )


def allocate_once(table: ThroughputTable, jobs: int, elastic: bool) -> Callable[[], object]:
    snapshot = elastic_snapshot(table, jobs, jobs, elastic)

    def run() -> object:  # a fresh allocator: its first round solves the LP
        return make_allocator("las", elastic=elastic).allocate(snapshot)

    return run


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32,256,1024,2048")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--wf-repeat", type=int, default=1)
    parser.add_argument("--sim-jobs", type=int, default=1000)
    parser.add_argument("--jobs-per-hour", type=float, default=2.0)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    table = load_throughputs(args.data / "simulation_throughputs.json")
    sizes = [int(s) for s in args.sizes.split(",")]
    las = make_policy("max_min_fairness_perf")
    hierarchical = make_policy("hierarchical")
    rows = []
    make_policy("las").allocate(problem(table, 8, 0, False))  # load the solvers once
    print(f"{'jobs':>6} {'LAS s':>9} {'LAS distinct s':>15} {'ratio':>7} {'water filling s':>16}")
    for size in sizes:
        grouped = problem(table, size, size, distinct=False)
        distinct = problem(table, size, size, distinct=True)
        t_las = timed(partial(las.allocate, grouped), args.repeat)
        t_plain = timed(partial(las.allocate, distinct), args.repeat)
        t_wf = timed(partial(hierarchical.allocate, grouped), args.wf_repeat)
        rows.append(
            {"jobs": size, "las_s": t_las, "las_distinct_s": t_plain, "water_filling_s": t_wf}
        )
        print(f"{size:>6} {t_las:>9.3f} {t_plain:>15.3f} {t_plain / t_las:>6.1f}x {t_wf:>16.2f}")
    last = rows[-1]
    if last["jobs"] == 2048:
        print(
            f"targets at 2048 jobs: LAS {last['las_s']:.3f} s "
            f"({'met' if last['las_s'] < 0.2 else 'MISSED'} < 0.2 s; distinct jobs "
            f"{last['las_distinct_s']:.3f} s), water filling {last['water_filling_s']:.2f} s "
            f"({'met' if last['water_filling_s'] < 10 else 'MISSED'} < 10 s)"
        )
    print(f"\n{'jobs':>6} {'elastic LAS s':>14} {'rigid LAS s':>12} {'ratio':>7}")
    elastic_rows = []
    for size in sizes:
        t_elastic = timed(allocate_once(table, size, elastic=True), args.repeat)
        t_rigid = timed(allocate_once(table, size, elastic=False), args.repeat)
        elastic_rows.append({"jobs": size, "elastic_las_s": t_elastic, "rigid_las_s": t_rigid})
        print(f"{size:>6} {t_elastic:>14.3f} {t_rigid:>12.3f} {t_elastic / t_rigid:>6.1f}x")
    if elastic_rows[-1]["jobs"] == 2048:
        t = elastic_rows[-1]["elastic_las_s"]
        print(
            f"target at 2048 jobs: elastic LAS {t:.3f} s ({'met' if t <= 1 else 'MISSED'} <= 1 s)"
        )
    sim: dict[str, float] = {}
    if args.sim_jobs:
        workload = generate_workload(table, args.sim_jobs, args.jobs_per_hour, seed=0)
        result = simulate(workload, CLUSTER, table, make_policy("max_min_fairness_perf"))
        sim["las_wall_s"] = result.wall_seconds
        sim["las_rounds"] = result.rounds
        elastic = simulate_elastic(workload, CLUSTER, table, make_elastic_policy("easyscale"))
        sim["easyscale_wall_s"] = elastic.wall_seconds
        print(
            f"simulation of {args.sim_jobs} jobs ({args.jobs_per_hour:g}/h, "
            "v100=8,p100=16,k80=24): "
            f"LAS {result.wall_seconds:.1f} s for {result.rounds} rounds "
            f"({'met' if result.wall_seconds < 60 else 'MISSED'} < 60 s), "
            f"EasyScale {elastic.wall_seconds:.1f} s"
        )
    if args.json:
        print(json.dumps({"policies": rows, "elastic": elastic_rows, "simulation": sim}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
