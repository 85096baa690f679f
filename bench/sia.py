"""Gearshift on Sia's Philly workloads, beside Sia's own simulator (issue 48 point 1, issue 49).

    python bench/sia.py --sia-data DIR [--artifact-results DIR] [--workloads ...]
        [--rounds 60,360] [--policies ...] [--json]

DIR is a fetched copy of the Sia artifact's `sia-simulator/` folder (no licence: read at run
time). Each of our policies runs every workload (gearshift.scheduler.sim.sia_trace: jobs at their
fixed batch size, num_replicas ESTs, one GPU type at a time, the artifact's restart delay per
model, first start charged) at each round length. `--artifact-results` is the folder of JSON files
bench/sia_artifact.py writes (Sia, Pollux and Gavel run in the artifact's own simulator); their
fixed-batch rows are printed beside ours. ONE table: pooled over every job of the workloads
(makespan: the workloads' mean), then the average JCT per workload.

Our rows (bench/restart_cost.py's settings): the default profile as shipped (the restart rule
on), the default profile with moves free (restartAware off, as in the papers), elastic LAS and
rigid LAS (restart rule on).
GPU-hours are the device-seconds the jobs held (restarts included); the artifact charges every
round a job holds devices in whole, the round it ends in included (docs/results/sia.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.restart_cost import POLICIES, run
from bench.sia_artifact import load_results, pool
from gearshift.scheduler.sim.sia_cli import gpu_hours, pooled
from gearshift.scheduler.sim.sia_trace import SiaWorkload, load_sia_workload
from gearshift.scheduler.sim.simulator import SimulationResult

WORKLOADS = "philly/workload-1,philly/workload-2,philly/workload-3"
# label -> (restart_cost.POLICIES label, restart rule on)
OURS: dict[str, tuple[str, bool]] = {
    "default profile": ("default profile", True),
    "default moves-free": ("default profile", False),
    "elastic LAS": ("elastic LAS", True),
    "rigid LAS": ("rigid LAS", True),
}
ARTIFACT = ("sia", "pollux", "gavel")


def run_ours(
    workloads: Sequence[SiaWorkload], label: str, round_seconds: float
) -> list[SimulationResult]:
    policy, aware = OURS[label]
    return [
        run(
            w.jobs,
            w.table,
            policy,
            round_seconds=round_seconds,
            restart_seconds=30.0,  # any model the prior misses: the artifact's default
            restart_aware=aware,
            cluster=w.cluster,
            prior=w.restart_prior,
        )
        for w in workloads
    ]


def our_row(
    label: str,
    round_seconds: float,
    results: Sequence[SimulationResult],
    devices: int,
    names: Sequence[str],
) -> dict[str, Any]:
    p = pooled(results, devices)
    return {
        "policy": label,
        "source": "gearshift",
        "round_seconds": round_seconds,
        "n_jobs": p.jobs,
        "avg_jct_h": p.average_jct / 3600,
        "p99_jct_h": p.p99_jct / 3600,
        "makespan_h": p.makespan / 3600,
        "gpu_hours_per_job": p.gpu_hours_per_job,
        "restarts_per_job": p.rescales_per_job,
        "per_workload_avg_jct_h": {
            n: r.average_jct / 3600 for n, r in zip(names, results, strict=True)
        },
        "gpu_hours_per_workload": {
            n: gpu_hours(r, devices) for n, r in zip(names, results, strict=True)
        },
    }


def artifact_rows(folder: Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """The artifact's fixed-batch runs of these workloads, pooled per policy."""
    by_policy: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in load_results(folder):
        if result["fixed_bsz"] and result["workload"] in names:
            by_policy[result["policy"]].append(result)
    rows = []
    for policy in ARTIFACT:
        runs = by_policy.get(policy, [])
        if not runs:
            continue
        row = pool(runs)
        missing = sorted(set(names) - {r["workload"] for r in runs})
        rows.append(
            {
                **row,
                "policy": f"{policy} (artifact)"
                + (f", lacks {', '.join(missing)}" if missing else ""),
                "source": "sia-artifact",
                "round_seconds": 360.0 if policy == "gavel" else 60.0,
                "per_workload_avg_jct_h": {r["workload"]: r["avg_jct_h"] for r in runs},
            }
        )
    return rows


