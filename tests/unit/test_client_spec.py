"""Job specs from YAML: conveniences, round trips, and errors that name the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gearshift.client.spec import load_spec, spec_from_dict, spec_to_dict
from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2

GOOD = """
name: digits-cnn
entrypoint:
  module: gearshift.examples.digits_cnn
  config: {lr: 0.05, hidden: 32}
num_ests: 4
global_batch_size: 64
total_steps: 300
dataset: {name: digits, size: 1797, shard_size: 32, seed: 1, mode: deterministic}
determinism: D2
service_class: guaranteed
elastic: {min_devices: 1, max_devices: 4}
accelerator_types: [v100, t4]
"""


def test_yaml_loads_with_short_enum_names(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD)
    spec = load_spec(path)
    assert spec.entrypoint.config_json == '{"hidden": 32, "lr": 0.05}'
    assert spec.determinism == common_pb2.DETERMINISM_LEVEL_D2
    assert spec.dataset.mode == common_pb2.DATA_MODE_DETERMINISTIC
    assert spec.service_class == common_pb2.SERVICE_CLASS_GUARANTEED
    assert list(spec.accelerator_types) == ["v100", "t4"]


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD)
    spec = load_spec(path)
    data = spec_to_dict(spec)
    assert data["determinism"] == "D2"
    assert data["entrypoint"]["config"] == {"hidden": 32, "lr": 0.05}
    assert spec_from_dict(data) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: [unclosed", "malformed YAML: line 1"),
        ("- just\n- a list\n", "spec: must be a mapping"),
        (GOOD.replace("num_ests: 4", "num_ests: four"), "spec"),
        (GOOD.replace("num_ests: 4", "num_ests: 0"), "spec.num_ests"),
        (
            GOOD.replace("determinism: D2", "determinism: D9"),
            "spec.determinism: 'D9' is not one of",
        ),
        (GOOD + "colour: blue\n", "colour"),
        (GOOD.replace("mode: deterministic", "mode: random"), "spec.dataset.mode"),
    ],
)
def test_bad_specs_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError, match=re.escape(message)):
        load_spec(path)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"nope\.yaml: cannot read"):
        load_spec(tmp_path / "nope.yaml")


def test_the_readme_example_job_file_loads() -> None:
    """The README's `gearshift submit examples/digits-cnn.yaml` must keep working."""
    path = Path(__file__).resolve().parents[2] / "examples" / "digits-cnn.yaml"
    spec = load_spec(path)
    assert spec.name == "digits-cnn"
    assert spec.num_ests == 4
    assert spec.entrypoint.module == "gearshift.examples.digits_cnn"
    assert spec.determinism == common_pb2.DETERMINISM_LEVEL_D2  # it mixes v100 and t4
    assert spec.service_class == common_pb2.SERVICE_CLASS_BEST_EFFORT
