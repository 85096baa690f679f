"""`gearshift simulate` and `python -m gearshift.scheduler.sim.simulate` as processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gearshift.scheduler.sim.simulate import main, parse_cluster
from gearshift.scheduler.sim.trace import read_trace


def run(*args: str, via_cli: bool = False) -> subprocess.CompletedProcess[str]:
    module = "gearshift.client.cli" if via_cli else "gearshift.scheduler.sim.simulate"
    prefix = ["simulate"] if via_cli else []
    return subprocess.run(
        [sys.executable, "-m", module, *prefix, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_json_report(gavel_data: Path) -> None:
    result = run(
        "--trace",
        str(gavel_data / "artifact_evaluation.trace"),
        "--throughputs",
        str(gavel_data / "simulation_throughputs.json"),
        "--cluster",
        "v100=2,k80=4",
        "--policy",
        "max_min_fairness_perf",
        "--round",
        "360",
        "--seed",
        "1",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["num_jobs"] == 15 and len(report["jobs"]) == 15
    assert report["average_jct_seconds"] == pytest.approx(4322.1, rel=0.05)
    assert report["makespan_seconds"] >= max(j["jct"] for j in report["jobs"]) - 1e-6
    assert 0 < report["utilization"] <= 1


def test_text_report_through_the_gearshift_cli(gavel_data: Path, tmp_path: Path) -> None:
    written = tmp_path / "generated.trace"
    result = run(
        "--generate",
        "40",
        "--jobs-per-hour",
        "3",
        "--throughputs",
        str(gavel_data / "simulation_throughputs.json"),
        "--cluster",
        "8:16:24",
        "--elastic",
        "--write-trace",
        str(written),
        via_cli=True,
    )
    assert result.returncode == 0, result.stderr
    assert "policy:             easyscale" in result.stdout
    assert "average JCT:" in result.stdout and "makespan:" in result.stdout
    assert "utilization:" in result.stdout
    assert len(read_trace(written)) == 40


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "--policy: unknown policy 'nope'"),
        (["--cluster", "a100=4"], "--cluster: no throughputs for types ['a100']"),
        (["--cluster", "v100"], "--cluster: 'v100' is not TYPE=COUNT"),
        (["--elastic", "--policy", "fifo"], "--policy: 'fifo' has no elastic form"),
        (["--compare", "las,nope"], "--compare: unknown policy 'nope'"),
        (["--compare", "fast:las"], "--compare: 'fast:las': the prefix is elastic: or rigid:"),
        (["--prices", "v100=cheap"], "--prices: 'v100=cheap' is not TYPE=DOLLARS_PER_HOUR"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(
    gavel_data: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--trace",
            str(gavel_data / "artifact_evaluation.trace"),
            "--throughputs",
            str(gavel_data / "simulation_throughputs.json"),
            *args,
        ]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_cli_passes_the_exit_code_through(gavel_data: Path) -> None:
    result = run(
        "--trace",
        str(gavel_data / "artifact_evaluation.trace"),
        "--throughputs",
        str(gavel_data / "simulation_throughputs.json"),
        "--policy",
        "nope",
        via_cli=True,
    )
    assert result.returncode == 2
    assert "--policy: unknown policy 'nope'" in result.stderr


def test_a_workload_that_cannot_finish_exits_1(
    gavel_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--trace",
            str(gavel_data / "max_min_fairness.trace"),
            "--throughputs",
            str(gavel_data / "simulation_throughputs.json"),
            "--cluster",
            "v100=2",
        ]
    )
    assert code == 1
    assert "fits on no type" in capsys.readouterr().err


def test_parse_cluster() -> None:
    assert parse_cluster("v100=8,p100=16,k80=24") == {"v100": 8, "p100": 16, "k80": 24}
    assert parse_cluster("8:16:24") == {"v100": 8, "p100": 16, "k80": 24}
