"""`gearshift up --config FILE`: the user's file is checked as the dev cluster will run it,
before anything starts, and only when there is one (the check is a subprocess: the client
imports no scheduler)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gearshift.client.devcluster import ClusterConfig, DevCluster
from gearshift.common.errors import ValidationError


def cluster(tmp_path: Path, text: str | None) -> DevCluster:
    user = None
    if text is not None:
        user = tmp_path / "mine.yaml"
        user.write_text(text)
    return DevCluster(ClusterConfig(run_dir=tmp_path / "run", scheduler_config=user))


def test_a_file_that_clashes_with_the_dev_settings_is_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    """Valid alone (the default timeout is 30 s), not under the dev cluster's 6 s one."""
    dev = cluster(tmp_path, "heartbeats:\n  intervalSeconds: 10\n")
    with pytest.raises(ValidationError) as caught:
        dev.check_scheduler_file()
    message = caught.value.message
    assert "valid alone but not with gearshift up's dev settings" in message
    assert "heartbeats.timeoutSeconds: 6" in message
    assert "heartbeats.timeoutSeconds: must exceed heartbeats.intervalSeconds" in message


def test_a_file_wrong_by_itself_is_named_at_its_own_line(tmp_path: Path) -> None:
    dev = cluster(tmp_path, "round:\n  seconds: 5\n  maxStart: 3\n")
    with pytest.raises(ValidationError, match=r"mine.yaml:3: round.maxStart: unknown key"):
        dev.check_scheduler_file()


def test_no_user_file_runs_no_check(tmp_path: Path) -> None:
    """The dev settings alone are valid: nothing to check, no file written before the start."""
    dev = cluster(tmp_path, None)
    dev.check_scheduler_file()
    assert not dev.scheduler_file.exists()


def test_gearshift_up_exits_2_before_anything_starts(tmp_path: Path) -> None:
    user = tmp_path / "mine.yaml"
    user.write_text("heartbeats:\n  intervalSeconds: 10\n")
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", "up", "--check", "--config", str(user),
         "--run-dir", str(run_dir), "--base-port", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "heartbeats.timeoutSeconds" in result.stderr
    assert not (run_dir / "logs").exists() or not any((run_dir / "logs").iterdir())
