"""`gearshift profile` and `gearshift plan --burst` against a real Brain: a small example
model profiled with torch.fx (tiny batches: seconds), stored under the job's fingerprint,
planned over, and clear exits for a bad file, an unprofiled job and an unreachable Brain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gearshift.client.cli import main
from gearshift.client.spec import load_spec
from gearshift.common.channel import connect
from gearshift.common.profiles import profile_key
from gearshift.v1 import brain_pb2, brain_pb2_grpc
from tests.conftest import DaemonFactory

JOB = """\
name: tiny-mlp
model_type: mlp
entrypoint:
  module: gearshift.examples.mlp
  config: {features: 8, hidden: 16, layers: 2, classes: 4, samples: 64}
num_ests: 4
global_batch_size: 8
total_steps: 10
dataset: {name: clusters, size: 64, shard_size: 8, seed: 1}
"""


def test_profile_then_plan(
    daemons: DaemonFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brain = daemons("brain", ["--database-url", f"sqlite:///{tmp_path / 'b.db'}"])
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    out = tmp_path / "profile.json"
    base = ["--brain", brain.address]

    assert main(["profile", str(job), *base, "--repeats", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    key = profile_key(load_spec(job), "cpu")
    assert f"profile {key}: 8 layers" in printed and "devices 1,2,4" in printed
    assert "stored in the Brain" in printed
    assert printed.splitlines()[0].split() == ["LAYER", "g=1", "ms", "g=2", "ms", "g=4", "ms",
                                               "OUT", "B/SAMPLE", "PARAM", "B"]  # fmt: skip
    with connect(brain.address) as channel:
        stored = brain_pb2_grpc.BrainStub(channel).GetLayerProfile(
            brain_pb2.GetLayerProfileRequest(key=key)
        )
    assert stored.model_type == "mlp" and stored.profile.global_batch == 8
    assert [layer.parameter_bytes for layer in stored.profile.layers][:2] == [0, (8 * 16 + 16) * 4]
    assert json.loads(out.read_text())["globalBatch"] == 8

    assert main(["plan", "--burst", "--amp-limit", "2.0", str(job), *base]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["LAYER", "DEVICES", "AMP"]
    assert [line.split()[0] for line in lines[1:9]] == [
        layer.name for layer in stored.profile.layers
    ]
    assert "amplification limit 2, global batch 8, at most 4 devices" in lines[9]

    assert (
        main(["plan", "--burst", "--amp-limit", "1.5", "--devices", "2", str(job), *base, "--json"])
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["key"] == key and plan["max_devices"] == 2
    assert {layer["device_count"] for layer in plan["layers"]} <= {1, 2}


def test_clear_errors(
    daemons: DaemonFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brain = daemons("brain", ["--database-url", f"sqlite:///{tmp_path / 'b.db'}"])
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    assert main(["plan", "--burst", str(tmp_path / "none.yaml"), "--brain", brain.address]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["plan", "--burst", str(job), "--brain", brain.address]) == 3
    assert f"run `gearshift profile {job}` first" in capsys.readouterr().err
    assert main(["plan", "--burst", "--amp-limit", "0.5", str(job), "--brain", brain.address]) == 2
    assert "--amp-limit: must be >= 1" in capsys.readouterr().err
    assert main(["profile", str(job), "--max-devices", "3", "--brain", brain.address]) == 2
    assert "--max-devices: 3: want a power of two" in capsys.readouterr().err
    assert main(["plan", "--burst", str(job), "--brain", "127.0.0.1:1", "--rpc-timeout", "2"]) == 4
