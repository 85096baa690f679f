"""Whether a move pays for itself: the rule every allocator weighs a restart with.

A running job that is moved, resized or preempted stops, checkpoints and restarts: it makes
no progress for its restart seconds (the decision-to-first-step time its rescales report,
or a per-model prior before the first). Pollux and Sia charge that in their objective; with
short rounds an allocator that does not moves jobs faster than they can restart. Two rules,
plain functions over plain numbers:

- `move_pays`: a running job goes from `now_rate` to `new_rate` only when the work it gains
  over the horizon - its expected remaining time, capped - exceeds the work it loses while
  restarting at the new rate. Uncapped, this is "the time saved over the remaining work
  exceeds the restart".
- `resident`: a job placed less than `residency_multiple` x its restart seconds ago keeps
  its placement, so time-fraction priorities (Gavel's) do not flip it in and out every round.
  A restart is counted at most one round: the residency lengthens the rounds' time sharing
  `residency_multiple`-fold at most (rounds shorter than a restart still share devices).
- `share_period` (rigid rounds, GavelRounds): the devices are re-shared - X recomputed with
  the ledger folded, running jobs preempted for others - at most every `share_multiple` x the
  jobs' mean restart seconds: a round length derived from what a restart costs (8 x 57 s is
  7.6 minutes, near Gavel's 6). Rounds in between only start jobs on free devices, so rounds
  shorter than that period add starts, never flips.
- `factor` (with `realloc_factor`): Sia's re-allocation factor, the share of a job's time
  since its arrival that its restarts, one more included, leave it. Sia multiplies a job's
  goodput on every allocation but its current one by it; ElasticRounds divides the
  priority of a job's current configuration by it, and counts its rate on another
  configuration that many times when weighing a grow, a move or a shrink.
- `work_gain`: what a reallocation that lets a resident job go (shrunk or preempted for
  others) gains over the horizon, summed over every job it changes, restarts included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartCost:
    """How an allocator weighs moves; `off()` is the moves-are-free world of Gavel's paper."""

    residency_multiple: float = 30.0  # a placement is kept this many restarts' time
    horizon_seconds: float = 3600.0  # cap on the remaining time a move's gain is counted over
    # Sia's re-allocation factor (`factor`): a running job's rate on any configuration but
    # its own counts `factor` times, so a job whose restarts ate its time resists the next
    # one (ElasticRounds: its priorities, growth and the shrink rule).
    realloc_factor: bool = False
    share_multiple: float = 8.0  # rigid rounds re-share the devices every this many restarts

    def __post_init__(self) -> None:
        for name in ("residency_multiple", "share_multiple"):
            value = getattr(self, name)
            if value < 0 or math.isnan(value):
                raise ValueError(f"{name} must be >= 0, not {value}")
        if not self.horizon_seconds > 0:
            raise ValueError(f"horizon_seconds must be > 0, not {self.horizon_seconds}")

    @classmethod
    def off(cls) -> RestartCost:
        return cls(residency_multiple=0.0, horizon_seconds=math.inf, share_multiple=0.0)

    def horizon(self, steps_remaining: float, rate: float) -> float:
        """The job's expected remaining seconds at `rate`, capped (the cap when it cannot run)."""
        if rate <= 0:
            return self.horizon_seconds
        return min(steps_remaining / rate, self.horizon_seconds)

    def move_pays(
        self, now_rate: float, new_rate: float, steps_remaining: float, restart_seconds: float
    ) -> bool:
        """Whether going from now_rate to new_rate (steps/s) is worth a restart: the steps
        gained over the horizon exceed the steps lost restarting. A job that is not running
        (now_rate 0) loses nothing by starting."""
        if now_rate <= 0:
            return new_rate > 0
        gained = (new_rate - now_rate) * self.horizon(steps_remaining, now_rate)
        return gained > new_rate * restart_seconds

    def factor(self, age: float, restarts: int, restart_seconds: float) -> float:
        """Sia's re-allocation factor (its `sia.py`, `realloc_factor`) for a job `age`
        seconds after its arrival that restarted `restarts` times since its first start:
        max(age - restarts x restart, 0) / (age + restart), the share of its time not lost
        to restarts should it restart once more; 1 for a job younger than a restart, and
        1 when `realloc_factor` is off."""
        if not self.realloc_factor or age < restart_seconds or age + restart_seconds <= 0:
            return 1.0
        return max(age - restarts * restart_seconds, 0.0) / (age + restart_seconds)

    def residency(self, restart_seconds: float, round_seconds: float = math.inf) -> float:
        """How long a placement is kept: `residency_multiple` restarts, a restart counted at
        most one round. Where a round is at least a restart (Gavel's 6 minutes; 60 s rounds
        at a 57 s restart) a flip's restart is then at most 1/multiple of the placement it
        buys. Rounds shorter than a restart (a dev cluster's 1 s rounds at the live prior of
        10 s) are the operator asking for time shared that finely: the residency stretches
        them `residency_multiple`-fold, not into minutes."""
        return self.residency_multiple * min(restart_seconds, round_seconds)

    def share_period(self, restart_seconds: Iterable[float]) -> float:
        """Seconds between two re-sharings of a rigid round's devices: `share_multiple` x the
        mean restart of the jobs it shares them among (0 without jobs: every round). A flip
        then costs at most 1/share_multiple of the time it buys, whatever the round length."""
        seconds = list(restart_seconds)
        return self.share_multiple * sum(seconds) / len(seconds) if seconds else 0.0

    def resident(
        self,
        placed_at: float,
        now: float,
        restart_seconds: float,
        round_seconds: float = math.inf,
    ) -> bool:
        """Whether a placement started at `placed_at` is still within its residency."""
        return now - placed_at < self.residency(restart_seconds, round_seconds)


@dataclass(frozen=True)
class Reallocated:
    """One job a reallocation changes: its rate (steps/s) with and without it, and whether
    each restarts it (a running job put on other devices; a start costs nothing, as in
    `move_pays`)."""

    unit: float  # its rate on one device: steps of different jobs compare as device-seconds
    steps_remaining: float
    restart_seconds: float
    rate_without: float
    restarts_without: bool
    rate_with: float
    restarts_with: bool


def _work(rate: float, steps_remaining: float, window: float, restart: float) -> float:
    """Steps done within `window` at `rate` after `restart` seconds, at most what is left."""
    if rate <= 0:
        return 0.0
    return min(steps_remaining, rate * max(window - restart, 0.0))


def work_gain(jobs: Iterable[Reallocated], window: float) -> float:
    """Device-seconds of work a reallocation gains within `window` (the horizon of the job it
    lets go), over every job it changes: the jobs it admits or grows gain their steps; the
    job it shrinks or preempts loses the rate it gives up and, shrunk, its restart at the
    new rate. Each job's steps count in units of its own one-device rate, so that the sum is
    the objective's throughput in Gavel's normalized form. Positive: the reallocation pays.
    A preemption among equally fast jobs never pays (the devices change hands, the restart
    is lost): that is what a residency keeps out."""
    total = 0.0
    for job in jobs:
        unit = job.unit if job.unit > 0 else 1.0
        with_ = _work(
            job.rate_with,
            job.steps_remaining,
            window,
            job.restart_seconds if job.restarts_with else 0.0,
        )
        without = _work(
            job.rate_without,
            job.steps_remaining,
            window,
            job.restart_seconds if job.restarts_without else 0.0,
        )
        total += (with_ - without) / unit
    return total
