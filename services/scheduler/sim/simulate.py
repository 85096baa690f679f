"""`python -m gearshift.scheduler.sim.simulate` (and `gearshift simulate`): run a workload through
the scheduler's round pipeline (the daemon's allocate and place stages) on simulated time.

    gearshift simulate --trace FILE --throughputs FILE --cluster v100=8,p100=16,k80=24 \\
        [--config scheduler.yaml] [--seed S] [--json]
    gearshift simulate ... --config default --config rigid-las.yaml --config easyscale.yaml

How it schedules comes from the scheduler's configuration file alone, read as the daemon
reads it (the same file drives `gearshift-scheduler --config`, `gearshift up --config` and
`gearshift simulate --config`): the allocate plugin and its arguments, the round's length
and bounds (preemptExemptSeconds, maxMoves), and DeepPool's multiplexing when the profile
collocates with deeppool; the allocator is built from the plugin registry, as the daemon
builds it. No --config: the default profile. Several: one run each on the same workload,
one table (`default` names the default profile among them). The flags are the
simulation's own: the workload, the cluster, what the simulated world charges for a
restart and a collocation, the seed of the generated workload, and the output. A flag
that was a scheduler knob (`MOVED_TO_FILE`: --policy, --elastic, --round, ...) is
refused, naming the file's key that replaced it.

The workload is a Gavel trace (10 tab-separated fields per job) or, with
--generate N, a Poisson workload generated as in Gavel's evaluation (section
7.1), optionally saved with --write-trace. Prints average and p99 JCT,
makespan, utilization, rescales, the worst finish-time-fairness ratio, cost and
every job's completion time (JSON with --json); several profiles print one row
each. Rubick's traces (--trace-format rubick, --workload rubick) run Rubick's own
simulator (gearshift.scheduler.sim.rubick_cli), whose variants --policy and --compare
still choose. Sia's workloads (--trace-format sia --sia-data DIR [--workload NAME,...];
gearshift.scheduler.sim.sia_cli) run through the same profiles, on the artifact's cluster,
with its restart delays per model.

Exit codes: 0 done; 1 the workload cannot finish on the cluster; 2 bad usage
or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import ThroughputTable, load_throughputs
from gearshift.scheduler.config.configuration import ConfigurationError, Loaded, load
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.plugins.registry import Can, Point, capabilities, names
from gearshift.scheduler.plugins.stages import allocator_for
from gearshift.scheduler.sim.plots import write_plots
from gearshift.scheduler.sim.rubick_cli import render_rubick, run_rubick
from gearshift.scheduler.sim.sia_cli import pooled, render_pooled, sia_workloads
from gearshift.scheduler.sim.sia_trace import SiaWorkload
from gearshift.scheduler.sim.simulator import (
    DETERMINISM_CHOICES,
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
# --config's word for the default profile (a file of that name: ./default).
DEFAULT_PROFILE = "default"
# Finish-time fairness is measured against Gavel's isolated policy in Gavel's 6-minute
# rounds: one yardstick for every profile of a comparison, whatever their round lengths.
ISOLATED_ROUND_SECONDS = 360.0

# The flags that were the scheduler's knobs -> the file's key that replaced each: how the
# simulator schedules is the file's, as the daemon's is. (--compare: several --config.)
MOVED_TO_FILE: dict[str, str] = {
    "--policy": "profile.allocate.name",
    "--elastic": "profile.allocate.args.elastic",
    "--round": "round.seconds",
    "--recompute-seconds": "profile.allocate.args.minRecomputeSeconds",
    "--hysteresis": "profile.allocate.args.hysteresis",
    "--prices": "profile.allocate.args.prices",
    "--multiplex": "profile.collocate.name",
}


def moved(flag: str) -> ValidationError:
    """The error for a scheduler knob given as a flag: where it lives now."""
    if flag == "--compare":
        return ValidationError(
            flag,
            "give each profile as a --config FILE: several run on the same workload, one "
            "table (`--config default` is the default profile)",
        )
    return ValidationError(
        flag,
        f"set the configuration file's {MOVED_TO_FILE[flag]} instead and pass --config FILE "
        "(`gearshift config defaults` prints every key)",
    )


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
        "allocate and place stages) on simulated time, scheduled as the scheduler's "
        "configuration file says.",
        epilog="A Gavel trace runs any allocate plugin that needs no Brain: "
        + ", ".join(_simulated())
        + " (`gearshift config plugins` explains each). Determinism: none (Gavel's world: "
        "any type, any time, mixing free), D1 (one type per job, kept for its life), D2 "
        "(mixing, at EasyScale's D2 cost per model family), auto (D2 where it is free, D1 "
        "for convolutional models). The scheduler's knobs are the file's keys, no flags: "
        + ", ".join(f"{flag} -> {key}" for flag, key in MOVED_TO_FILE.items())
        + ".",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--trace",
        type=Path,
        help="Gavel trace file (10 tab-separated fields); with --trace-format: that format's",
    )
    source.add_argument(
        "--generate", type=int, metavar="N", help="generate N jobs (Gavel section 7.1)"
    )
    parser.add_argument("--throughputs", type=Path, help="Gavel's throughputs JSON (Gavel traces)")
    parser.add_argument(
        "--config",
        action="append",
        metavar="FILE",
        help="the scheduler's configuration file (kind: SchedulerConfiguration), read as the "
        "daemon reads it; `default` (or no --config): the default profile. Given several "
        "times: every profile on the same workload, one table",
    )
    parser.add_argument(
        "--cluster",
        help="devices per type, TYPE=COUNT,... (or Gavel's #v100:#p100:#k80): the simulated "
        f"cluster (the daemon's workers tell it theirs; default {DEFAULT_CLUSTER}, Sia's "
        "workloads: the artifact's simulator_config.py)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of --generate's workload and of the isolated yardstick (the policies' own "
        "seed is the file's round.seed)",
    )
    parser.add_argument(
        "--determinism",
        choices=DETERMINISM_CHOICES,
        default="none",
        help="what the jobs' bits must survive, every job's (a job spec says it; traces do "
        "not; see below; default none, as Gavel)",
    )
    parser.add_argument(
        "--rescale-seconds",
        type=float,
        default=None,
        help="what a restart costs in the simulated world: seconds an elastic job makes no "
        "progress when it checkpoints and restarts (a cluster measures it; default: each "
        "profile's estimates.restartSeconds, the scheduler's guess until measured; Rubick: "
        "78, the paper's mean)",
    )
    parser.add_argument(
        "--rigid-rescale-seconds",
        type=float,
        default=0.0,
        help="the same for rigid jobs in Gavel's rounds (Gavel's simulator charges none)",
    )
    parser.add_argument(
        "--restart-prior",
        default="",
        metavar="MODEL=SECONDS,...",
        help="per-model restart seconds, for every policy: a job whose type starts with MODEL "
        "(case-insensitive, the longest match) restarts in SECONDS, others as the two flags "
        "above say (Sia's artifact: cifar10 50 s up to imagenet 250 s; --trace-format sia "
        "takes the artifact's own, which these override)",
    )
    parser.add_argument(
        "--free-first-start",
        action="store_true",
        help="charge no restart for a job's first start (by default it costs one, as Sia's "
        "simulator charges it)",
    )
    world = parser.add_argument_group(
        "collocation in the simulated world (when the profile's collocate is deeppool; the "
        "trace has no layer profiles to measure these from; bench/multiplex.py measures them)"
    )
    world.add_argument(
        "--idle-fraction",
        type=float,
        default=Multiplexed.idle_fraction,
        help="profile.collocate deeppool: the share of its devices' time every job's plan leaves "
        "idle (default %(default)s)",
    )
    world.add_argument(
        "--foreground-slowdown",
        type=float,
        default=Multiplexed.foreground_slowdown,
        help="profile.collocate deeppool: how much slower a job runs with a background job beside "
        "it (default %(default)s)",
    )
    world.add_argument(
        "--background-share",
        type=float,
        default=Multiplexed.background_share,
        help="profile.collocate deeppool: a background job's rate over its rate alone on that "
        "device (default %(default)s)",
    )
    generated = parser.add_argument_group("--generate's workload")
    generated.add_argument(
        "--jobs-per-hour", type=float, default=1.0, help="--generate: Poisson arrival rate"
    )
    generated.add_argument(
        "--single-gpu", action="store_true", help="--generate: every job on one device"
    )
    generated.add_argument(
        "--start-with", type=int, default=0, help="--generate: jobs present at time 0"
    )
    output = parser.add_argument_group("output")
    output.add_argument("--write-trace", type=Path, help="save the workload as a Gavel trace")
    output.add_argument("--json", action="store_true", help="print the result as JSON")
    output.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="also write PNG figures there (every profile together): JCT CDF, devices in use "
        "by type over time, per-job slowdown",
    )
    rubick = parser.add_argument_group(
        "Rubick's traces: Rubick's own simulator (gearshift.scheduler.sim.rubick_cli)"
    )
    rubick.add_argument(
        "--trace-format",
        choices=("gavel", "rubick", "sia"),
        default="gavel",
        help="gavel: 10 tab-separated fields; rubick: the Rubick paper's CSV traces; sia: the "
        "Sia artifact's workloads (name,time,application,num_replicas,batch_size) with "
        "--sia-data",
    )
    rubick.add_argument(
        "--workload",
        help="--generate: gavel (default; Gavel's section 7.1 jobs) or rubick (Table 2 models, "
        "tenants); --trace-format sia: workloads under DIR/workloads, NAME,... (default "
        "philly/workload-1)",
    )
    rubick.add_argument(
        "--sia-data",
        type=Path,
        metavar="DIR",
        help="--trace-format sia: the Sia artifact's sia-simulator/ folder (workloads/, "
        "traces/, simulator_config.py, applications.py), read at run time. Jobs keep their "
        "batch size (Gearshift fixes the global batch: compare with the artifact's "
        "--disable_bsz_tuning), have num_replicas ESTs and never span two GPU types at once",
    )
    rubick.add_argument(
        "--tenants",
        default="A=64,B=0",
        help="Rubick: GPU quota per tenant, TENANT=GPUS,... (jobs of a tenant with a quota are "
        "guaranteed; a trace without a tenant column: is_sla=1 -> A, else B)",
    )
    rubick.add_argument("--nodes", type=int, default=8, help="Rubick: 8-GPU A800 nodes")
    rubick.add_argument(
        "--start-seconds",
        type=float,
        help="Rubick: what a job's first launch costs (default 0; a restart costs "
        "--rescale-seconds, 78 by default)",
    )
    rubick.add_argument(
        "--overheads",
        choices=("none", "rubick-artifact"),
        default="none",
        help="Rubick: rubick-artifact runs the artifact simulator's clock: a round every 60 s "
        "(arrivals wait for it, GPUs are freed at it) and 260 s for every placement, the "
        "first start included; none (default): a round at every arrival and completion",
    )
    rubick.add_argument(
        "--rubick-reclaim",
        choices=("on", "off"),
        default="on",
        help="Rubick: off reproduces the artifact's policy, whose reclaim loop never runs "
        '(`if "llama" or "3B" in ...` is always true): no job takes GPUs from another',
    )
    rubick.add_argument(
        "--rubick-data", type=Path, help="Rubick's data folder (default ../shared/data/rubick)"
    )
    rubick.add_argument(
        "--rubick-params",
        choices=("fit", "history"),
        default="fit",
        help="Rubick: Eq. 1's parameters fitted on the measured runs, or history.csv's",
    )
    rubick.add_argument(
        "--policy",
        metavar="NAME",
        help="Rubick's traces: Rubick's variant (rubick, rubick_e, rubick_r, rubick_n) or "
        "Gavel's [elastic:]NAME on Rubick's iteration times",
    )
    rubick.add_argument(
        "--compare",
        metavar="P1,P2,...",
        help="Rubick's traces: several of --policy's names, one table (default: Rubick and its "
        "three variants)",
    )
    return parser


def rubick_traces(args: argparse.Namespace) -> bool:
    """Rubick's traces, which Rubick's own simulator runs."""
    return args.trace_format == "rubick" or (
        args.generate is not None and args.workload == "rubick"
    )


def sia_traces(args: argparse.Namespace) -> bool:
    return bool(args.trace_format == "sia")


def check_source(args: argparse.Namespace) -> None:
    """--trace or --generate (a Sia workload may come from --workload instead), and
    --workload's meaning for the format."""
    if sia_traces(args):
        if args.generate is not None:
            raise ValidationError("--generate", "--trace-format sia reads the artifact's workloads")
        for flag in ("throughputs", "write_trace"):
            if getattr(args, flag) is not None:
                raise ValidationError(
                    f"--{flag.replace('_', '-')}",
                    "Sia's workloads carry their own throughputs (the artifact's tables) and "
                    "are not written as Gavel traces",
                )
        if args.plot is not None and "," in (args.workload or ""):
            raise ValidationError("--plot", "plots one workload at a time")
        return
    if args.sia_data is not None:
        raise ValidationError("--sia-data", "only with --trace-format sia")
    if args.trace is None and args.generate is None:
        raise ValidationError("--trace", "give a trace (--trace FILE) or --generate N")
    if args.workload not in (None, "gavel", "rubick"):
        raise ValidationError("--workload", f"{args.workload!r}: --generate's are gavel, rubick")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The arguments; a scheduler knob given as a flag is a ValidationError naming the file's
    key that replaced it (argparse's own exit 2 for anything else it does not know)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    for token in rest:
        flag = token.split("=", 1)[0]
        if flag in MOVED_TO_FILE:
            raise moved(flag)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    check_source(args)
    if rubick_traces(args):
        if args.config:
            raise ValidationError(
                "--config",
                "Rubick's traces run Rubick's own simulator, which reads no "
                "configuration file (its policies: --policy, --compare)",
            )
        return args
    for flag in ("--policy", "--compare"):
        if getattr(args, flag[2:]) is not None:
            raise moved(flag)
    return args


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


def parse_prior(text: str, field: str = "--restart-prior") -> dict[str, float]:
    """ "ResNet-50=120,LM=60" -> {"ResNet-50": 120.0, "LM": 60.0}."""
    out: dict[str, float] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, sep, value = item.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not sep or not name or not seconds >= 0:
            raise ValidationError(field, f"{item!r} is not MODEL=SECONDS (seconds >= 0)")
        out[name.strip()] = seconds
    return out


def check_numbers(args: argparse.Namespace) -> None:
    for flag in ("rescale_seconds", "rigid_rescale_seconds"):
        if (getattr(args, flag) or 0) < 0:
            raise ValidationError(f"--{flag.replace('_', '-')}", "must be >= 0")
    for flag in ("idle_fraction", "foreground_slowdown", "background_share"):
        if not 0 <= getattr(args, flag) <= 1:
            raise ValidationError(f"--{flag.replace('_', '-')}", "must be between 0 and 1")


def _simulated() -> list[str]:
    """The allocate plugins a Gavel trace can run (Rubick's need its own traces)."""
    return [n for n in names(Point.ALLOCATE) if Can.NEEDS_BRAIN not in capabilities("allocate", n)]


@dataclass(frozen=True)
class Profile:
    """One run's scheduler: its label in the results, and the validated configuration."""

    label: str
    loaded: Loaded

    @property
    def settings(self) -> SchedulerSettings:
        """The settings the daemon would run with. Simulated time solves in the round: a
        solve on a thread would race the clock."""
        return replace(settings_of(self.loaded), recompute_in_background=False)


def profile_of(given: str) -> Profile:
    """--config's FILE (or `default`) as a Profile; a ValidationError names what is wrong."""
    try:
        loaded = load(None if given == DEFAULT_PROFILE else given)
    except ConfigurationError as exc:
        raise ValidationError("--config", str(exc)) from None
    policy = loaded.name(Point.ALLOCATE)
    if Can.NEEDS_BRAIN in loaded.can(Point.ALLOCATE):
        raise ValidationError(
            "--config",
            f"{given}: profile.allocate {policy} asks the Brain for its fitted models, which "
            "a Gavel trace has none of: simulate it on Rubick's traces (--trace-format rubick)",
        )
    source = DEFAULT_PROFILE if given == DEFAULT_PROFILE else Path(given).stem
    described = policy + (" elastic" if settings_of(loaded).elastic else "")
    return Profile(source if source == described else f"{source} ({described})", loaded)


def run_one(
    args: argparse.Namespace,
    profile: Profile,
    workload: list[TraceJob],
    cluster: dict[str, int],
    table: ThroughputTable,
    *,
    prior: dict[str, float] | None = None,
) -> SimulationResult:
    settings = profile.settings
    allocator = allocator_for(settings)
    can = profile.loaded.can(Point.ALLOCATE)
    restart = settings.restart_seconds if args.rescale_seconds is None else args.rescale_seconds
    return simulate_pipeline(
        workload,
        cluster,
        table,
        allocator,
        round_seconds=settings.round_seconds,
        rescale_seconds=restart if allocator.replans_on_events else args.rigid_rescale_seconds,
        in_place_seconds=settings.in_place_seconds if settings.rescale_in_place else None,
        restart_prior={**(prior or {}), **parse_prior(args.restart_prior)},
        charge_first_start=not args.free_first_start,
        elastic=Can.ELASTIC in can,
        determinism=args.determinism,
        space_sharing=Can.SPACE_SHARING in can,
        prices=settings.prices,
        name=profile.label,
        multiplexed=Multiplexed(
            idle_fraction=args.idle_fraction,
            foreground_slowdown=args.foreground_slowdown,
            background_share=args.background_share,
        )
        if settings.collocates
        else None,
    )


def run(args: argparse.Namespace) -> list[SimulationResult]:
    """Every --config's profile on the workload (parse_args's arguments); ValidationError on
    bad input, every file checked before anything runs."""
    cluster = parse_cluster(args.cluster or DEFAULT_CLUSTER)
    check_numbers(args)
    parse_prior(args.restart_prior)
    if args.throughputs is None:
        raise ValidationError("--throughputs", "Gavel traces need Gavel's throughputs JSON")
    profiles = [profile_of(given) for given in args.config or [DEFAULT_PROFILE]]
    table = load_throughputs(args.throughputs)
    workload = workload_from(args, table)
    unknown = sorted({t for t in cluster if t not in table.worker_types})
    if unknown:
        raise ValidationError("--cluster", f"no throughputs for types {unknown}")
    if args.write_trace is not None:
        write_trace(workload, args.write_trace)
    isolated = isolated_reference(
        workload, cluster, table, round_seconds=ISOLATED_ROUND_SECONDS, seed=args.seed
    )
    return [
        run_one(args, profile, workload, cluster, table).with_isolated(isolated)
        for profile in profiles
    ]


def run_sia(args: argparse.Namespace) -> list[tuple[SiaWorkload, list[SimulationResult]]]:
    """Every --config's profile on every Sia workload: (workload, results) each."""
    check_numbers(args)
    parse_prior(args.restart_prior)
    cluster = parse_cluster(args.cluster) if args.cluster else None
    profiles = [profile_of(given) for given in args.config or [DEFAULT_PROFILE]]
    out = []
    for w in sia_workloads(args.sia_data, args.workload, args.trace, cluster):
        isolated = isolated_reference(
            w.jobs, w.cluster, w.table, round_seconds=ISOLATED_ROUND_SECONDS, seed=args.seed
        )
        out.append(
            (
                w,
                [
                    run_one(
                        args, p, w.jobs, w.cluster, w.table, prior=w.restart_prior
                    ).with_isolated(isolated)
                    for p in profiles
                ],
            )
        )
    return out


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
        f"rescales:           {result.rescales} ({result.rescales_per_job:.2f} per job, "
        f"{result.in_place_rescales} in place)",
        f"restarting:         {result.restart_seconds_lost:,.0f} s over all jobs",
        f"simulated in:       {result.wall_seconds:.1f} s",
        "",
        f"{'JOB':>5}  {'TYPE':<34} {'GPUS':>4} {'ARRIVAL':>10} {'FINISH':>11} {'JCT':>11} "
        f"{'FTF':>5} {'RESCALES':>8} {'RESTART S':>9}",
    ]
    for job in result.jobs:
        lines.append(
            f"{job.job_id:>5}  {job.job_type:<34} {job.scale_factor:>4} "
            f"{job.arrival_time:>10.0f} {job.finish_time:>11.1f} {job.jct:>11.1f} {job.ftf:>5.2f}"
            f" {job.rescales:>8} {job.restart_seconds_lost:>9.0f}"
        )
    return "\n".join(lines)


