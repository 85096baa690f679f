"""Placement and run settings: bad input is refused with a message naming the flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gearshift.common.errors import ValidationError
from gearshift.common.facts import DEFAULT_DETERMINISM, DETERMINISM_LEVELS
from gearshift.worker.run import main
from gearshift.worker.runtime.settings import (
    Determinism,
    RunSettings,
    even_mapping,
    parse_mapping,
    placement,
)


def test_the_runtime_levels_are_the_shared_determinism_names() -> None:
    """The worker passes DETERMINISM_NAMES as --determinism; the runtime must accept each."""
    assert tuple(level.value for level in Determinism) == DETERMINISM_LEVELS
    assert RunSettings.determinism == DEFAULT_DETERMINISM  # its default, as the worker's


def test_mappings_and_placements() -> None:
    assert parse_mapping("2,1,1", 4, 3) == (2, 1, 1)
    assert parse_mapping("3,3,2", 8) == (3, 3, 2)
    assert placement((2, 1, 1)) == [[0, 1], [2], [3]]
    assert even_mapping(8, 3) == (3, 3, 2)
    assert even_mapping(4, 4) == (1, 1, 1, 1)


@pytest.mark.parametrize(
    ("text", "ests", "procs", "message"),
    [
        ("2,1", 4, None, "--mapping: '2,1' sums to 3, not to the 4 ESTs"),
        ("2,1,1", 4, 2, "has 3 entries but --procs is 2"),
        ("2,0,2", 4, None, "every process must run at least one EST"),
        ("2;2", 4, None, "not a comma-separated list"),
    ],
)
def test_bad_mappings_name_the_problem(
    text: str, ests: int, procs: int | None, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_mapping(text, ests, procs)


def test_bad_settings_name_the_flag() -> None:
    with pytest.raises(ValidationError, match="--batch-size: 30 is not a multiple of the 4 ESTs"):
        RunSettings(num_ests=4, global_batch_size=30, total_steps=1).validate()
    with pytest.raises(ValidationError, match="--steps: must be >= 1"):
        RunSettings(num_ests=4, global_batch_size=32, total_steps=0).validate()
    with pytest.raises(ValidationError, match="--procs: must be between 1 and the 4 ESTs"):
        even_mapping(4, 5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--procs", "2", "--mapping", "2,1"], "--mapping: '2,1' sums to 3, not to the 4 ESTs"),
        (["--procs", "5"], "--procs: must be between 1 and the 4 ESTs (got 5)"),
        (["--batch-size", "10"], "--batch-size: 10 is not a multiple of the 4 ESTs"),
        (["--procs", "3", "--threads", "1,2"], "--threads: '1,2': give one count >= 1"),
        (["--config", "[1]"], "--config: must be a JSON object"),
        (["--config", "{x"], "--config: is not valid JSON"),
        (["--local-device", "0"], "--local-device: is for one process of a job (--rank)"),
        (["--step-delay", "-1"], "--step-delay: must be >= 0 seconds (got -1.0)"),
    ],
)
def test_launcher_refuses_bad_input_before_starting_anything(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    base = ["--job", "gearshift.examples.mlp", "--ests", "4", "--steps", "1"]
    base += ["--checkpoint-dir", str(tmp_path)]
    assert main(base + args) == 2
    assert message in capsys.readouterr().err


def test_a_missing_job_module_is_reported_by_the_launcher(tmp_path: object) -> None:
    cmd = [sys.executable, "-m", "gearshift.worker.run", "--job", "no_such_module_xyz"]
    cmd += ["--ests", "2", "--procs", "2", "--steps", "1", "--checkpoint-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert "--job: cannot import module 'no_such_module_xyz'" in done.stderr


def test_the_launcher_imports_no_torch() -> None:
    probe = "import sys, gearshift.worker.run; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"
