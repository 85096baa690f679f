"""bench/load.py at a tiny scale on a real scheduler (with a heartbeat relay) and Postgres:
it runs end to end and reports latencies for the workers API and submissions, with no
failed call, and the jobs start on the simulated workers and end there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.load import main
from gearshift.scheduler.round.rounds import ROUND_PHASES


def test_load_bench_tiny(postgres_url: str, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    argv = [
        *("--workers", "20", "--processes", "2"),
        *("--submits-per-second", "5", "--queued", "10", "--seconds", "5"),
        *("--watchers", "1", "--readers", "1"),
        *("--job-seconds", "1"),  # the jobs end, as on a cluster, and others start
        *("--database-url", postgres_url, "--json", str(out)),
        "--baseline",
    ]
    assert main(argv) == 0
    results = json.loads(out.read_text())
    (trial,) = results["trials"]
    rpcs = trial["rpcs"]
    for name in ("RegisterWorker (startup)", "Heartbeat", "SubmitJob"):
        assert rpcs[name]["count"] > 0, name
        assert rpcs[name]["p99_ms"] > 0, name
    assert {name: s["errors"] for name, s in rpcs.items() if s["errors"]} == {}
    assert rpcs["Heartbeat"]["count"] >= 20 * 3  # every worker, about once a second
    assert trial["rounds"]["rounds"] >= 1
    assert {f"{phase}_mean_s" for phase in ROUND_PHASES} <= trial["rounds"].keys()
    # What else took the machine: the host's busy share, the decision process and PostgreSQL.
    assert 0 < trial["host_busy"] <= 1
    assert set(trial["helper_cpu_seconds"]) == {"decision", "relays", "postgres"}
    # The heartbeats went through the relay (the file's heartbeats.relays, 1 by default).
    assert trial["helper_cpu_seconds"]["relays"] > 0
    # The pools keep their connections: the window opens few sessions, if any.
    assert trial["database_sessions"] is not None and 0 <= trial["database_sessions"] <= 15
    # The simulated workers' agent accepts starts: jobs run (or ran and ended), no worker
    # is lost for them.
    assert trial["running_jobs"] + trial["counters"]["jobs_succeeded"] > 0
    assert trial["counters"]["jobs_succeeded"] > 0  # completed by the simulated workers
    assert trial["counters"]["workers_lost_total"] == 0
    assert trial["log_events"]["start failed"] == 0 and trial["log_events"]["worker lost"] == 0
    # The baseline: the same load on the bare server, and the scheduler as ratios to it.
    (floor,) = results["baselines"]
    assert floor["config"]["baseline"] is True
    assert floor["rpcs"]["Heartbeat"]["count"] >= 20 * 3
    assert {name: s["errors"] for name, s in floor["rpcs"].items() if s["errors"]} == {}
    (comparison,) = results["comparisons"]
    assert {"Heartbeat", "SubmitJob"} <= comparison["rpcs"].keys()
    assert comparison["rpcs"]["Heartbeat"]["ratio"] > 0
    assert comparison["baseline_cpu_ms_per_rpc"] > 0 and comparison["cpu_ratio"] > 0


def test_unreachable_postgres_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    # port 9 (discard): nothing listens there
    assert main(["--database-url", "postgresql://postgres@127.0.0.1:9/test"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("load: PostgreSQL at ") and err.count("\n") == 1, err
