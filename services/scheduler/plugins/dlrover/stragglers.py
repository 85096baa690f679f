"""Straggler detection: which training process of a job is much slower than its peers.

Plain logic over plain data (the registry feeds it what heartbeats carry; tests feed it
made-up reports). Every training process reports its compute time per global step
over its latest window of steps (its ESTs' data, forward and backward, without the
gradient exchange: in a synchronous job every process waits there for the slowest, so
the wall time per step is the same everywhere and says nothing about who is slow).

- A *report* is a rank's measurement at a new step; a heartbeat repeating the same one
  is not counted again.
- Times are compared per EST (a process holding 3 ESTs computes 3 mini-batches a step),
  and only among processes on the same accelerator type (a D2 job mixing V100s and T4s
  has T4 processes slower by nature, not stragglers).
- A rank is slow when its time is above (1 + margin) x the median of the latest times
  of the job's *other* processes (leaving it out: with two processes the median of both
  would move half way towards the straggler), and by at least `min_gap_s` (10 ms) a
  step (a few milliseconds of jitter on a tiny model's step is no straggler). A job
  with one process has no peer to be compared with and is never judged: its step times
  alone cannot tell a slow worker from a heavy model, and other jobs run other models.
- After `reports` consecutive slow reports the rank is a straggler and its worker is
  marked degraded (the registry does that, once per run of slow reports); a normal
  report resets the count.
- A degraded worker is cleared when one of its processes reports normal times for
  `reports` consecutive reports (the slowness is gone, e.g. the CPU hog ended), or
  after `clear_seconds` without a new slow verdict (a worker the jobs moved off has
  nothing left to report with; it is tried again then).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gearshift.scheduler.types import StragglerPolicy


@dataclass(frozen=True)
class Report:
    """One process's compute time per global step, at `step`."""

    rank: int
    worker_id: str
    step: int
    seconds_per_step: float
    ests: int = 1
    kind: str = ""  # the accelerator type it runs on: compared only with the same

    @property
    def per_est(self) -> float:
        return self.seconds_per_step / max(self.ests, 1)


@dataclass
class Track:
    """What the detection remembers of one rank of the job's running placement."""

    latest: Report
    slow: int = 0  # consecutive slow reports
    normal: int = 0  # consecutive normal reports


@dataclass(frozen=True)
class Verdict:
    """A rank judged slow (a straggler when `reports` reached the policy's count)."""

    rank: int
    worker_id: str
    seconds_per_step: float
    median: float  # the other processes' median, in seconds per step of this rank's ESTs
    reports: int

    def describe(self) -> str:
        return (
            f"STRAGGLER rank {self.rank} on worker {self.worker_id}: "
            f"{self.seconds_per_step:.3g} s/step vs median {self.median:.3g} s "
            f"for {self.reports} reports"
        )


@dataclass
class Outcome:
    """What new reports showed: stragglers (first verdict, or still slow) and workers
    whose processes reported normal for `reports` consecutive reports."""

    stragglers: list[Verdict] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)


def observe(
    tracks: dict[int, Track], reports: Sequence[Report], policy: StragglerPolicy
) -> Outcome:
    """Fold new reports of one job's running placement into `tracks` (rank -> Track,
    updated in place) and judge each new one against the other ranks' latest."""
    out = Outcome()
    for report in reports:
        track = tracks.get(report.rank)
        if track is not None and report.step == track.latest.step:
            continue  # the same measurement again (heartbeats repeat it)
        if track is None:
            track = tracks[report.rank] = Track(report)
        track.latest = report
        others = [
            t.latest.per_est
            for rank, t in tracks.items()
            if rank != report.rank and t.latest.kind == report.kind
        ]
        if not others:
            continue  # nobody to compare with (yet, or a one-process job)
        median = statistics.median(others)
        gap = (report.per_est - median) * max(report.ests, 1)
        if report.per_est > (1 + policy.margin) * median and gap >= policy.min_gap_s:
            track.slow, track.normal = track.slow + 1, 0
            if track.slow >= policy.reports:
                out.stragglers.append(
                    Verdict(
                        report.rank,
                        report.worker_id,
                        report.seconds_per_step,
                        median * max(report.ests, 1),
                        track.slow,
                    )
                )
        else:
            track.slow, track.normal = 0, track.normal + 1
            if track.normal >= policy.reports and report.worker_id not in out.recovered:
                out.recovered.append(report.worker_id)
    return out


def expired(marks: Mapping[str, float], now: float, policy: StragglerPolicy) -> list[str]:
    """Workers whose degraded mark (worker -> time of its latest slow verdict) has lasted
    `clear_seconds`: they are cleared and tried again."""
    return sorted(w for w, at in marks.items() if now - at >= policy.clear_seconds)
