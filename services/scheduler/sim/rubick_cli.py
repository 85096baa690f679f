"""`gearshift simulate --trace-format rubick` / `--workload rubick`: Rubick's traces (or
generated ones like them) under `rubick`, `rubick_e`, `rubick_r` and `rubick_n`, one row
per policy, with the guaranteed and best-effort JCTs apart and the worst guarantee ratio.
Gavel's policies run beside them from the same iteration times (`--compare
rubick,max_min_fairness_perf,elastic:las`; gearshift.scheduler.sim.rubick_gavel).
`--overheads rubick-artifact` runs the artifact simulator's clock (60 s rounds, 260 s per
placement) and `--rubick-reclaim off` its policy's reclaim loop that never runs
(docs/papers/rubick.md compares both modes with Table 4)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.common.rubick.perf import load_perf
from gearshift.scheduler.plugins.gavel.policies import make_policy
from gearshift.scheduler.plugins.rubick.rubick_policy import VARIANTS, make_rubick
from gearshift.scheduler.sim.rubick_gavel import run_gavel
from gearshift.scheduler.sim.rubick_sim import (
    ARTIFACT_OVERHEADS,
    RECONFIGURE_SECONDS,
    Overheads,
    RubickRun,
    simulate_rubick,
)
from gearshift.scheduler.sim.rubick_trace import (
    generate_rubick_workload,
    parse_tenants,
    read_rubick_trace,
    write_rubick_trace,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
DEFAULT_DATA = Path(os.environ.get("GEARSHIFT_SHARED_DIR", SHARED)) / "data" / "rubick"
DEFAULT_POLICIES = "rubick,rubick_r,rubick_e,rubick_n"


def overheads(args: argparse.Namespace) -> Overheads:
    """--overheads' clock and costs; --start-seconds and --rescale-seconds set them by hand
    and do not combine with a preset."""
    if args.overheads == "rubick-artifact":
        for flag in ("start_seconds", "rescale_seconds"):
            if getattr(args, flag) is not None:
                raise ValidationError(
                    "--" + flag.replace("_", "-"),
                    "--overheads rubick-artifact sets it (260 s, the artifact's own)",
                )
        return ARTIFACT_OVERHEADS
    return Overheads(
        start_seconds=args.start_seconds or 0.0,
        rescale_seconds=RECONFIGURE_SECONDS
        if args.rescale_seconds is None
        else args.rescale_seconds,
    )


def run_rubick(args: argparse.Namespace) -> list[RubickRun]:
    """Every policy of --compare (default: Rubick and its three variants) on the workload."""
    data = Path(args.rubick_data or DEFAULT_DATA)
    if not (data / "placements").is_dir():
        raise ValidationError("--rubick-data", f"{data} holds no placements/ folder")
    perf = load_perf(data, args.rubick_params)
    tenants = parse_tenants(args.tenants)
    if args.trace is not None:
        jobs = read_rubick_trace(args.trace, perf)
    else:
        jobs = generate_rubick_workload(
            perf, args.generate, args.jobs_per_hour, tenants=tenants, seed=args.seed
        )
    if args.write_trace is not None:
        write_rubick_trace(jobs, args.write_trace)
    names = [n.strip() for n in (args.compare or args.policy or DEFAULT_POLICIES).split(",")]
    field = "--compare" if args.compare else "--policy"
    for name in names:
        form, _, policy = name.rpartition(":")
        if name not in VARIANTS and (form not in ("", "rigid", "elastic") or not policy):
            raise ValidationError(
                field,
                f"{name!r}: Rubick's variants are "
                f"{', '.join(sorted(VARIANTS))}; Gavel's: [elastic:]NAME",
            )
        if name not in VARIANTS:
            make_policy(policy, field=field)
    costs = overheads(args)
    delta = costs.rescale_seconds
    reclaim = args.rubick_reclaim == "on"
    runs = []
    for name in names:
        if name in VARIANTS:
            runs.append(
                simulate_rubick(
                    jobs,
                    perf,
                    make_rubick(perf, name, quotas=tenants, reclaim=reclaim),
                    nodes=args.nodes,
                    rescale_seconds=delta,
                    start_seconds=costs.start_seconds,
                    tick_seconds=costs.tick_seconds,
                )
            )
        else:
            form, _, policy = name.rpartition(":")
            runs.append(
                run_gavel(
                    jobs,
                    perf,
                    policy,
                    elastic=form == "elastic",
                    nodes=args.nodes,
                    rescale_seconds=delta,
                    quotas=tenants,
                )
            )
    return runs


def render_rubick(runs: list[RubickRun]) -> str:
    lines = [
        f"{'POLICY':<24} {'AVG JCT h':>9} {'P99 JCT h':>9} {'MAKESPAN h':>10} {'UTIL':>5} "
        f"{'GUAR h':>7} {'BE h':>6} {'WORST GUAR':>10} {'RECONF':>6} {'DECIDE ms':>9}"
    ]
    for run in runs:
        r = run.result
        ratios = [
            run.worst_ratio[j] for j, g in run.guaranteed.items() if g and j in run.worst_ratio
        ]
        worst = f"{min(ratios):.2f}" if ratios else "-"
        decide = 1e3 * max(run.decision_seconds, default=0.0)
        lines.append(
            f"{r.policy:<24} {r.average_jct / 3600:>9.2f} {r.p99_jct / 3600:>9.2f} "
            f"{r.makespan / 3600:>10.2f} {r.utilization:>5.2f} "
            f"{run.average_jct(True) / 3600:>7.2f} "
            f"{run.average_jct(False) / 3600:>6.2f} {worst:>10} {r.rescales:>6} {decide:>9.1f}"
        )
    return "\n".join(lines)
