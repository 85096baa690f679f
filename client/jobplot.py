"""`gearshift job ID --plot FILE`: the job's devices by type over time and its loss curve, as
one PNG (matplotlib: the `plots` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from gearshift.client import timeline
from gearshift.common.facts import TERMINAL_STATES
from gearshift.common.plots import new_figure, plot_devices_over_time, save_png
from gearshift.v1 import scheduler_pb2


def job_figure(
    job: scheduler_pb2.Job, events: Sequence[scheduler_pb2.JobEvent], now: float
) -> Figure:
    """Two panels on one time axis (seconds since the job started): devices by type with its
    rescales marked, then loss and samples/s."""
    end = job.finished_at or now
    origin = job.started_at or job.submitted_at
    figure = new_figure(2, width=9.0, row_height=3.2)
    top, bottom = figure.subplots(2, 1, sharex=True)
    usage = timeline.devices_over_time(timeline.segments(events), end)
    plot_devices_over_time(top, usage, origin=origin)
    for when in timeline.rescale_times(events):
        top.axvline(when - origin, color="#c6362f", ls="--", lw=1)
    top.set_title(f"{job.job_id} ({job.spec.name}): devices by type, rescales dashed")
    latest = []
    if job.state not in TERMINAL_STATES:
        p = job.progress
        latest.append(timeline.ProgressPoint(now, p.step, p.loss, p.samples_per_second))
    points = timeline.progress(events, latest)
    times = [p.time - origin for p in points]
    bottom.plot(times, [p.loss for p in points], color="#e45756", marker="o", ms=3, label="loss")
    bottom.set_ylabel("loss")
    bottom.set_xlabel("seconds since the job started")
    bottom.grid(alpha=0.3)
    rate = bottom.twinx()
    rate.plot(
        times,
        [p.samples_per_second for p in points],
        color="#4c78a8",
        ls=":",
        marker=".",
        label="samples/s",
    )
    rate.set_ylabel("samples/s")
    rate.set_ylim(bottom=0)
    handles = bottom.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    bottom.legend(handles=handles, loc="upper right", fontsize="small")
    bottom.set_title("loss and throughput")
    return figure


def write_job_plot(
    job: scheduler_pb2.Job, events: Sequence[scheduler_pb2.JobEvent], now: float, path: Path
) -> Path:
    return save_png(job_figure(job, events, now), path)
