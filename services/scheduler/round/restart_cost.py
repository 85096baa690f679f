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
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartCost:
    """How an allocator weighs moves; `off()` is the moves-are-free world of Gavel's paper."""

    residency_multiple: float = 30.0  # a placement is kept this many restarts' time
    horizon_seconds: float = 3600.0  # cap on the remaining time a move's gain is counted over

    def __post_init__(self) -> None:
        if self.residency_multiple < 0 or math.isnan(self.residency_multiple):
            raise ValueError(f"residency_multiple must be >= 0, not {self.residency_multiple}")
        if not self.horizon_seconds > 0:
            raise ValueError(f"horizon_seconds must be > 0, not {self.horizon_seconds}")

    @classmethod
    def off(cls) -> RestartCost:
        return cls(residency_multiple=0.0, horizon_seconds=math.inf)

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

    def resident(self, placed_at: float, now: float, restart_seconds: float) -> bool:
        """Whether a placement started at `placed_at` is still within its residency."""
        return now - placed_at < self.residency_multiple * restart_seconds
