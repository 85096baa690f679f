"""DeepPool's foreground/background multiplexing, the worker's feedback loop as plain logic.

A background task shares a device with a foreground job's task and runs at the lowest
priority; on top of that, the worker pauses it (at a global-step boundary) whenever the
foreground's measured step time rises above (1 + bound) x its baseline, the step time it
has while the background is paused. One `Controller` per background task decides from
(time, step) reports of the foreground's rank 0 (its progress file) and a clock it is
given, so the logic is tested with fake clocks; multiplex.py runs it against real tasks.

Phases of a background task:

- BASELINE (paused): measuring the foreground alone; a background starts here. Once
  `min_steps` foreground steps over at least `baseline_s` are measured: RUN.
- RUN (running): the foreground's step time over the newest reports (spanning at
  least `measure_s` and at most `window_s`) is compared with the bound; above it: HOLD,
  one more pause.
  A foreground that stops reporting counts too: from the first report kept until now,
  fewer than (steps kept + steps per report) steps were done.
- HOLD (paused for `pause_s`): the baseline is measured again meanwhile; then RUN.
- FREE (running): nothing to measure on this worker (no task of the partner job runs
  its rank 0 here, it ended, or it made no progress for `baseline_timeout_s` while a
  baseline was awaited); BASELINE again once the foreground reports a new step.

After each change of phase, the reports count only from the first one that comes after
it: the report that straddles the change mixes both regimes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_MAX_SLOWDOWN = 0.2
DEFAULT_PAUSE_S = 2.0


@dataclass(frozen=True)
class Policy:
    """How the worker multiplexes (its flags; a task's own bound overrides max_slowdown)."""

    max_slowdown: float = DEFAULT_MAX_SLOWDOWN  # pause above (1 + this) x baseline step time
    pause_s: float = DEFAULT_PAUSE_S  # a pause's length, before measuring again
    window_s: float = 2.0  # step time over the newest reports spanning at most this
    baseline_s: float = 1.0  # a baseline spans at least this long ...
    min_steps: int = 3  # ... and this many foreground steps
    measure_s: float = 0.5  # a step time judged against the bound spans at least this long
    baseline_timeout_s: float = 30.0  # no foreground step this long while awaiting one: FREE


@dataclass(frozen=True)
class Foreground:
    """What the worker sees of the foreground job: its rank 0's latest progress report."""

    job_id: str
    report: tuple[float, int] | None  # (time written, global step); None before the first
    done: bool = False  # reached its last step


class Phase(enum.StrEnum):
    BASELINE = "baseline"
    RUN = "run"
    HOLD = "hold"
    FREE = "free"


@dataclass(frozen=True)
class Decision:
    paused: bool
    reason: str
    pause_count: int  # pauses for a slowdown so far (the first baseline's wait not counted)


class StepMeter:
    """The foreground's step time from its (time, step) reports since the last reset."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._points: list[tuple[float, int]] = []
        self._last_step: int | None = None
        self._increment = 0  # steps between the last two reports seen
        self._since = float("-inf")  # reports from before this are not counted
        self.last_change = float("-inf")  # when the step last changed (or the reset)

    def reset(self, now: float) -> None:
        self._points.clear()
        self._since = now
        self.last_change = now

    def observe(self, time: float, step: int) -> None:
        last = self._last_step
        if last == step:
            return
        self._last_step = step
        if last is None or step < last:  # the first report, or a restart from a checkpoint
            self._points.clear()
        else:
            self._increment = step - last
        self.last_change = max(self.last_change, time)
        if time < self._since:  # written before the reset: the anchor is the next one
            return
        self._points.append((time, step))
        newest = self._points[-1][0]
        while len(self._points) > 2 and newest - self._points[1][0] >= self.window_s:
            self._points.pop(0)

    @property
    def steps(self) -> int:
        return self._points[-1][1] - self._points[0][1] if self._points else 0

    @property
    def span(self) -> float:
        return self._points[-1][0] - self._points[0][0] if self._points else 0.0

    @property
    def rate(self) -> float | None:
        """Seconds per step over the points kept (None: fewer than two)."""
        return self.span / self.steps if self.steps > 0 else None

    def stalled(self, now: float) -> float | None:
        """A lower bound of the mean step time from the first point kept until now: the next
        report (`increment` steps after the last) has not come, so fewer steps than
        `steps + increment` were done meanwhile. Near the rate while reports keep coming,
        it grows while none comes (a foreground held up by the background)."""
        if not self._increment:
            return None
        first = self._points[0][0] if self._points else self._since
        return max(now - first, 0.0) / (self.steps + self._increment)


class Controller:
    """The pause decisions for one background task (one per task, fed every poll)."""

    def __init__(self, partner: str, policy: Policy, now: float) -> None:
        self.partner = partner
        self.policy = policy
        self.meter = StepMeter(policy.window_s)
        self.meter.reset(now)
        self.phase = Phase.BASELINE
        self.since = now
        self.baseline: float | None = None
        self.pause_count = 0
        self.reason = self._measuring()
        self._free_step: int | None = None

    @property
    def paused(self) -> bool:
        return self.phase in (Phase.BASELINE, Phase.HOLD)

    def _measuring(self) -> str:
        return f"measuring foreground {self.partner}'s step time alone (a baseline)"

    def _enter(self, phase: Phase, now: float, reason: str) -> None:
        self.phase, self.since, self.reason = phase, now, reason
        self.meter.reset(now)

    def update(self, now: float, fg: Foreground | None) -> Decision:
        """One poll: the foreground as seen now (None: no task of it runs rank 0 here)."""
        if fg is None or fg.done:
            if self.phase is not Phase.FREE:
                why = "ended" if fg is not None else "has no progress to measure on this worker"
                self._free_step = None
                self._enter(Phase.FREE, now, f"foreground {self.partner} {why}: running unpaused")
        else:
            if fg.report is not None:
                self.meter.observe(*fg.report)
            step = fg.report[1] if fg.report is not None else None
            {
                Phase.FREE: self._free,
                Phase.BASELINE: self._baseline,
                Phase.RUN: self._run,
                Phase.HOLD: self._hold,
            }[self.phase](now, step)
        return Decision(self.paused, self.reason, self.pause_count)

    def _free(self, now: float, step: int | None) -> None:
        if step is not None and step != self._free_step:
            self._enter(Phase.BASELINE, now, self._measuring())

    def _baseline(self, now: float, step: int | None) -> None:
        p, m = self.policy, self.meter
        rate = m.rate
        if rate is not None and m.steps >= p.min_steps and m.span >= p.baseline_s:
            self.baseline = rate
            self._enter(
                Phase.RUN, now, f"foreground {self.partner} alone: {rate:.3f} s/step (baseline)"
            )
        elif now - m.last_change > p.baseline_timeout_s:
            self._free_step = step
            self._enter(
                Phase.FREE,
                now,
                f"foreground {self.partner} made no progress in {p.baseline_timeout_s:.0f} s: "
                "running unpaused",
            )

    def _run(self, now: float, _step: int | None) -> None:
        assert self.baseline is not None
        m = self.meter
        p = self.policy
        rate = m.rate if m.steps >= p.min_steps and m.span >= p.measure_s else None
        measured = max((t for t in (rate, m.stalled(now)) if t is not None), default=None)
        bound = (1 + p.max_slowdown) * self.baseline
        if measured is not None and measured > bound:
            self.pause_count += 1
            self._enter(
                Phase.HOLD,
                now,
                f"foreground {self.partner} at {measured:.3f} s/step > bound {bound:.3f} s "
                f"(baseline {self.baseline:.3f} s)",
            )

    def _hold(self, now: float, _step: int | None) -> None:
        if now - self.since < self.policy.pause_s:
            return
        m = self.meter
        if m.rate is not None and m.steps >= self.policy.min_steps:
            self.baseline = m.rate
        self._enter(
            Phase.RUN,
            now,
            f"resumed after {self.policy.pause_s:g} s paused; foreground {self.partner} alone: "
            f"{self.baseline:.3f} s/step (baseline)",
        )
