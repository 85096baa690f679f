"""Job specs from YAML: conveniences, round trips, and errors that name the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gearshift.client.run_spec import RunOptions, run_job
from gearshift.client.spec import load_job, load_spec, spec_from_dict, spec_to_dict
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
    """The job file docs/user-guide/job-spec.md submits must keep loading."""
    path = Path(__file__).resolve().parents[2] / "examples" / "digits-cnn.yaml"
    spec = load_spec(path)
    assert spec.name == "digits-cnn"
    assert spec.num_ests == 4
    assert spec.entrypoint.module == "gearshift.examples.digits_cnn"
    assert spec.determinism == common_pb2.DETERMINISM_LEVEL_D2  # it mixes v100 and t4
    assert spec.service_class == common_pb2.SERVICE_CLASS_BEST_EFFORT


def test_own_code_by_path_or_working_dir(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("DATASET_SIZE = 10\n")
    (tmp_path / "pkg").mkdir()
    by_path = tmp_path / "a.yaml"
    by_path.write_text(GOOD.replace("module: gearshift.examples.digits_cnn", "path: ./train.py"))
    job = load_job(by_path)
    assert job.code == tmp_path / "train.py" and job.spec.entrypoint.module == "train"
    by_dir = tmp_path / "b.yaml"
    by_dir.write_text("working_dir: pkg\n" + GOOD.replace("digits_cnn", "x"))
    job = load_job(by_dir)
    assert job.code == tmp_path / "pkg" and job.spec.entrypoint.module == "gearshift.examples.x"
    with pytest.raises(ValidationError, match="ships its own code"):
        load_spec(by_dir)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("module: gearshift.examples.digits_cnn", "path: ./nope.py"), "does not exist"),
        (("module: gearshift.examples.digits_cnn", "path: ./pkg"), "is required when"),
        (("name: digits-cnn", "name: digits-cnn\nworking_dir: ./nope"), "is not a folder"),
        (
            ("module: gearshift.examples.digits_cnn", "path: ./t.py\n  module: t"),
            "not both",
        ),
    ],
)
def test_own_code_mistakes_are_named(tmp_path: Path, change: tuple[str, str], problem: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "t.py").write_text("")
    text = GOOD.replace(*change)
    if "not both" in problem:
        text = "working_dir: pkg\n" + text
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError, match=problem):
        load_job(path)


def test_run_builds_a_one_file_job(tmp_path: Path) -> None:
    script = tmp_path / "my_train.py"
    script.write_text("import torch\nDATASET_SIZE = 512\n\ndef build(config): ...\n")
    job = run_job(RunOptions(file=script, ests=4, steps=200))
    assert job.code == script
    spec = job.spec
    assert (spec.name, spec.entrypoint.module, spec.dataset.size) == ("my-train", "my_train", 512)
    assert (spec.num_ests, spec.global_batch_size, spec.elastic.max_devices) == (4, 32, 4)
    script.write_text("def build(config): ...\n")
    with pytest.raises(ValidationError, match="DATASET_SIZE = N") as info:
        run_job(RunOptions(file=script, ests=4, steps=200))
    assert info.value.field == "--data-size"
    assert run_job(RunOptions(file=script, ests=2, steps=5, data_size=64)).spec.dataset.size == 64
    with pytest.raises(ValidationError, match="is not JSON"):
        run_job(RunOptions(file=script, ests=2, steps=5, data_size=64, config="{"))
