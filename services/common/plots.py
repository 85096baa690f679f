"""Plot pieces shared by the simulator's plots and `gearshift job ID --plot` (matplotlib).

Figures are drawn on matplotlib's Agg canvas directly, without pyplot: nothing
global is switched and no display is needed. Needs matplotlib (the `scheduler`
or `plots` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

# One color per accelerator type, the same in every figure of a run.
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d")

Usage = Sequence[tuple[float, Mapping[str, int]]]


def new_figure(rows: int = 1, *, width: float = 8.0, row_height: float = 3.0) -> Figure:
    figure = Figure(figsize=(width, row_height * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def type_colors(types: Sequence[str]) -> dict[str, str]:
    return {kind: PALETTE[i % len(PALETTE)] for i, kind in enumerate(sorted(set(types)))}


def plot_devices_over_time(
    ax: Axes,
    usage: Usage,
    *,
    colors: Mapping[str, str] | None = None,
    scale: float = 1.0,
    origin: float = 0.0,
) -> None:
    """Devices in use by type, stacked, as steps: each point holds until the next one.

    Times are shown as (time - origin) / scale (e.g. scale 3600 for hours).
    """
    types = sorted({kind for _, counts in usage for kind in counts})
    colors = colors or type_colors(types)
    times = [(when - origin) / scale for when, _ in usage]
    below = [0] * len(usage)
    for kind in types:
        counts = [c.get(kind, 0) for _, c in usage]
        above = [b + c for b, c in zip(below, counts, strict=True)]
        ax.fill_between(times, below, above, step="post", color=colors[kind], label=kind, lw=0)
        below = above
    ax.set_ylabel("devices")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if types:
        ax.legend(loc="upper right", fontsize="small", title="type")
    ax.grid(alpha=0.3)


def save_png(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
