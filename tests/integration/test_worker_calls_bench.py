"""bench/worker_calls.py runs end to end (a few calls, no busy threads): both ways' calls are
answered and their ratio printed; bad arguments are refused by name."""

from __future__ import annotations

import pytest

from bench.worker_calls import main


def test_the_worker_calls_bench_compares_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--calls", "6", "--busy", "0", "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert "6 StartTask calls to 6 addresses, 0 busy threads" in out
    assert "plain futures" in out and "aio loop" in out and "plain futures / aio loop:" in out


def test_the_worker_calls_bench_refuses_no_calls(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--calls", "0"])
    assert "--calls and --trials must be > 0" in capsys.readouterr().err
