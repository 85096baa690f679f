"""bench/load.py --repeat: repeated trials of one configuration summed up by their median
(the same code's runs differ 2-3x on a shared host), and the knee read from it."""

from __future__ import annotations

import io
import logging

import pytest

from bench.load import (
    Report,
    RpcStats,
    knee,
    main,
    median_report,
    print_spread,
    slow_rounds,
    slow_rounds_line,
    spread,
)
from gearshift.common.logs import TextFormatter
from gearshift.scheduler.round.rounds import RoundReport, log_round


def report(workers: int, heartbeat_p99: float, submit_p99: float, starts: float) -> Report:
    def stats(p99: float) -> RpcStats:
        return RpcStats(count=10, errors=0, p50_ms=p99 / 4, p99_ms=p99, max_ms=p99 * 2)

    return Report(
        config={"workers": workers},
        rpcs={
            "RegisterWorker (startup)": stats(900.0),  # shown, never held to the target
            "Heartbeat": stats(heartbeat_p99),
            "SubmitJob": stats(submit_p99),
        },
        rounds={"mean_s": 0.8},
        queued_jobs=0,
        running_jobs=0,
        counters={"job_starts_total": starts},
        log_events={},
        reregistrations=0,
        preload_seconds=0.0,
        registration_seconds=0.0,
        host_busy=0.6,
    )


def test_repeated_trials_give_each_rpcs_median_p99_and_its_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trials = [report(1000, 120, 300, 480), report(1000, 90, 80, 150), report(1000, 500, 60, 600)]
    assert spread(trials) == {
        "RegisterWorker (startup)": (900.0, 900.0, 900.0),
        "Heartbeat": (120.0, 90.0, 500.0),
        "SubmitJob": (80.0, 60.0, 300.0),
    }
    assert median_report(trials) is trials[0]  # worst p99s 300, 90, 500: the middle one
    print_spread(trials)
    out = capsys.readouterr().out
    assert "Heartbeat" in out and "120.0  (90.0-500.0)  > 100 ms" in out
    assert "starts in the window: 480, 150, 600" in out
    assert "(900.0-900.0)\n" in out  # the startup burst is not flagged


def test_the_knee_is_read_from_each_counts_median_trial() -> None:
    at_250 = [report(250, 300, 50, 0), report(250, 60, 50, 0), report(250, 70, 50, 0)]
    at_500 = [report(500, 150, 50, 0), report(500, 90, 50, 0), report(500, 120, 50, 0)]
    assert knee([median_report(at_250), median_report(at_500)]) == 500
    assert knee(at_250) == 250  # one bad trial alone would have put it at 250


def test_repeat_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--repeat", "0"])
    assert "--repeat must be > 0" in capsys.readouterr().err


def test_the_slow_rounds_the_scheduler_logs_are_read_back_with_their_phases() -> None:
    """The scheduler's "slow round" line (text format, as bench/load.py runs it) parsed
    into each round's seconds and phases: the longest, and the phases it spent most in."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("gearshift.scheduler")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for number, start in ((7, 0.9), (8, 0.2)):
            slow = RoundReport(number)
            slow.phases = {"asks": 0.02, "decide": 0.4, "start": start, "reconcile": 0.01}
            log_round(slow)
        fast = RoundReport(9)
        fast.phases = {"decide": 0.3}
        log_round(fast)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    rounds = slow_rounds("other lines\n" + stream.getvalue())
    assert rounds == [
        {"seconds": 1.33, "asks": 0.02, "decide": 0.4, "start": 0.9, "reconcile": 0.01}
    ]  # round 8 (0.63 s) is not slow, nor is round 9 (0.3 s)
    assert slow_rounds_line(rounds) == (
        "rounds over 1 s: 1, the longest 1.33s (start 0.90, decide 0.40, asks 0.02)"
    )
    assert slow_rounds_line([]) == "rounds over 1 s: none"
    trial = report_with(rounds)
    assert trial.longest_round_s() == 1.33 and report_with([]).longest_round_s() == 0.0


def report_with(rounds: list[dict[str, float]]) -> Report:
    trial = report(1000, 50, 50, 0)
    trial.slow_rounds = rounds
    return trial
