"""`python -m gearshift.scheduler.sim.simulate` (and `gearshift simulate`): run a workload through
the
scheduler's round pipeline (the daemon's allocate and place stages) on simulated time.

    gearshift simulate --trace FILE --throughputs FILE --cluster v100=8,p100=16,k80=24 \\
        --policy las [--elastic] [--round 360] [--seed S] [--json]
    gearshift simulate ... --compare rigid:las,elastic:las,easyscale,default
    gearshift simulate ... --config scheduler.yaml      # the file's profile

`default` (or --config FILE) runs the scheduler's profile as the daemon would: the
allocate plugin with its arguments, the round's length and bounds (preemptExemptSeconds,
maxMoves), and DeepPool's multiplexing when the profile collocates with deeppool; every
allocator is built from the plugin registry, as the daemon builds it.

The workload is a Gavel trace (10 tab-separated fields per job) or, with
--generate N, a Poisson workload generated as in Gavel's evaluation (section
7.1), optionally saved with --write-trace. Prints average and p99 JCT,
makespan, utilization, rescales, the worst finish-time-fairness ratio, cost and
every job's completion time (JSON with --json); --compare prints one row per
policy.

Exit codes: 0 done; 1 the workload cannot finish on the cluster; 2 bad usage
or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import ThroughputTable, load_throughputs
from gearshift.scheduler.config.configuration import ConfigurationError, Loaded, load
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.plugins.gavel.policies import describe, make_policy, policy_names
from gearshift.scheduler.plugins.gavel.prices import parse_prices
from gearshift.scheduler.plugins.registry import Can, NoArgs, Point, capabilities, names, plugin
from gearshift.scheduler.plugins.stages import allocator_for
from gearshift.scheduler.sim.plots import write_plots
from gearshift.scheduler.sim.rubick_cli import render_rubick, run_rubick
from gearshift.scheduler.sim.simulator import (
    DETERMINISM_CHOICES,
    GAVEL_RECOMPUTE_SECONDS,
    Multiplexed,
    SimulationError,
    SimulationResult,
    isolated_reference,
    simulate_pipeline,
)
from gearshift.scheduler.sim.trace import TraceJob, generate_workload, read_trace, write_trace
from gearshift.scheduler.state.state import SchedulerSettings

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
    parser = argparse.ArgumentParser(
        prog="gearshift simulate",
        description="Simulate a workload with the scheduler's round pipeline (the daemon's "
        "allocate and place stages) on simulated time.",
        epilog="Policies (Gavel objectives; with --elastic over elastic EST jobs): "
        + "; ".join(f"{n} ({describe(n)})" for n in policy_names())
        + ". Greedy elastic allocators: easyscale, easyscale_homo (EasyScale's greedy "
        "inter-job policy, heterogeneous or one type per job); yarn_cs (rigid FIFO gang "
        "baseline). Determinism: none (Gavel's world: any type, any time, mixing free), "
        "D1 (one type per job, kept for its life), D2 (mixing, at EasyScale's D2 cost per "
        "model family), auto (D2 where it is free, D1 for convolutional models).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="Gavel trace file (10 tab-separated fields)")
    source.add_argument(
        "--generate", type=int, metavar="N", help="generate N jobs (Gavel section 7.1)"
    )
    parser.add_argument("--throughputs", type=Path, help="Gavel's throughputs JSON (Gavel traces)")
    parser.add_argument(
        "--trace-format",
        choices=("gavel", "rubick"),
        default="gavel",
        help="gavel: 10 tab-separated fields; rubick: the Rubick paper's CSV traces",
    )
    parser.add_argument(
        "--workload",
        choices=("gavel", "rubick"),
        default="gavel",
        help="--generate: Gavel's section 7.1 jobs, or Rubick's (Table 2 models, tenants)",
    )
    parser.add_argument(
        "--tenants",
        default="A=64,B=0",
        help="Rubick: GPU quota per tenant, TENANT=GPUS,... (jobs of a tenant with a quota "
        "are guaranteed; a trace without a tenant column: is_sla=1 -> A, else B)",
    )
    parser.add_argument("--nodes", type=int, default=8, help="Rubick: 8-GPU A800 nodes")
    parser.add_argument(
        "--start-seconds",
        type=float,
        default=0.0,
        help="Rubick: what a job's first launch costs (default 0; a restart costs "
        "--rescale-seconds, 78 by default)",
    )
    parser.add_argument(
        "--rubick-data", type=Path, help="Rubick's data folder (default ../shared/data/rubick)"
    )
    parser.add_argument(
        "--rubick-params",
        choices=("fit", "history"),
        default="fit",
        help="Rubick: Eq. 1's parameters fitted on the measured runs, or history.csv's",
    )
    parser.add_argument(
        "--cluster",
        default=DEFAULT_CLUSTER,
        help="devices per type, TYPE=COUNT,... (or Gavel's #v100:#p100:#k80)",
    )
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help="default (the scheduler's profile: --config's, or the defaults), or one of: "
        f"{', '.join(_simulated())} (default max_min_fairness_perf; easyscale with --elastic; "
        "default with --config)",
    )
    choice.add_argument(
        "--compare",
        metavar="P1,P2,...",
        help="run several policies on the same workload and print one table; prefix an "
        "objective with elastic: or rigid: to choose its form (default: --elastic's)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="the scheduler's configuration file (kind: SchedulerConfiguration): its profile "
        "is the policy `default`",
    )
    parser.add_argument(
        "--round",
        type=float,
        default=None,
        help="round length, seconds (default 360, or --config's round.seconds)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="jobs are elastic EST jobs (N = scale factor ESTs, 1..N devices); Gavel "
        "objectives then allocate over device configurations",
    )
    parser.add_argument(
        "--determinism",
        choices=DETERMINISM_CHOICES,
        default="none",
        help="what the jobs' bits must survive (see below; default none, as Gavel)",
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
        default=None,
        help="elastic jobs: seconds without progress when a job checkpoints and restarts "
        "(default 10; Rubick: 78, the paper's mean)",
    )
    parser.add_argument(
        "--rigid-rescale-seconds",
        type=float,
        default=0.0,
        help="the same for rigid jobs in Gavel's rounds (Gavel's simulator charges none)",
    )
    parser.add_argument(
        "--hysteresis",
        type=float,
        default=0.1,
        help="elastic objectives: least relative gain for which a running job is resized",
    )
    parser.add_argument(
        "--prices",
        default="",
        help="dollars per device-hour, TYPE=PRICE,... (default Google Cloud's on-demand "
        "prices that Gavel used: v100=2.48,p100=1.46,k80=0.45,t4=0.35)",
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
    parser.add_argument(
        "--multiplex",
        action="store_true",
        help="DeepPool's multiplexing: a waiting one-device job runs in the background on a "
        "device of a job whose plan idles it (rates below, as bench/multiplex.py measures)",
    )
    parser.add_argument(
        "--idle-fraction",
        type=float,
        default=Multiplexed.idle_fraction,
        help="--multiplex: the share of its devices' time every job's plan leaves idle "
        "(the trace has no layer profiles; default %(default)s)",
    )
    parser.add_argument(
        "--foreground-slowdown",
        type=float,
        default=Multiplexed.foreground_slowdown,
        help="--multiplex: how much slower a job runs with a background job beside it "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--background-share",
        type=float,
        default=Multiplexed.background_share,
        help="--multiplex: a background job's rate over its rate alone on that device "
        "(default %(default)s)",
    )
    parser.add_argument("--write-trace", type=Path, help="save the workload as a Gavel trace")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="also write PNG figures there (every --compare policy together): JCT CDF, "
        "devices in use by type over time, per-job slowdown",
    )
    return parser


def workload_from(args: argparse.Namespace, table: ThroughputTable) -> list[TraceJob]:
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
    return workload


def check_numbers(args: argparse.Namespace) -> None:
    if args.round is not None and args.round <= 0:
        raise ValidationError("--round", f"must be > 0 (got {args.round})")
    for flag in ("rescale_seconds", "rigid_rescale_seconds", "hysteresis", "recompute_seconds"):
        if (getattr(args, flag) or 0) < 0:
            raise ValidationError(f"--{flag.replace('_', '-')}", "must be >= 0")
    for flag in ("idle_fraction", "foreground_slowdown", "background_share"):
        if not 0 <= getattr(args, flag) <= 1:
            raise ValidationError(f"--{flag.replace('_', '-')}", "must be between 0 and 1")


def _simulated() -> list[str]:
    """The allocate plugins a Gavel trace can run (Rubick's need its own traces)."""
    return [n for n in names(Point.ALLOCATE) if Can.NEEDS_BRAIN not in capabilities("allocate", n)]


def _objective(name: str) -> bool:
    """A Gavel objective (rigid or elastic), not a greedy allocator."""
    found = plugin(Point.ALLOCATE, name)
    return found is not None and found.args is not NoArgs


def entries(args: argparse.Namespace) -> list[tuple[str, bool]]:
    """(policy name, elastic jobs) for every policy to run."""
    if args.compare is None:
        fallback = "easyscale" if args.elastic else "max_min_fairness_perf"
        name = args.policy or ("default" if args.config is not None else fallback)
        return [(name, args.elastic or not _objective(name))]
    out: list[tuple[str, bool]] = []
    for item in filter(None, (part.strip() for part in args.compare.split(","))):
        form, sep, name = item.partition(":")
        if not sep:
            form, name = "", item
        if form not in ("", "elastic", "rigid"):
            raise ValidationError("--compare", f"{item!r}: the prefix is elastic: or rigid:")
        elastic = form == "elastic" or (form == "" and args.elastic) or not _objective(name)
        out.append((name, elastic))
    if not out:
        raise ValidationError("--compare", "names no policy")
    return out


def profile_of(args: argparse.Namespace) -> Loaded:
    """The scheduler's configuration that `default` runs (--config's, or the defaults)."""
    try:
        return load(args.config)
    except ConfigurationError as exc:
        raise ValidationError("--config", str(exc)) from None


def settings_for(args: argparse.Namespace, name: str, elastic: bool) -> SchedulerSettings:
    """The settings the daemon would run `name` with: the file's for `default`, else a
    profile of that allocator with the simulator's knobs."""
    if name == "default":
        chosen = settings_of(profile_of(args))
        # Simulated time solves in the round: a solve on a thread would race the clock.
        return replace(
            chosen,
            round_seconds=args.round or chosen.round_seconds,
            recompute_in_background=False,
        )
    return SchedulerSettings(
        policy=name,
        elastic=elastic and _objective(name),
        round_seconds=args.round or 360.0,
        min_recompute_seconds=args.recompute_seconds,
        seed=args.seed,
        hysteresis=args.hysteresis,
        prices=parse_prices(args.prices),
    )


def run_one(
    args: argparse.Namespace,
    workload: list[TraceJob],
    cluster: dict[str, int],
    table: ThroughputTable,
    *,
    name: str,
    elastic: bool,
) -> SimulationResult:
    settings = settings_for(args, name, elastic)
    if args.rescale_seconds is None:
        args.rescale_seconds = settings.restart_seconds if name == "default" else 10.0
    allocator = allocator_for(settings)
    rigid_rounds = not allocator.replans_on_events
    can = capabilities(Point.ALLOCATE, settings.policy)
    label = f"{name} (elastic)" if elastic and _objective(name) else name
    if name == "default":
        label = f"default ({settings.policy}{' elastic' if settings.elastic else ''})"
    multiplex = args.multiplex or (name == "default" and settings.collocates)
    return simulate_pipeline(
        workload,
        cluster,
        table,
        allocator,
        round_seconds=settings.round_seconds,
        rescale_seconds=args.rigid_rescale_seconds if rigid_rounds else args.rescale_seconds,
        elastic=Can.ELASTIC in can and (settings.elastic or not _objective(name)),
        determinism=args.determinism,
        space_sharing=Can.SPACE_SHARING in can,
        prices=settings.prices,
        name=label if args.compare is not None or name == "default" else name,
        multiplexed=Multiplexed(
            idle_fraction=args.idle_fraction,
            foreground_slowdown=args.foreground_slowdown,
            background_share=args.background_share,
        )
        if multiplex
        else None,
    )


def run(args: argparse.Namespace) -> list[SimulationResult]:
    """Run the simulations the arguments describe; ValidationError on bad input."""
    cluster = parse_cluster(args.cluster)
    check_numbers(args)
    parse_prices(args.prices)
    if args.throughputs is None:
        raise ValidationError("--throughputs", "Gavel traces need Gavel's throughputs JSON")
    table = load_throughputs(args.throughputs)
    workload = workload_from(args, table)
    unknown = sorted({t for t in cluster if t not in table.worker_types})
    if unknown:
        raise ValidationError("--cluster", f"no throughputs for types {unknown}")
    plan = entries(args)
    field = "--compare" if args.compare is not None else "--policy"
    for name, elastic in plan:  # every name checked before anything runs
        if name == "default":
            profile_of(args)
        elif plugin(Point.ALLOCATE, name) is None or name not in _simulated():
            make_policy(name, field=field)  # names the known ones
            raise ValidationError(field, f"{name!r} needs Rubick's traces (--trace-format)")
        elif elastic and _objective(name):
            found = plugin(Point.ALLOCATE, name)
            assert found is not None
            why = found.refuse(found.args.model_validate({"elastic": True}))
            if why:
                raise ValidationError(field, why)
    if args.write_trace is not None:
        write_trace(workload, args.write_trace)
    isolated = isolated_reference(
        workload, cluster, table, round_seconds=args.round or 360.0, seed=args.seed
    )
    return [
        run_one(args, workload, cluster, table, name=name, elastic=elastic).with_isolated(isolated)
        for name, elastic in plan
    ]


def render(result: SimulationResult) -> str:
    lines = [
        f"policy:             {result.policy}",
        f"jobs:               {len(result.jobs)}",
        f"average JCT:        {result.average_jct:,.1f} s ({result.average_jct / 3600:.2f} h)",
        f"p99 JCT:            {result.p99_jct:,.1f} s ({result.p99_jct / 3600:.2f} h)",
        f"makespan:           {result.makespan:,.1f} s ({result.makespan / 3600:.2f} h)",
        f"utilization:        {result.utilization:.3f}",
        f"worst FTF ratio:    {result.worst_ftf:.2f} (JCT / JCT under the isolated policy)",
        f"cost:               ${result.cost:,.2f}",
        f"rounds:             {result.rounds}",
        f"allocations:        {result.allocations}",
        f"rescales:           {result.rescales}",
        f"simulated in:       {result.wall_seconds:.1f} s",
        "",
        f"{'JOB':>5}  {'TYPE':<34} {'GPUS':>4} {'ARRIVAL':>10} {'FINISH':>11} {'JCT':>11} "
        f"{'FTF':>5}",
    ]
    for job in result.jobs:
        lines.append(
            f"{job.job_id:>5}  {job.job_type:<34} {job.scale_factor:>4} "
            f"{job.arrival_time:>10.0f} {job.finish_time:>11.1f} {job.jct:>11.1f} {job.ftf:>5.2f}"
        )
    return "\n".join(lines)


def render_comparison(results: list[SimulationResult]) -> str:
    """One row per policy; the last column is avg JCT relative to the first row's."""
    base = results[0].average_jct or 1.0
    lines = [
        f"{'POLICY':<34} {'AVG JCT h':>9} {'P99 JCT h':>9} {'MAKESPAN h':>10} {'UTIL':>5} "
        f"{'RESCALES':>8} {'WORST FTF':>9} {'COST $':>9} {'VS FIRST':>8}"
    ]
    for r in results:
        lines.append(
            f"{r.policy:<34} {r.average_jct / 3600:>9.2f} {r.p99_jct / 3600:>9.2f} "
            f"{r.makespan / 3600:>10.2f} {r.utilization:>5.2f} {r.rescales:>8} "
            f"{r.worst_ftf:>9.2f} {r.cost:>9.0f} {base / (r.average_jct or 1.0):>7.2f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.trace_format == "rubick" or (args.generate is not None and args.workload == "rubick"):
        return _main_rubick(args)
    try:
        results = run(args)
    except ValidationError as exc:
        print(f"gearshift simulate: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except SimulationError as exc:
        print(f"gearshift simulate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        payload: object = (
            [r.to_json() for r in results] if args.compare is not None else results[0].to_json()
        )
        print(json.dumps(payload, indent=2))
    elif args.compare is not None:
        print(render_comparison(results))
    else:
        print(render(results[0]))
    if args.plot is not None:
        written = write_plots(results, args.plot)
        print(
            "plots: " + ", ".join(map(str, written)), file=sys.stderr if args.json else sys.stdout
        )
    return EXIT_OK


def _main_rubick(args: argparse.Namespace) -> int:
    """Rubick's traces under Rubick and its break-down variants
    (gearshift.scheduler.sim.rubick_cli)."""
    try:
        check_numbers(args)
        if args.nodes < 1:
            raise ValidationError("--nodes", "must be >= 1")
        if args.start_seconds < 0:
            raise ValidationError("--start-seconds", "must be >= 0")
        runs = run_rubick(args)
    except ValidationError as exc:
        print(f"gearshift simulate: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except SimulationError as exc:
        print(f"gearshift simulate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps([r.result.to_json() for r in runs], indent=2))
    else:
        print(render_rubick(runs))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
