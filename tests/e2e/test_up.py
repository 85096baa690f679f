"""`gearshift up --check`: every daemon starts, reports SERVING, and stops with exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_up_check_starts_all_daemons_healthy(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gearshift.client.cli",
            "up",
            "--check",
            "--base-port",
            "0",
            "--run-dir",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for name in ("scheduler", "brain", "shardmanager", "worker"):
        row = next(line for line in lines if line.startswith(name))
        assert "SERVING" in row
        assert f"{name} (exit 0)" in result.stdout
    assert "4/4 daemons healthy." in result.stdout
