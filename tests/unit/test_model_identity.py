"""A job's default model identity: what its code is, not only its module's name."""

from __future__ import annotations

from pathlib import Path

from gearshift.client.run_spec import RunOptions, run_job
from gearshift.common import codepkg
from gearshift.common.jobspec import validate_job_spec, with_defaults
from gearshift.common.model_identity import MAX_LENGTH, default_model_type, model_type_of
from gearshift.v1 import common_pb2

TRAIN = """DATASET_SIZE = 64


def build(config):
    return {layers}
"""


def submitted(file: Path) -> common_pb2.JobSpec:
    """The spec `gearshift run FILE` sends (its code packaged, as the SDK's submit does),
    as the scheduler fills it in."""
    job = run_job(RunOptions(file=file, ests=4, steps=10, max_devices=4))
    assert job.code is not None and not job.spec.model_type
    spec = common_pb2.JobSpec()
    spec.CopyFrom(job.spec)
    spec.entrypoint.code_sha256 = codepkg.package(job.code).sha256
    return with_defaults(spec)


def train_py(folder: Path, layers: int) -> Path:
    folder.mkdir()
    file = folder / "train.py"
    file.write_text(TRAIN.format(layers=layers))
    return file


def test_two_users_train_py_are_two_models_and_the_same_code_is_one(tmp_path: Path) -> None:
    mine = submitted(train_py(tmp_path / "alice", 2))
    theirs = submitted(train_py(tmp_path / "bob", 3))
    again = submitted(train_py(tmp_path / "alice-again", 2))  # the same source elsewhere
    assert mine.entrypoint.module == theirs.entrypoint.module == "train"
    assert mine.model_type != theirs.model_type
    for spec in (mine, theirs):
        digest = spec.entrypoint.code_sha256
        assert spec.model_type == f"train-{digest[:8]}"
        validate_job_spec(spec)
    assert again.model_type == mine.model_type


def test_an_explicit_model_type_is_kept() -> None:
    spec = common_pb2.JobSpec(
        model_type="resnet",
        entrypoint=common_pb2.Entrypoint(module="train", code_sha256="ab" * 32),
    )
    assert model_type_of(spec) == "resnet"


def test_gearshifts_own_modules_keep_their_name_and_others_their_import_path() -> None:
    def named(module: str) -> str:
        return default_model_type(common_pb2.Entrypoint(module=module))

    assert named("gearshift.examples.digits_cnn") == "digits_cnn"
    assert named("mylab.models.train") == "mylab.models.train"
    assert named("train") == "train"


def test_every_default_is_a_valid_model_type() -> None:
    digest = "0f" * 32
    odd = [
        common_pb2.Entrypoint(module="_train", code_sha256=digest),
        common_pb2.Entrypoint(module="__", code_sha256=digest),
        common_pb2.Entrypoint(module="_private.models.train"),
        common_pb2.Entrypoint(module=".".join(["deep"] * 40)),
        common_pb2.Entrypoint(module="t" * 200, code_sha256=digest),
    ]
    names = [default_model_type(e) for e in odd]
    assert names[:3] == ["train-0f0f0f0f", "model-0f0f0f0f", "private.models.train"]
    assert all(len(n) <= MAX_LENGTH for n in names)
    assert names[3] != default_model_type(common_pb2.Entrypoint(module=".".join(["deep"] * 41)))
    for entry in odd:
        spec = common_pb2.JobSpec(
            name="j",
            entrypoint=entry,
            num_ests=1,
            global_batch_size=1,
            total_steps=1,
            dataset=common_pb2.DatasetSpec(name="d", size=1, shard_size=1),
        )
        validate_job_spec(with_defaults(spec))
