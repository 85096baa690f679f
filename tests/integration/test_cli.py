"""The `gearshift` CLI against a real scheduler: output, JSON, and exit codes scripts can trust."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gearshift.client.commands import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from tests.conftest import DaemonFactory
from tests.helpers import scheduler_config

JOB = """
name: cli-{tag}
entrypoint: {{module: gearshift.examples.mlp, config: {{}}}}
num_ests: 2
global_batch_size: 8
total_steps: 10
dataset: {{name: synthetic, size: 256, shard_size: 16}}
"""


def gearshift(*args: str, address: str = "") -> subprocess.CompletedProcess[str]:
    extra = ["--address", address] if address and args[0] not in ("up", "health") else []
    return subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", *args, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def scheduler(daemons: DaemonFactory, tmp_path: Path) -> str:
    # No workers: submitted jobs stay queued, which is all these tests need.
    config = scheduler_config(tmp_path, heartbeats={"relays": 0})
    daemon = daemons("scheduler", ["--database-url", f"sqlite:///{tmp_path / 's.db'}", *config])
    return daemon.address


def _job_file(tmp_path: Path, tag: str, text: str | None = None) -> Path:
    path = tmp_path / f"{tag}.yaml"
    path.write_text(text if text is not None else JOB.format(tag=tag))
    return path


def test_submit_list_show_cancel_watch(scheduler: str, tmp_path: Path) -> None:
    submitted = gearshift("submit", str(_job_file(tmp_path, "a")), "--key", "k1", address=scheduler)
    assert submitted.returncode == EXIT_OK, submitted.stderr
    job_id = submitted.stdout.strip()
    again = gearshift("submit", str(_job_file(tmp_path, "a")), "--key", "k1", address=scheduler)
    assert again.stdout.strip() == job_id  # same key, same job

    listed = gearshift("jobs", address=scheduler)
    assert listed.returncode == EXIT_OK
    assert job_id in listed.stdout and "queued" in listed.stdout

    as_json = json.loads(gearshift("jobs", "--json", "--state", "queued", address=scheduler).stdout)
    assert [j["job_id"] for j in as_json["jobs"]] == [job_id]

    shown = gearshift("job", job_id, address=scheduler)
    assert "cli-a" in shown.stdout and "gearshift.examples.mlp" in shown.stdout

    cancelled = gearshift("cancel", job_id, address=scheduler)
    assert cancelled.returncode == EXIT_OK and "cancelled" in cancelled.stdout
    watched = gearshift("watch", job_id, address=scheduler)
    assert watched.returncode == EXIT_FAILED  # a cancelled job is not a success
    assert "submitted" in watched.stdout and "cancelled" in watched.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: [unclosed", "malformed YAML"),
        (JOB.format(tag="b").replace("num_ests: 2", "num_ests: 0"), "spec.num_ests"),
        (
            JOB.format(tag="b").replace("global_batch_size: 8", "global_batch_size: 7"),
            "spec.global_batch_size",
        ),
    ],
)
def test_bad_job_files_exit_2_and_submit_nothing(
    scheduler: str, tmp_path: Path, text: str, message: str
) -> None:
    result = gearshift("submit", str(_job_file(tmp_path, "bad", text)), address=scheduler)
    assert result.returncode == EXIT_USAGE
    assert message in result.stderr
    assert json.loads(gearshift("jobs", "--json", address=scheduler).stdout).get("jobs", []) == []


def test_not_found_unreachable_and_usage_codes(scheduler: str) -> None:
    missing = gearshift("job", "job-nope", address=scheduler)
    assert missing.returncode == EXIT_NOT_FOUND
    assert "job-nope" in missing.stderr
    down = gearshift("jobs", "--rpc-timeout", "2", address="127.0.0.1:1")
    assert down.returncode == EXIT_UNAVAILABLE
    bad_state = gearshift("jobs", "--state", "sleepy", address=scheduler)
    assert bad_state.returncode == EXIT_USAGE
    assert "unknown state 'sleepy'" in bad_state.stderr


def test_cluster_and_health(scheduler: str) -> None:
    cluster = gearshift("cluster", address=scheduler)
    assert cluster.returncode == EXIT_OK
    assert "policy" in cluster.stdout
    health = gearshift("health", scheduler, "--json")
    assert json.loads(health.stdout) == {scheduler: "SERVING"}


def test_every_command_has_help() -> None:
    for command in ("submit", "jobs", "job", "watch", "cancel", "cluster", "up", "health"):
        result = gearshift(command, "--help")
        assert result.returncode == 0 and "usage: gearshift" in result.stdout, command
