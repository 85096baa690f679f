"""`gearshift simulate` and `python -m gearshift.scheduler.sim.simulate`: as processes, and its
arguments (how it schedules is the configuration file's, as the daemon's is)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gearshift.scheduler.config.configuration import SchedulerConfiguration
from gearshift.scheduler.sim.simulate import MOVED_TO_FILE, main, parse_cluster
from gearshift.scheduler.sim.trace import read_trace

BENCH_PROFILES = Path(__file__).resolve().parents[2] / "bench" / "profiles"


def profile(tmp_path: Path, name: str, allocate: str, **args: object) -> Path:
    """A configuration file naming `allocate` (no collocation), the simulator's old
    defaults for a hand-chosen policy: Gavel's 1,920 s recomputations, no round bounds."""
    lines = [
        "round: {preemptExemptSeconds: 0, maxMoves: 0}",
        "profile:",
        f"  allocate: {{name: {allocate}, args: {json.dumps(args)}}}",
        "  collocate: {name: none}",
    ]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


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


def test_json_report(gavel_data: Path, tmp_path: Path) -> None:
    config = profile(
        tmp_path, "gavel", "max_min_fairness_perf", elastic=False, minRecomputeSeconds=1920
    )
    result = run(
        "--trace",
        str(gavel_data / "artifact_evaluation.trace"),
        "--throughputs",
        str(gavel_data / "simulation_throughputs.json"),
        "--cluster",
        "v100=2,k80=4",
        "--config",
        str(config),
        "--seed",
        "1",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["policy"] == "gavel (max_min_fairness_perf)"
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
        "--config",
        str(BENCH_PROFILES / "easyscale.yaml"),
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
        (["--cluster", "a100=4"], "--cluster: no throughputs for types ['a100']"),
        (["--cluster", "v100"], "--cluster: 'v100' is not TYPE=COUNT"),
        (["--rescale-seconds", "-1"], "--rescale-seconds: must be >= 0"),
        (["--config", "missing.yaml"], "--config: configuration missing.yaml is not valid"),
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


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--policy", "las"], "profile.allocate.name"),
        (["--elastic"], "profile.allocate.args.elastic"),
        (["--round", "60"], "round.seconds"),
        (["--round=60"], "round.seconds"),
        (["--recompute-seconds", "1920"], "profile.allocate.args.minRecomputeSeconds"),
        (["--hysteresis", "0.2"], "profile.allocate.args.hysteresis"),
        (["--prices", "v100=1"], "profile.allocate.args.prices"),
        (["--multiplex"], "profile.collocate.name"),
        (["--compare", "las,easyscale"], "several run on the same workload"),
    ],
)
def test_a_scheduler_knob_as_a_flag_is_refused_naming_the_files_key(
    args: list[str], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before anything is read: the knobs are the configuration file's."""
    assert main(["--trace", "t", "--throughputs", "x.json", *args]) == 2
    err = capsys.readouterr().err
    assert f"error: {args[0].split('=')[0]}: " in err and key in err


def test_every_moved_flag_names_a_key_of_the_configuration_file() -> None:
    defaults = SchedulerConfiguration().model_dump(by_alias=True)
    for key in MOVED_TO_FILE.values():
        section, _, rest = key.partition(".")
        assert section in defaults, key
        if section == "round":
            assert rest in defaults["round"], key


def test_the_file_drives_the_policy(
    gavel_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--config's profile.allocate is what runs; several files: one row each, one table."""
    common = [
        *("--trace", str(gavel_data / "artifact_evaluation.trace")),
        *("--throughputs", str(gavel_data / "simulation_throughputs.json")),
        *("--cluster", "v100=2,k80=4"),
    ]
    fifo = profile(tmp_path, "fifo", "fifo", elastic=False, minRecomputeSeconds=1920)
    assert main([*common, "--config", str(fifo), "--config", "default", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in reports] == ["fifo", "default (las elastic)"]
    assert reports[0]["average_jct_seconds"] != reports[1]["average_jct_seconds"]
    assert main([*common, "--config", str(profile(tmp_path, "rubick", "rubick"))]) == 2
    assert "profile.allocate rubick asks the Brain" in capsys.readouterr().err


def test_the_cli_passes_the_exit_code_through(gavel_data: Path, tmp_path: Path) -> None:
    result = run(
        "--trace",
        str(gavel_data / "artifact_evaluation.trace"),
        "--throughputs",
        str(gavel_data / "simulation_throughputs.json"),
        "--config",
        str(profile(tmp_path, "nope", "nope")),
        via_cli=True,
    )
    assert result.returncode == 2
    assert "profile.allocate.name: unknown allocate plugin 'nope'" in result.stderr


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
