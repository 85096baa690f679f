"""bench/sia_artifact.py: reading the artifact's round log into per-job figures, the results'
files, and one run through a stand-in simulator written here (the artifact itself is not in the
repository)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.sia_artifact import (
    RESULT_KEYS,
    ArtifactError,
    job_results,
    load_results,
    main,
    pool,
    read_rounds,
    result_stem,
    simulator_command,
    summarize,
    summary_table,
)


def job(
    name: str, submit: int, done: float | None, restarts: int | None, alloc: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "submission_time": submit,
        "completion_time": done,
        "num_restarts": restarts,
        "allocation": alloc,
        "placement": [],
    }


# Two jobs, 60 s rounds, in the artifact's format: a round's record holds each submitted job's
# allocation for the next round; "a" runs on 2 then 4 A100s (one restart) and ends at 150 s,
# "b" waits a round, runs on one T4 from 60 s and ends at 170 s.
ROUNDS = [
    {
        "timestamp": 60,
        "submitted_jobs": [job("a", 0, None, 0, ["dgx-ext", [0, 0]]), job("b", 10, None, None, [])],
    },
    {
        "timestamp": 120,
        "submitted_jobs": [
            job("a", 0, None, 1, ["dgx-ext", [0, 0, 1, 1]]),
            job("b", 10, None, 0, ["aws", [3]]),
        ],
    },
    {
        "timestamp": 180,
        "submitted_jobs": [job("a", 0, 150.0, 1, []), job("b", 10, 170.0, 0, [None, []])],
    },
]
LOG = "".join(json.dumps(record) + "\n" for record in ROUNDS)


def test_jobs_are_counted_as_the_artifact_counts_them() -> None:
    jobs = {j.name: j for j in job_results(read_rounds(io.StringIO(LOG)))}
    assert jobs["a"].jct_s == 150.0 and jobs["a"].submit_s == 0.0
    # 2 GPUs in the first round, 4 in the second (charged whole, though "a" ended at 150 s).
    assert jobs["a"].gpu_seconds == 2 * 60 + 4 * 60
    assert jobs["a"].restarts == 1
    assert jobs["b"].jct_s == 160.0
    assert jobs["b"].gpu_seconds == 60.0
    assert jobs["b"].restarts == 0


def test_summary_figures() -> None:
    jobs = job_results(read_rounds(io.StringIO(LOG)))
    result = summarize(jobs, "sia", "philly/workload-1", True)
    assert set(result) == set(RESULT_KEYS) - {"command", "wall_s", "date"}
    assert result["n_jobs"] == 2
    assert result["avg_jct_h"] == pytest.approx(155 / 3600)
    assert result["p99_jct_h"] == pytest.approx(160 / 3600)
    assert result["makespan_h"] == pytest.approx(170 / 3600)
    assert result["gpu_hours_per_job"] == pytest.approx(420 / 2 / 3600)
    assert result["restarts_per_job"] == 0.5
    assert result["jobs"][0] == {
        "name": "a",
        "submit_s": 0.0,
        "jct_s": 150.0,
        "gpu_seconds": 360.0,
        "restarts": 1,
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no round record"),
        ("{not json\n", "line 1: not JSON"),
        ('{"timestamp": 0}\n', "line 1: a round record needs"),
    ],
)
def test_bad_logs_are_named(text: str, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        read_rounds(io.StringIO(text))


def test_an_unfinished_job_is_an_error() -> None:
    rounds = read_rounds(io.StringIO(LOG))[:2]
    with pytest.raises(ArtifactError, match="job a has not completed"):
        job_results(rounds)


def test_commands_and_names(tmp_path: Path) -> None:
    assert result_stem("pollux", "philly/workload-2", False) == "pollux-adaptive-philly_workload-2"
    log = tmp_path / "x.log"
    sia = simulator_command("py", "sia", "w.csv", True, log)
    assert sia[:3] == ["py", "multi_simulator.py", "w.csv"] and "--disable_bsz_tuning" in sia
    assert "--disable_bsz_tuning" not in simulator_command("py", "sia", "w.csv", False, log)
    assert simulator_command("py", "pollux", "w.csv", False, log)[1] == "multi_simulator_unaware.py"
    assert simulator_command("py", "pollux", "w.csv", True, log)[1] == "-c"
    with pytest.raises(ArtifactError, match="pass --fixed-bsz"):
        simulator_command("py", "gavel", "w.csv", False, log)


# A stand-in for the artifact's multi_simulator.py: prints a round line, writes LOG to --output.
FAKE_SIMULATOR = """
import sys
print("SIMULATOR TIME:60")
out = [a for a in sys.argv if a.startswith("--output=")][0].split("=", 1)[1]
open(out, "w").write(open(sys.argv[0] + ".log").read())
"""


def test_one_run_end_to_end(tmp_path: Path) -> None:
    sim = tmp_path / "sia-simulator"
    (sim / "workloads" / "philly").mkdir(parents=True)
    (sim / "workloads" / "philly" / "workload-1.csv").write_text(
        "name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\nb,10,bert,1,12\n"
    )
    (sim / "multi_simulator.py").write_text(FAKE_SIMULATOR)
    (sim / "multi_simulator.py.log").write_text(LOG)
    out = tmp_path / "results"
    argv = ["--artifact", str(tmp_path), "--python", sys.executable, "--policy", "gavel"]
    argv += ["--workload", "philly/workload-1", "--fixed-bsz", "--out", str(out), "--timeout", "60"]
    assert main(argv) == 0
    (result,) = load_results(out)
    assert result["policy"] == "gavel" and result["fixed_bsz"] is True
    assert result["avg_jct_h"] == pytest.approx(155 / 3600)
    assert "--policy=gavel" in result["command"] and result["wall_s"] >= 0
    assert (out / "gavel-fixed-philly_workload-1.json").is_file()
    assert (out / "raw" / "gavel-fixed-philly_workload-1.log").read_text() == LOG


def test_bad_input_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    argv = ["--artifact", str(tmp_path), "--python", sys.executable, "--policy", "sia"]
    assert main([*argv, "--workload", "philly/workload-1", "--out", str(out)]) == 2
    assert "no multi_simulator.py" in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()
    (out / "x.json").write_text('{"policy": "sia"}')
    with pytest.raises(ArtifactError, match="not a sia_artifact result"):
        load_results(out)


def test_pooled_figures_run_over_all_jobs(tmp_path: Path) -> None:
    one = summarize(job_results(read_rounds(io.StringIO(LOG))), "sia", "philly/workload-1", True)
    two = one | {"workload": "philly/workload-2", "makespan_h": 1.0}
    two["jobs"] = [j | {"jct_s": j["jct_s"] + 3600} for j in one["jobs"]]
    pooled = pool([one, two])
    assert pooled["n_jobs"] == 4 and pooled["runs"] == 2
    assert pooled["avg_jct_h"] == pytest.approx((2 * (150 + 160) + 2 * 3600) / 4 / 3600)
    assert pooled["p99_jct_h"] == pytest.approx((160 + 3600) / 3600)
    assert pooled["makespan_h"] == pytest.approx((170 / 3600 + 1.0) / 2)
    table = summary_table([one | {"wall_s": 5.0}, two | {"wall_s": 6.0}])
    assert "| sia | fixed | **pooled (1, 2)** |" in table
    assert len(table.splitlines()) == 2 + 2 + 1


def test_a_run_needs_its_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--policy", "sia", "--out", str(tmp_path)])
    assert "a run needs --artifact, --python, --workload" in capsys.readouterr().err
