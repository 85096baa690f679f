"""`gearshift up --check`: Redis and every daemon start, report SERVING, and stop with exit 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_up_check_starts_the_whole_dev_cluster(tmp_path: Path) -> None:
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
            "--workers",
            "v100:2,t4:1",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for name in ("brain", "shardmanager", "scheduler", "worker-1", "worker-2"):
        row = next(line for line in lines if line.startswith(name))
        assert "SERVING" in row, row
        assert re.search(r"http://127\.0\.0\.1:\d+/metrics", row), f"no metrics URL: {row}"
        assert f"{name} (exit 0)" in result.stdout
    dashboard = next(line for line in lines if line.startswith("dashboard"))
    assert "SERVING" in dashboard and "http://127.0.0.1:" in dashboard, dashboard
    assert re.search(r"^Dashboard: http://127\.0\.0\.1:\d+/$", result.stdout, re.MULTILINE)
    assert "dashboard (exit 0)" in result.stdout
    assert any(line.startswith("redis") and "unix://" in line for line in lines)
    assert "redis (exit 0)" in result.stdout
    assert "5/5 daemons healthy." in result.stdout
    assert (tmp_path / "brain.db").exists() and (tmp_path / "scheduler.db").exists()


def test_up_rejects_a_bad_worker_list(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gearshift.client.cli",
            "up",
            "--workers",
            "v100",
            "--run-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "'v100' is not TYPE:COUNT" in result.stderr
