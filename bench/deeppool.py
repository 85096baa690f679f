"""DeepPool planner benchmark: search time against the paper's Table 3.

    python bench/deeppool.py [--repeat 5] [--amp-limit 2.0] [--json]

The burst-parallel planner (gearshift.brain.deeppool.plan) for VGG-16, WRN-101-2 and
Inception-v3 from the paper's A100 profiles (shared/data/deeppool), at 8 and 1,024
devices (counts 1, 2, 4, ... up to that), printed beside Table 3's single-threaded Python
times and the ratio (paper / ours). Each time is one whole plan() call - cost arrays, graph
reduction, DP, backtrace and the plan's evaluation - the median of --repeat runs; parsing
the .prof file is not counted. The global batch is the profile's largest batch (64, 32,
64) or the device count when larger, so that every count gets at least one sample (times
at per-device batches above the measured ones grow in proportion). A last column times
Inception-v3's optional parallel branches.
Target: >= 10x faster than Table 3 at 1,024 devices.

The CPU is shared: figures are what one run measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shared import shared_data
from gearshift.brain.deeppool import LayerGraph, load_prof, plan

DEFAULT_DATA = shared_data("deeppool")
# model, file, Table 3 seconds at 8 and at 1,024 GPUs
MODELS = (
    ("VGG-16", "A100_vgg.prof", {8: 0.01, 1024: 0.05}),
    ("WideResNet-101-2", "A100_wrn.prof", {8: 0.02, 1024: 0.11}),
    ("Inception-v3", "A100_inception.prof", {8: 0.22, 1024: 3.23}),
)
SCALES = (8, 1024)
TARGET = 10.0


def time_plan(graph: LayerGraph, amp_limit: float, repeat: int, parallel: bool) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        plan(graph, amp_limit=amp_limit, parallel_branches=parallel)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--amp-limit", type=float, default=2.0)
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args()
    if not (args.data / "A100_vgg.prof").exists():
        print(f"DeepPool profiles not found in {args.data} (set GEARSHIFT_SHARED_DIR)")
        return 2

    rows = []
    ratios_at_1024 = []
    print(f"amplification limit {args.amp_limit}; median of {args.repeat} runs\n")
    header = (
        f"{'model':<17} {'devices':>7} {'layers':>6} {'ours s':>9} {'Table 3 s':>9} "
        f"{'ratio':>7} {'parallel s':>10} {'iter ms':>8} {'amp':>5}"
    )
    print(header)
    for name, file, paper in MODELS:
        for devices in SCALES:
            path = args.data / file
            batch = max(load_prof(path).global_batch, devices)
            graph = load_prof(path, global_batch=batch, max_devices=devices)
            plan(graph, amp_limit=args.amp_limit)  # warm-up
            ours = time_plan(graph, args.amp_limit, args.repeat, parallel=False)
            with_par = time_plan(graph, args.amp_limit, args.repeat, parallel=True)
            best = plan(graph, amp_limit=args.amp_limit)
            ratio = paper[devices] / ours
            if devices == 1024:
                ratios_at_1024.append(ratio)
            rows.append(
                {
                    "model": name,
                    "devices": devices,
                    "global_batch": batch,
                    "layers": graph.num_layers,
                    "seconds": ours,
                    "seconds_parallel_branches": with_par,
                    "table3_seconds": paper[devices],
                    "ratio": ratio,
                    "iteration_ms": best.iteration_time * 1e3,
                    "amplification": best.amplification,
                }
            )
            print(
                f"{name:<17} {devices:>7} {graph.num_layers:>6} {ours:>9.4f} "
                f"{paper[devices]:>9.2f} {ratio:>6.0f}x {with_par:>10.4f} "
                f"{best.iteration_time * 1e3:>8.2f} {best.amplification:>5.2f}"
            )
    worst = min(ratios_at_1024)
    verdict = "met" if worst >= TARGET else "NOT met"
    print(f"\nslowest ratio at 1,024 devices: {worst:.0f}x (target >= {TARGET:.0f}x: {verdict})")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