def render_comparison(results: list[SimulationResult]) -> str:
    """One row per policy; the last column is avg JCT relative to the first row's."""
    base = results[0].average_jct or 1.0
    lines = [
        f"{'POLICY':<34} {'AVG JCT h':>9} {'P99 JCT h':>9} {'MAKESPAN h':>10} {'UTIL':>5} "
        f"{'RESCALES':>8} {'PER JOB':>7} {'IN PLACE':>8} {'RESTART h':>9} {'WORST FTF':>9} "
        f"{'COST $':>9} "
        f"{'VS FIRST':>8}"
    ]
    for r in results:
        lines.append(
            f"{r.policy:<34} {r.average_jct / 3600:>9.2f} {r.p99_jct / 3600:>9.2f} "
            f"{r.makespan / 3600:>10.2f} {r.utilization:>5.2f} {r.rescales:>8} "
            f"{r.rescales_per_job:>7.2f} {r.in_place_rescales:>8} "
            f"{r.restart_seconds_lost / 3600:>9.2f} "
            f"{r.worst_ftf:>9.2f} {r.cost:>9.0f} {base / (r.average_jct or 1.0):>7.2f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    sia: list[tuple[SiaWorkload, list[SimulationResult]]] = []
    try:
        args = parse_args(argv)
        if rubick_traces(args):
            return _main_rubick(args)
        if sia_traces(args):
            sia = run_sia(args)
        results = sia[0][1] if sia else run(args)
    except ValidationError as exc:
        print(f"gearshift simulate: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except SimulationError as exc:
        print(f"gearshift simulate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if len(sia) > 1:
        _print_sia(args, sia)
        return EXIT_OK
    several = len(results) > 1
    if args.json:
        payload: object = [r.to_json() for r in results] if several else results[0].to_json()
        print(json.dumps(payload, indent=2))
    elif several:
        print(render_comparison(results))
    else:
        print(render(results[0]))
    if args.plot is not None:
        written = write_plots(results, args.plot)
        print(
            "plots: " + ", ".join(map(str, written)), file=sys.stderr if args.json else sys.stdout
        )
    return EXIT_OK


def _print_sia(
    args: argparse.Namespace, runs: list[tuple[SiaWorkload, list[SimulationResult]]]
) -> None:
    """Several Sia workloads (gearshift.scheduler.sim.sia_cli): a block each and the pooled
    figures (one workload prints as a Gavel trace's run does)."""
    if args.json:
        payload = [{"workload": w.name, "runs": [r.to_json() for r in rs]} for w, rs in runs]
        print(json.dumps(payload, indent=2))
        return
    for w, results in runs:
        print(f"workload: {w.name}")
        print(render_comparison(results))
        print()
    devices = sum(runs[0][0].cluster.values())
    print(
        render_pooled([pooled([rs[i] for _, rs in runs], devices) for i in range(len(runs[0][1]))])
    )


def _main_rubick(args: argparse.Namespace) -> int:
    """Rubick's traces under Rubick and its break-down variants
    (gearshift.scheduler.sim.rubick_cli)."""
    try:
        check_numbers(args)
        if args.nodes < 1:
            raise ValidationError("--nodes", "must be >= 1")
        if args.start_seconds is not None and args.start_seconds < 0:
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
