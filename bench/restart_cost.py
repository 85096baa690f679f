"""Rescales that pay for themselves (issue 49): short rounds against long ones, when a restart
costs what it costs.

    python bench/restart_cost.py [--traces gavel,gen1,gen2,gen3] [--policies ...]
        [--restart 57] [--rounds 360,60] [--jobs 100] [--jobs-per-hour 4] [--json FILE]

Every policy runs every trace at each round length twice, in one process: "before", moves
free (no residency, no horizon: the policies as in their papers), and "after", restart-aware
(gearshift.scheduler.round.restart_cost with the plugins' default arguments). The simulated
world charges every job `--restart` seconds for each restart, its first start included (as
Sia's simulator does), before and after alike. Traces: Gavel's public trace
(shared/data/gavel/max_min_fairness.trace) and generated ones (Gavel section 7.1, seeds 1..3),
on v100=8, p100=16, k80=24, Gavel's world (no determinism constraint).

The target: each policy's average JCT at the shortest round within 5% of its own at the
longest, or better (ratio <= 1.05), after. Prints one row per (trace, policy).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shared import shared_data
from gearshift.common.gavel import ThroughputTable, load_throughputs
from gearshift.scheduler.config.configuration import load
from gearshift.scheduler.config.settings import settings_of
from gearshift.scheduler.plugins.registry import (
    GreedyArgs,
    ObjectiveArgs,
    Point,
    RestartArgs,
    plugin,
)
from gearshift.scheduler.plugins.stages import allocator_for
from gearshift.scheduler.sim.simulator import Multiplexed, SimulationResult, simulate_pipeline
from gearshift.scheduler.sim.trace import TraceJob, generate_workload, read_trace
from gearshift.scheduler.state.state import SchedulerSettings

CLUSTER = {"v100": 8, "p100": 16, "k80": 24}
# label -> (allocate plugin, elastic objective)
POLICIES: dict[str, tuple[str, bool]] = {
    "rigid LAS": ("las", False),
    "elastic LAS": ("las", True),
    "FTF": ("finish_time_fairness", True),
    "makespan": ("makespan", True),
    "EasyScale": ("easyscale", True),
    "default profile": ("", True),
}
TARGET = 1.05


@dataclass(frozen=True)
class Row:
    trace: str
    policy: str
    long_before: SimulationResult
    short_before: SimulationResult
    long_after: SimulationResult
    short_after: SimulationResult

    @property
    def ratio_before(self) -> float:
        return self.short_before.average_jct / self.long_before.average_jct

    @property
    def ratio_after(self) -> float:
        return self.short_after.average_jct / self.long_after.average_jct


def settings_for(
    policy: str, round_seconds: float, restart_aware: bool, residency: float | None = None
) -> SchedulerSettings:
    """The settings a configuration file naming `policy` gives (the default profile when
    empty), at `round_seconds`, with the restart rule on or off."""
    name, elastic = POLICIES[policy]
    settings = settings_of(load(None))
    if name:
        base = settings_of(load(None))
        settings = replace(base, policy=name, elastic=elastic, collocation="none")
    # the rule's own defaults, on: the plugin's (LAS, the default profile's objective, has
    # Sia's re-allocation factor on)
    found = plugin(Point.ALLOCATE, name or settings.policy)
    kind = found.args if found is not None and issubclass(found.args, RestartArgs) else None
    if kind is None:
        kind = ObjectiveArgs if name != "easyscale" else GreedyArgs
    defaults = kind(restart_aware=True)
    if residency is not None:
        defaults = defaults.model_copy(update={"residency": residency})
    return replace(
        settings,
        round_seconds=round_seconds,
        recompute_in_background=False,
        restart_cost=defaults.restart_cost() if restart_aware else None,
    )


def run(
    workload: Sequence[TraceJob],
    table: ThroughputTable,
    policy: str,
    *,
    round_seconds: float,
    restart_seconds: float,
    restart_aware: bool,
    residency: float | None = None,
    cluster: Mapping[str, int] = CLUSTER,
    prior: Mapping[str, float] | None = None,
) -> SimulationResult:
    """`policy` on `workload`, every restart (first start included) charged `restart_seconds`
    or, for a model `prior` names, its prior (bench/sia.py: Sia's delays per model)."""
    settings = settings_for(policy, round_seconds, restart_aware, residency)
    allocator = allocator_for(settings)
    return simulate_pipeline(
        workload,
        cluster,
        table,
        allocator,
        round_seconds=round_seconds,
        rescale_seconds=restart_seconds,
        restart_prior=prior,
        charge_first_start=True,
        elastic=settings.elastic or policy == "EasyScale",
        prices=settings.prices,
        name=policy,
        multiplexed=Multiplexed() if settings.collocates else None,
    )


def traces(
    names: Sequence[str], table: ThroughputTable, jobs: int, rate: float
) -> dict[str, list[TraceJob]]:
    out: dict[str, list[TraceJob]] = {}
    for name in names:
        if name == "gavel":
            out[name] = read_trace(shared_data("gavel") / "max_min_fairness.trace")
        elif name.startswith("gen") and name[3:].isdigit():
            out[name] = generate_workload(table, jobs, rate, seed=int(name[3:]))
        else:
            raise SystemExit(f"--traces: {name!r} is neither gavel nor genN")
    return out


def render(rows: Sequence[Row], rounds: tuple[float, float], restart: float) -> str:
    long, short = rounds
    head = (
        f"{'TRACE':<6} {'POLICY':<16} {'BEFORE ' + f'{long:.0f}s':>12} {f'{short:.0f}s':>10} "
        f"{'x':>5} {'AFTER ' + f'{long:.0f}s':>12} {f'{short:.0f}s':>10} {'x':>5} "
        f"{'RESC/JOB before':>15} {'after':>6} {'TARGET':>6}"
    )
    lines = [f"average JCT, h; {restart:.0f} s restarts, first start included", head]
    for r in rows:
        lines.append(
            f"{r.trace:<6} {r.policy:<16} {r.long_before.average_jct / 3600:>12.2f} "
            f"{r.short_before.average_jct / 3600:>10.2f} {r.ratio_before:>5.2f} "
            f"{r.long_after.average_jct / 3600:>12.2f} {r.short_after.average_jct / 3600:>10.2f} "
            f"{r.ratio_after:>5.2f} {r.short_before.rescales_per_job:>15.2f} "
            f"{r.short_after.rescales_per_job:>6.2f} "
            f"{'met' if r.ratio_after <= TARGET else 'MISSED':>6}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", default="gavel,gen1,gen2,gen3")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--restart", type=float, default=57.0)
    parser.add_argument("--rounds", default="360,60", help="LONG,SHORT round seconds")
    parser.add_argument("--jobs", type=int, default=100, help="jobs of a generated trace")
    parser.add_argument("--jobs-per-hour", type=float, default=4.0)
    parser.add_argument(
        "--residency", type=float, help="the plugins' residency argument (default: theirs)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    long, short = (float(x) for x in args.rounds.split(","))
    policies = [p.strip() for p in args.policies.split(",")]
    for p in policies:
        if p not in POLICIES:
            parser.error(f"--policies: {p!r} is not one of {', '.join(POLICIES)}")
    table = load_throughputs(shared_data("gavel") / "simulation_throughputs.json")
    workloads = traces(args.traces.split(","), table, args.jobs, args.jobs_per_hour)
    rows: list[Row] = []
    for trace, workload in workloads.items():
        for policy in policies:
            got = {
                (rounds, aware): run(
                    workload,
                    table,
                    policy,
                    round_seconds=rounds,
                    restart_seconds=args.restart,
                    restart_aware=aware,
                    residency=args.residency,
                )
                for aware in (False, True)
                for rounds in (long, short)
            }
            row = Row(
                trace,
                policy,
                got[(long, False)],
                got[(short, False)],
                got[(long, True)],
                got[(short, True)],
            )
            rows.append(row)
            print(render([row], (long, short), args.restart).splitlines()[-1], flush=True)
    print()
    print(render(rows, (long, short), args.restart))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "trace": r.trace,
                        "policy": r.policy,
                        **{
                            f"{k}_jct_s": getattr(r, k).average_jct
                            for k in ("long_before", "short_before", "long_after", "short_after")
                        },
                        **{
                            f"{k}_rescales_per_job": getattr(r, k).rescales_per_job
                            for k in ("long_before", "short_before", "long_after", "short_after")
                        },
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
