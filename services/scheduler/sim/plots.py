"""`gearshift simulate --plot DIR`: PNG figures of one or more simulation results.

Plain functions over SimulationResult: one result per policy, drawn together
so that policies run on the same workload compare at a glance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from gearshift.common.plots import (
    PALETTE,
    new_figure,
    plot_devices_over_time,
    save_png,
    type_colors,
)
from gearshift.scheduler.sim.simulator import SimulationResult

HOUR = 3600.0
FILES = ("jct_cdf.png", "devices_over_time.png", "slowdown.png")


def _begin(results: Sequence[SimulationResult]) -> float:
    """The first arrival of the workload: time 0 of every figure."""
    return min((j.arrival_time for r in results for j in r.jobs), default=0.0)


def jct_cdf_figure(results: Sequence[SimulationResult]) -> Figure:
    """Fraction of jobs completed within a JCT, one curve per policy."""
    figure = new_figure(1, row_height=4.0)
    ax = figure.add_subplot()
    for i, result in enumerate(results):
        jcts = sorted(j.jct / HOUR for j in result.jobs)
        fractions = [(k + 1) / len(jcts) for k in range(len(jcts))]
        ax.step(
            jcts,
            fractions,
            where="post",
            color=PALETTE[i % len(PALETTE)],
            label=f"{result.policy} (mean {result.average_jct / HOUR:.2f} h)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.set_title("JCT distribution")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize="small")
    return figure


def usage_figure(results: Sequence[SimulationResult]) -> Figure:
    """Devices in use by type over time, one panel per policy (same axes)."""
    figure = new_figure(len(results), row_height=2.6)
    axes = figure.subplots(len(results), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    colors = type_colors([kind for r in results for _, c in r.usage for kind in c])
    origin = _begin(results)
    for ax, result in zip(axes, results, strict=True):
        plot_devices_over_time(ax, result.usage, colors=colors, scale=HOUR, origin=origin)
        ax.set_title(f"{result.policy}: utilization {result.utilization:.0%}", fontsize="medium")
    axes[-1].set_xlabel("time since the first arrival (hours)")
    return figure


def slowdown_figure(results: Sequence[SimulationResult]) -> Figure:
    """Per-job slowdown in arrival order, one series per policy: JCT over the job's isolated
    duration (its share of the cluster alone: finish-time fairness, `JobResult.ftf`)."""
    figure = new_figure(1, row_height=4.0)
    ax = figure.add_subplot()
    for i, result in enumerate(results):
        values = [j.ftf if j.isolated_seconds > 0 else math.nan for j in result.jobs]
        ax.plot(
            range(len(values)),
            values,
            marker="o",
            markersize=3,
            linestyle="none",
            color=PALETTE[i % len(PALETTE)],
            label=result.policy,
        )
    ax.axhline(1.0, color="#555555", lw=0.8, ls="--")
    finite = [j.ftf for r in results for j in r.jobs if j.isolated_seconds > 0]
    if finite and max(finite) > 10:  # a few starved jobs would flatten the rest
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel("job (arrival order)")
    ax.set_ylabel("slowdown (JCT / isolated-share duration)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Per-job slowdown")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", fontsize="small")
    return figure


def write_plots(results: Sequence[SimulationResult], folder: Path) -> list[Path]:
    """The three figures as PNGs in `folder` (created); returns their paths."""
    if not results:
        raise ValueError("no simulation result to plot")
    figures = (jct_cdf_figure(results), usage_figure(results), slowdown_figure(results))
    return [save_png(figure, folder / name) for figure, name in zip(figures, FILES, strict=True)]
