"""`python -m gearshift.scheduler.simulate` (and `gearshift simulate`): run a workload through the
scheduler's policies and mechanism on simulated time.

    gearshift simulate --trace FILE --throughputs FILE --cluster v100=8,p100=16,k80=24 \\
        --policy max_min_fairness_perf [--round 360] [--seed S] [--elastic] [--json]

The workload is a Gavel trace (10 tab-separated fields per job) or, with
--generate N, a Poisson workload generated as in Gavel's evaluation (section
7.1), optionally saved with --write-trace. Prints average JCT, makespan,
utilization and every job's completion time (JSON with --json).

Exit codes: 0 done; 1 the workload cannot finish on the cluster; 2 bad usage
or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import load_throughputs
from gearshift.scheduler.elastic import ELASTIC_POLICIES, make_elastic_policy
from gearshift.scheduler.policies import describe, make_policy, policy_names
from gearshift.scheduler.simulator import (
    GAVEL_RECOMPUTE_SECONDS,
    SimulationError,
    SimulationResult,
    simulate,
    simulate_elastic,
)
from gearshift.scheduler.trace import generate_workload, read_trace, write_trace

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_CLUSTER = "v100=8,p100=16,k80=24"


def parse_cluster(text: str, field: str = "--cluster") -> dict[str, int]:
    """ "v100=8,p100=16,k80=24" -> {"v100": 8, ...}; also Gavel's "8:16:24" (v100:p100:k80)."""
    out: dict[str, int] = {}
    if "=" not in text and ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ValidationError(field, f"{text!r}: Gavel's form is #v100:#p100:#k80")
        text = ",".join(f"{t}={n}" for t, n in zip(("v100", "p100", "k80"), parts, strict=True))
    for item in text.split(","):
        name, sep, count = item.strip().partition("=")
        if not sep or not name or not count.strip().isdigit():
            raise ValidationError(field, f"{item!r} is not TYPE=COUNT")
        if name in out:
            raise ValidationError(field, f"{name!r} is listed twice")
        out[name.strip()] = int(count)
    if sum(out.values()) <= 0:
        raise ValidationError(field, "the cluster has no devices")
    return out


def build_parser() -> argparse.ArgumentParser:
    names = [*policy_names(), *ELASTIC_POLICIES]
    parser = argparse.ArgumentParser(
        prog="gearshift simulate",
        description="Simulate a workload with the scheduler's policies and round mechanism.",
        epilog="Policies: "
        + "; ".join(f"{n} ({describe(n)})" for n in policy_names())
        + "; easyscale, easyscale_homo (elastic EST jobs, EasyScale's greedy inter-job "
        "policy, heterogeneous or one type per job); yarn_cs (rigid FIFO gang baseline).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="Gavel trace file (10 tab-separated fields)")
    source.add_argument(
        "--generate", type=int, metavar="N", help="generate N jobs (Gavel section 7.1)"
    )
    parser.add_argument("--throughputs", type=Path, required=True, help="Gavel's throughputs JSON")
    parser.add_argument(
        "--cluster",
        default=DEFAULT_CLUSTER,
        help="devices per type, TYPE=COUNT,... (or Gavel's #v100:#p100:#k80)",
    )
    parser.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help=f"one of: {', '.join(sorted(names))} (default max_min_fairness_perf; "
        "easyscale with --elastic)",
    )
    parser.add_argument("--round", type=float, default=360.0, help="round length, seconds")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="jobs are elastic EST jobs (N = scale factor ESTs, 1..N devices of any types)",
    )
    parser.add_argument(
        "--recompute-seconds",
        type=float,
        default=GAVEL_RECOMPUTE_SECONDS,
        help="least time between allocation recomputations (Gavel's simulator: 1920)",
    )
    parser.add_argument(
        "--rescale-seconds",
        type=float,
        default=10.0,
        help="elastic jobs: seconds without progress when a job checkpoints and restarts",
    )
    parser.add_argument(
        "--jobs-per-hour", type=float, default=1.0, help="--generate: Poisson arrival rate"
    )
    parser.add_argument(
        "--single-gpu", action="store_true", help="--generate: every job on one device"
    )
    parser.add_argument(
        "--start-with", type=int, default=0, help="--generate: jobs present at time 0"
    )
    parser.add_argument("--write-trace", type=Path, help="save the workload as a Gavel trace")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def run(args: argparse.Namespace) -> SimulationResult:
    """Run the simulation the arguments describe; ValidationError on bad input."""
    cluster = parse_cluster(args.cluster)
    if args.round <= 0:
        raise ValidationError("--round", f"must be > 0 (got {args.round})")
    table = load_throughputs(args.throughputs)
    if args.trace is not None:
        workload = read_trace(args.trace)
    else:
        workload = generate_workload(
            table,
            args.generate,
            args.jobs_per_hour,
            seed=args.seed,
            multi_gpu=not args.single_gpu,
            start_with=args.start_with,
        )
    if not workload:
        raise ValidationError("--trace", "the workload has no jobs")
    unknown = sorted({t for t in cluster if t not in table.worker_types})
    if unknown:
        raise ValidationError("--cluster", f"no throughputs for types {unknown}")
    if args.write_trace is not None:
        write_trace(workload, args.write_trace)
    name = args.policy or ("easyscale" if args.elastic else "max_min_fairness_perf")
    if name in ELASTIC_POLICIES:
        return simulate_elastic(
            workload,
            cluster,
            table,
            make_elastic_policy(name),
            rescale_seconds=args.rescale_seconds,
        )
    if args.elastic:
        raise ValidationError(
            "--policy", f"--elastic runs one of {', '.join(ELASTIC_POLICIES)} (got {name!r})"
        )
    policy = make_policy(name, seed=args.seed, field="--policy")
    return simulate(
        workload,
        cluster,
        table,
        policy,
        round_seconds=args.round,
        seed=args.seed,
        min_recompute_seconds=args.recompute_seconds,
        space_sharing=name.endswith("packed"),
    )


def render(result: SimulationResult) -> str:
    lines = [
        f"policy:             {result.policy}",
        f"jobs:               {len(result.jobs)}",
        f"average JCT:        {result.average_jct:,.1f} s ({result.average_jct / 3600:.2f} h)",
        f"makespan:           {result.makespan:,.1f} s ({result.makespan / 3600:.2f} h)",
        f"utilization:        {result.utilization:.3f}",
        f"rounds:             {result.rounds}",
        f"allocations:        {result.allocations}",
    ]
    if result.rescales:
        lines.append(f"rescales:           {result.rescales}")
    lines.append(f"simulated in:       {result.wall_seconds:.1f} s")
    lines.append("")
    lines.append(f"{'JOB':>5}  {'TYPE':<34} {'GPUS':>4} {'ARRIVAL':>10} {'FINISH':>11} {'JCT':>11}")
    for job in result.jobs:
        lines.append(
            f"{job.job_id:>5}  {job.job_type:<34} {job.scale_factor:>4} "
            f"{job.arrival_time:>10.0f} {job.finish_time:>11.1f} {job.jct:>11.1f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except ValidationError as exc:
        print(f"gearshift simulate: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except SimulationError as exc:
        print(f"gearshift simulate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
