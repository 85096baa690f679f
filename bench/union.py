"""The default profile against the seeds alone, simulated on the same workloads in one run.

    python bench/union.py [--generated 3] [--jobs 200] [--jobs-per-hour 4] [--json FILE]

Every job elastic (N = its scale factor ESTs, 1..N devices), on Gavel's 48-GPU cluster
(v100=8, p100=16, k80=24), through `gearshift simulate`'s pipeline:
- Gavel's public trace (shared/data/gavel/max_min_fairness.trace, 96 jobs), and
- --generated workloads of --jobs jobs each (Gavel section 7.1, Poisson arrivals at
  --jobs-per-hour, seeds 0, 1, 2, ...),
each under the scheduler's default profile (`default`: elastic LAS with the round bounds
and DeepPool's multiplexing) and the configuration files of bench/profiles/: elastic LAS
alone, rigid LAS (Gavel) and EasyScale's greedy allocator (the scheduler's old default).
Prints average and p99 JCT per workload and profile, and the default's average JCT over
elastic LAS's (target <= 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.scheduler.sim.simulate import parse_args, run

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel"
PROFILES = Path(__file__).resolve().parent / "profiles"
CONFIGS = [
    "default",
    *(str(PROFILES / f"{n}.yaml") for n in ("elastic-las", "rigid-las", "easyscale")),
]
CLUSTER = "v100=8,p100=16,k80=24"
NAMES = {"elastic-las": "elastic las", "rigid-las": "rigid las"}


def simulate(workload: list[str], data: Path) -> dict[str, dict[str, float]]:
    """{policy: {avg_jct_h, p99_jct_h, rescales}} of one workload."""
    args = parse_args(
        [
            *workload,
            *("--throughputs", str(data / "simulation_throughputs.json")),
            *("--cluster", CLUSTER),
            *(flag for config in CONFIGS for flag in ("--config", config)),
        ]
    )
    out: dict[str, dict[str, float]] = {}
    for result in run(args):
        source = result.policy.split(" (")[0]
        key = NAMES.get(source, source)
        out[key] = {
            "avg_jct_h": result.average_jct / 3600,
            "p99_jct_h": result.p99_jct / 3600,
            "rescales": float(result.rescales),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--generated", type=int, default=3, help="generated workloads")
    parser.add_argument("--jobs", type=int, default=200, help="jobs in each generated one")
    parser.add_argument("--jobs-per-hour", type=float, default=4.0)
    parser.add_argument("--data", type=Path, default=DATA, help="Gavel's data folder")
    parser.add_argument("--no-trace", action="store_true", help="skip Gavel's trace")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    workloads: list[tuple[str, list[str]]] = []
    if not args.no_trace:
        workloads.append(("gavel trace", ["--trace", str(args.data / "max_min_fairness.trace")]))
    for seed in range(args.generated):
        workloads.append(
            (
                f"generated s{seed}",
                [
                    *("--generate", str(args.jobs), "--seed", str(seed)),
                    *("--jobs-per-hour", str(args.jobs_per_hour)),
                ],
            )
        )
    rows: dict[str, Any] = {}
    print(f"{'WORKLOAD':<14} {'POLICY':<12} {'AVG JCT h':>9} {'P99 JCT h':>9} {'RESCALES':>8}")
    for name, workload in workloads:
        rows[name] = simulate(workload, args.data)
        for policy, r in rows[name].items():
            print(
                f"{name:<14} {policy:<12} {r['avg_jct_h']:>9.2f} {r['p99_jct_h']:>9.2f} "
                f"{r['rescales']:>8.0f}"
            )
        ratio = rows[name]["default"]["avg_jct_h"] / rows[name]["elastic las"]["avg_jct_h"]
        rows[name]["default_over_elastic_las"] = ratio
        print(f"{name:<14} default / elastic LAS average JCT: {ratio:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
