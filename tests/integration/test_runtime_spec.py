"""`python -m gearshift.worker.run --spec FILE` runs the job a JobSpec describes, with the
worker daemon's own mapping of spec fields to runtime flags."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from google.protobuf import json_format

from gearshift.v1 import common_pb2

SPEC = common_pb2.JobSpec(
    name="spec-run",
    entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp", config_json='{"lr": 0.1}'),
    num_ests=2,
    global_batch_size=8,
    total_steps=12,
    dataset=common_pb2.DatasetSpec(name="synthetic", size=256, shard_size=16, seed=3),
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gearshift.worker.run", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def digest(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return str(re.findall(r"^digest sha256:([0-9a-f]{64})$", result.stdout, re.MULTILINE)[-1])


def test_spec_equals_the_explicit_flags(tmp_path: Path) -> None:
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json_format.MessageToJson(SPEC))
    from_spec = run(
        "--spec", str(spec_file), "--procs", "2", "--checkpoint-dir", str(tmp_path / "a")
    )
    explicit = run(
        "--job", "gearshift.examples.mlp", "--config", '{"lr": 0.1}', "--ests", "2",
        "--batch-size", "8", "--steps", "12", "--seed", "3", "--shard-size", "16",
        "--data-size", "256", "--checkpoint-dir", str(tmp_path / "b"),
    )  # fmt: skip
    assert digest(from_spec) == digest(explicit)


def test_a_bad_spec_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "num_ests": "many"}')
    result = run("--spec", str(bad), "--checkpoint-dir", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "--spec" in result.stderr and "bad.json" in result.stderr
    invalid = tmp_path / "invalid.json"
    spec = common_pb2.JobSpec()
    spec.CopyFrom(SPEC)
    spec.num_ests = 0
    invalid.write_text(json_format.MessageToJson(spec))
    result = run("--spec", str(invalid), "--checkpoint-dir", str(tmp_path / "d"))
    assert result.returncode == 2 and "spec.num_ests" in result.stderr


def test_a_resume_never_restarts_from_scratch_silently(tmp_path: Path) -> None:
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json_format.MessageToJson(SPEC))
    ckpt = tmp_path / "ckpt"
    fresh = run("--spec", str(spec_file), "--procs", "1", "--checkpoint-dir", str(ckpt), "--resume")
    assert "the job never checkpointed, starting at step 0" in fresh.stdout, fresh.stderr
    full = digest(fresh)
    resumed = run(
        "--spec", str(spec_file), "--procs", "1", "--checkpoint-dir", str(ckpt), "--resume"
    )
    assert digest(resumed) == full and "never checkpointed" not in resumed.stdout
    for path in ckpt.glob("ckpt-*.pt"):
        path.unlink()  # lost: a moved folder, a wiped disk
    lost = run("--spec", str(spec_file), "--procs", "1", "--checkpoint-dir", str(ckpt), "--resume")
    assert lost.returncode == 2, lost.stdout + lost.stderr
    assert "the checkpoint of step 12 was written to" in lost.stderr
    assert (
        str(ckpt / "ckpt-00000012.pt") in lost.stderr and "refusing to start again" in lost.stderr
    )