def by_model(
    workloads: Sequence[SiaWorkload],
    results: Sequence[SimulationResult],
    artifact: Path | None,
) -> dict[str, dict[str, float]]:
    """Average JCT (h) per model: ours (one row's runs) and Sia's fixed-batch runs, same jobs."""
    ours: dict[str, list[float]] = defaultdict(list)
    for w, r in zip(workloads, results, strict=True):
        for job in r.jobs:
            ours[w.jobs[int(job.job_id)].job_type.split(" ")[0]].append(job.jct)
    theirs: dict[str, list[float]] = defaultdict(list)
    if artifact is not None:
        names = {w.name for w in workloads}
        for result in load_results(artifact):
            if result["policy"] == "sia" and result["fixed_bsz"] and result["workload"] in names:
                for job in result["jobs"]:
                    theirs[job["name"].rsplit("-", 1)[0]].append(job["jct_s"])
    return {
        model: {
            "jobs": len(jcts),
            "ours_h": sum(jcts) / len(jcts) / 3600,
            **({"sia_h": sum(theirs[model]) / len(theirs[model]) / 3600} if theirs[model] else {}),
        }
        for model, jcts in sorted(ours.items())
    }


def render(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    short = [n.rsplit("-", 1)[-1] for n in names]
    head = (
        f"{'ROW':<34} {'ROUND s':>7} {'AVG JCT h':>9} {'P99 JCT h':>9} {'MAKESPAN h':>10} "
        f"{'GPU h/JOB':>9} {'RESTARTS/JOB':>12} " + " ".join(f"{'w' + s:>6}" for s in short)
    )
    lines = [f"pooled over {', '.join(names)} (avg JCT per workload at the right)", head]
    for r in rows:
        per = r.get("per_workload_avg_jct_h", {})
        lines.append(
            f"{r['policy']:<34} {r['round_seconds']:>7.0f} {r['avg_jct_h']:>9.3f} "
            f"{r['p99_jct_h']:>9.2f} {r['makespan_h']:>10.2f} {r['gpu_hours_per_job']:>9.2f} "
            f"{r['restarts_per_job']:>12.2f} "
            + " ".join(f"{per[n]:>6.3f}" if n in per else f"{'-':>6}" for n in names)
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sia-data", type=Path, required=True, help="the artifact's sia-simulator/"
    )
    parser.add_argument(
        "--artifact-results", type=Path, help="bench/sia_artifact.py's results folder"
    )
    parser.add_argument("--workloads", default=WORKLOADS)
    parser.add_argument("--rounds", default="60,360", help="round lengths, seconds")
    parser.add_argument("--policies", default=",".join(OURS))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    labels = [p.strip() for p in args.policies.split(",")]
    for label in labels:
        if label not in OURS:
            parser.error(f"--policies: {label!r} is not one of {', '.join(OURS)}")
    assert all(OURS[label][0] in POLICIES for label in labels)
    workloads = [load_sia_workload(args.sia_data, n) for n in names]
    devices = sum(workloads[0].cluster.values())
    rows: list[dict[str, Any]] = []
    models: dict[str, Any] = {}
    for seconds in (float(s) for s in args.rounds.split(",")):
        for label in labels:
            results = run_ours(workloads, label, seconds)
            rows.append(our_row(label, seconds, results, devices, names))
            models[f"{label} @ {seconds:.0f} s"] = by_model(
                workloads, results, args.artifact_results
            )
            print(render(rows[-1:], names).splitlines()[-1], file=sys.stderr, flush=True)
    if args.artifact_results is not None:
        rows += artifact_rows(args.artifact_results, names)
    if args.json:
        print(json.dumps({"rows": rows, "avg_jct_h_by_model": models}, indent=2))
    else:
        print(render(rows, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
