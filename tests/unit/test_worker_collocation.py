"""The multiplexing controller (DeepPool's background jobs) on a fake clock and made-up
foreground progress: when it pauses, for how long, what it says, when it lets go."""

from __future__ import annotations

import re

from gearshift.worker.collocation import Controller, Foreground, Phase, Policy, StepMeter

POLICY = Policy(max_slowdown=0.2, pause_s=2.0, window_s=2.0, baseline_s=1.0, min_steps=3)


class Sim:
    """A foreground that reports every `every` steps, each step taking `step_s` (changeable),
    and a controller polled every `poll_s` of fake time."""

    def __init__(self, step_s: float, every: int = 1, poll_s: float = 0.05) -> None:
        self.now = 0.0
        self.step_s = step_s
        self.every = every
        self.poll_s = poll_s
        self.step = 0
        self.next_step_at = step_s
        self.report: tuple[float, int] | None = None
        self.ctl = Controller("job-fg", POLICY, self.now)
        self.log: list[tuple[float, bool, str]] = []

    def run(self, seconds: float, fg: bool = True) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now += self.poll_s
            while self.next_step_at <= self.now:
                self.step += 1
                if self.step % self.every == 0:
                    self.report = (self.next_step_at, self.step)
                self.next_step_at += self.step_s
            seen = Foreground("job-fg", self.report) if fg else None
            d = self.ctl.update(self.now, seen)
            if not self.log or self.log[-1][1:] != (d.paused, d.reason):
                self.log.append((self.now, d.paused, d.reason))

    def state(self) -> tuple[bool, Phase]:
        """(paused, phase) now (a call, so that type checkers do not narrow it)."""
        return self.ctl.paused, self.ctl.phase

    def until(self, paused: bool, limit: float) -> float:
        """Poll until the controller's paused state is `paused`; the time it changed."""
        end = self.now + limit
        while self.ctl.paused != paused:
            assert self.now < end, f"not {'paused' if paused else 'running'} in {limit} s"
            self.run(self.poll_s)
        return self.now


def test_starts_paused_until_a_baseline_is_measured_then_runs() -> None:
    sim = Sim(step_s=0.1)
    sim.run(0.5)
    assert sim.state() == (True, Phase.BASELINE)
    assert "measuring foreground job-fg's step time alone" in sim.ctl.reason
    sim.run(1.5)
    assert sim.state() == (False, Phase.RUN)
    assert sim.ctl.baseline is not None and abs(sim.ctl.baseline - 0.1) < 1e-6
    assert sim.ctl.reason == "foreground job-fg alone: 0.100 s/step (baseline)"
    sim.run(5.0)  # the same speed with the background running: no pause
    assert not sim.ctl.paused and sim.ctl.pause_count == 0


def test_pauses_above_the_bound_for_the_hold_time_then_measures_again() -> None:
    sim = Sim(step_s=0.1)
    sim.run(2.0)
    assert sim.state()[1] == Phase.RUN
    sim.step_s = 0.13  # 30% slower with the background running: above the 20% bound
    paused_at = sim.until(paused=True, limit=2.0)
    assert sim.state()[1] == Phase.HOLD and sim.ctl.pause_count == 1
    # The mean over the window, which still holds steps from before the slowdown.
    assert re.fullmatch(
        r"foreground job-fg at 0\.1[23]\d s/step > bound 0\.120 s \(baseline 0\.100 s\)",
        sim.ctl.reason,
    ), sim.ctl.reason
    sim.step_s = 0.105  # alone again (paused): the baseline is measured anew
    resumed_at = sim.until(paused=False, limit=3.0)
    assert abs(resumed_at - paused_at - POLICY.pause_s) < 0.06
    assert sim.ctl.baseline is not None and abs(sim.ctl.baseline - 0.105) < 1e-6
    assert sim.ctl.reason.startswith("resumed after 2 s paused; foreground job-fg alone: 0.105")
    sim.step_s = 0.12  # 14% slower than the new baseline: within the bound
    sim.run(3.0)
    assert not sim.ctl.paused and sim.ctl.pause_count == 1


def test_a_foreground_that_stops_reporting_counts_as_slow() -> None:
    """Reports every 5 steps of 0.1 s; then one step takes 2 s: before the report comes, the
    wait shows that the steps since the first report kept (2 s ago) take more than the
    bound on average."""
    sim = Sim(step_s=0.1, every=5)
    sim.run(2.0)
    assert sim.state()[1] == Phase.RUN
    sim.next_step_at = sim.now + 2.0
    sim.run(1.5)
    assert sim.state()[1] == Phase.HOLD and sim.ctl.pause_count == 1


def test_nothing_to_measure_runs_unpaused_and_a_foreground_that_appears_is_measured() -> None:
    sim = Sim(step_s=0.1)
    sim.run(0.5, fg=False)
    assert sim.state() == (False, Phase.FREE)
    assert sim.ctl.reason == (
        "foreground job-fg has no progress to measure on this worker: running unpaused"
    )
    sim.run(0.5)  # its rank 0 starts here and reports: measure it alone first
    assert sim.state() == (True, Phase.BASELINE)
    sim.run(2.0)
    assert sim.state()[1] == Phase.RUN
    d = sim.ctl.update(sim.now, Foreground("job-fg", sim.report, done=True))
    assert not d.paused and d.reason == "foreground job-fg ended: running unpaused"


def test_a_foreground_that_never_reports_lets_the_background_run() -> None:
    policy = Policy(baseline_timeout_s=5.0)
    ctl = Controller("job-fg", policy, 0.0)
    assert ctl.update(4.9, Foreground("job-fg", None)).paused
    d = ctl.update(5.1, Foreground("job-fg", None))
    assert not d.paused and d.reason == (
        "foreground job-fg made no progress in 5 s: running unpaused"
    )
    assert ctl.update(6.0, Foreground("job-fg", (5.5, 10))).paused  # it moves: measure


def test_the_meter_counts_reports_from_after_a_reset_and_within_its_window() -> None:
    meter = StepMeter(window_s=1.0)
    meter.observe(0.0, 0)
    meter.observe(0.5, 5)
    meter.reset(0.6)
    meter.observe(0.7, 10)  # written after the reset: the anchor
    assert (meter.rate, meter.steps) == (None, 0)
    for i in range(1, 6):
        meter.observe(0.7 + 0.5 * i, 10 + 5 * i)
    rate = meter.rate
    assert rate is not None and abs(rate - 0.1) < 1e-9
    assert meter.span <= 1.0 + 1e-9 and meter.steps == 10
    stalled = meter.stalled(3.7)
    assert stalled is not None and abs(stalled - 0.1) < 1e-9
    meter.observe(4.0, 3)  # a restart from an earlier checkpoint: start over
    assert meter.steps == 0
