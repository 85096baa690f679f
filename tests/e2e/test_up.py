"""`gearshift up --check`: Redis and every daemon start, report SERVING, and stop with exit 0
(with TLS between them too)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def up(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", "up", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_up_check_starts_the_whole_dev_cluster(tmp_path: Path) -> None:
    result = up(
        "--check", "--base-port", "0", "--run-dir", str(tmp_path), "--workers", "v100:2,t4:1"
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
    result = up("--workers", "v100", "--run-dir", str(tmp_path), timeout=60)
    assert result.returncode == 2
    assert "'v100' is not TYPE:COUNT" in result.stderr


def test_up_with_tls_serves_every_daemon_over_mtls(tmp_path: Path, pki: dict[str, Path]) -> None:
    tls = {
        "--tls-cert": pki["server_cert"],
        "--tls-key": pki["server_key"],
        "--tls-ca": pki["ca"],
        "--tls-client-ca": pki["ca"],
    }
    flags = [str(part) for item in tls.items() for part in item]
    run_dir = tmp_path / "run"
    result = up("--check", "--base-port", "0", "--run-dir", str(run_dir), "--workers", "cpu:1",
                "--dashboard", "", *flags)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4/4 daemons healthy." in result.stdout, result.stdout
    # The launcher's health checks went over mTLS: the daemons served TLS only.
    for name in ("brain", "shardmanager", "scheduler", "worker-1"):
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert "tls=True" in log, log[-2000:]
    exported = re.search(r"^For the other commands: export (.*)$", result.stdout, re.MULTILINE)
    assert exported is not None, result.stdout
    assert f"GEARSHIFT_TLS_CA={pki['ca'].resolve()}" in exported.group(1)


def test_up_names_a_missing_tls_flag_and_starts_nothing(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    run_dir = tmp_path / "run"
    result = up("--run-dir", str(run_dir), "--tls-cert", str(pki["server_cert"]), timeout=60)
    assert result.returncode == 2
    assert "--tls-key" in result.stderr and "required" in result.stderr, result.stderr
    missing = up(
        "--run-dir", str(run_dir), "--tls-cert", str(tmp_path / "nope.pem"),
        "--tls-key", str(pki["server_key"]), "--tls-ca", str(pki["ca"]), timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "nope.pem is not a file" in missing.stderr
    assert not run_dir.exists()
