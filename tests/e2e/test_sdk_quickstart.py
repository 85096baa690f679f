"""The SDK's documented example runs against a real dev cluster; the client install imports
no heavy library along the way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gearshift.client.devcluster import ClusterConfig, DevCluster, parse_workers


@pytest.mark.slow
def test_quickstart_runs_against_gearshift_up(tmp_path: Path) -> None:
    config = ClusterConfig(
        run_dir=tmp_path / "cluster", base_port=0, workers=parse_workers("v100:2"),
        round_seconds=1.0, heartbeat_interval=0.5, heartbeat_timeout=5.0, log_level="warning",
    )  # fmt: skip
    with DevCluster(config) as cluster:
        result = subprocess.run(
            [sys.executable, "-m", "gearshift.examples.sdk_quickstart",
             "--address", cluster.address("scheduler"), "--timeout", "240"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "submitted job-" in result.stdout
    assert "ended at step 100, digest " in result.stdout
    assert len(result.stdout.rsplit("digest ", 1)[1].strip()) == 64


def test_quickstart_imports_only_the_client() -> None:
    probe = (
        "import sys, gearshift.examples.sdk_quickstart as q; q.quickstart_spec(); "
        "print([m for m in ('torch', 'cvxpy', 'sqlalchemy', 'redis') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
