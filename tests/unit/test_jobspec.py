"""JobSpec validation names the bad field; defaults fill what "unset" means."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gearshift.common.errors import ValidationError
from gearshift.common.jobspec import validate_job_spec, with_defaults
from gearshift.v1 import common_pb2


def valid_spec() -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name="digits-cnn",
        entrypoint=common_pb2.Entrypoint(
            module="gearshift.examples.digits_cnn", config_json='{"lr": 0.1}'
        ),
        num_ests=4,
        global_batch_size=64,
        total_steps=300,
        dataset=common_pb2.DatasetSpec(name="digits", size=1797, shard_size=64, seed=1),
        accelerator_types=["v100", "t4"],
    )


def test_valid_spec_passes() -> None:
    validate_job_spec(valid_spec())


def _set(path: str, value: object) -> Callable[[common_pb2.JobSpec], None]:
    def apply(spec: common_pb2.JobSpec) -> None:
        *parents, leaf = path.split(".")
        target = spec
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, leaf, value)

    return apply


def _clear(field: str) -> Callable[[common_pb2.JobSpec], None]:
    return lambda spec: spec.ClearField(field)  # type: ignore[arg-type]


CASES: list[tuple[Callable[[common_pb2.JobSpec], None], str]] = [
    (_set("name", ""), "spec.name"),
    (_set("name", "bad name!"), "spec.name"),
    (_set("tenant", "a" * 65), "spec.tenant"),
    (_clear("entrypoint"), "spec.entrypoint"),
    (_set("entrypoint.module", "not a module"), "spec.entrypoint.module"),
    (_set("entrypoint.config_json", "{oops"), "spec.entrypoint.config_json"),
    (_set("entrypoint.config_json", "[1, 2]"), "spec.entrypoint.config_json"),
    (_set("num_ests", 0), "spec.num_ests"),
    (_set("num_ests", 5000), "spec.num_ests"),
    (_set("global_batch_size", 0), "spec.global_batch_size"),
    (_set("global_batch_size", 66), "spec.global_batch_size"),
    (_clear("total_steps"), "spec.total_steps"),
    (_set("total_steps", -1), "spec.total_steps"),
    (_set("epochs", 0), "spec.epochs"),
    (_clear("dataset"), "spec.dataset"),
    (_set("dataset.size", 0), "spec.dataset.size"),
    (_set("dataset.shard_size", 0), "spec.dataset.shard_size"),
    (_set("dataset.shard_size", 5000), "spec.dataset.shard_size"),
    (_set("dataset.seed", -3), "spec.dataset.seed"),
    (_set("dataset.mode", 9), "spec.dataset.mode"),
    (_set("determinism", 7), "spec.determinism"),
    (_set("service_class", 7), "spec.service_class"),
    (_set("elastic.max_devices", 5), "spec.elastic.max_devices"),
    (_set("elastic.min_devices", -1), "spec.elastic.min_devices"),
    (_set("priority_weight", -1.0), "spec.priority_weight"),
    (_set("priority_weight", float("nan")), "spec.priority_weight"),
    (_set("slo.deadline_seconds", 0.0), "spec.slo.deadline_seconds"),
    (_set("checkpoint_every_steps", -5), "spec.checkpoint_every_steps"),
]


@pytest.mark.parametrize(("mutate", "field"), CASES)
def test_invalid_field_is_named(mutate: Callable[[common_pb2.JobSpec], None], field: str) -> None:
    spec = valid_spec()
    mutate(spec)
    with pytest.raises(ValidationError) as exc:
        validate_job_spec(spec)
    assert exc.value.field == field, str(exc.value)


def test_min_devices_above_max_is_named() -> None:
    spec = valid_spec()
    spec.elastic.min_devices = 3
    spec.elastic.max_devices = 2
    with pytest.raises(ValidationError, match=r"spec\.elastic\.min_devices"):
        validate_job_spec(spec)


def test_duplicate_accelerator_type_is_named_by_index() -> None:
    spec = valid_spec()
    spec.accelerator_types.append("v100")
    with pytest.raises(ValidationError) as exc:
        validate_job_spec(spec)
    assert exc.value.field == "spec.accelerator_types[2]"


def test_defaults() -> None:
    spec = with_defaults(valid_spec())
    assert spec.tenant == "default"
    assert spec.model_type == "digits_cnn"
    assert spec.determinism == common_pb2.DETERMINISM_LEVEL_D1
    assert spec.dataset.mode == common_pb2.DATA_MODE_DETERMINISTIC
    assert spec.service_class == common_pb2.SERVICE_CLASS_BEST_EFFORT
    assert spec.priority_weight == 1.0
    assert (spec.elastic.min_devices, spec.elastic.max_devices) == (1, 4)
    validate_job_spec(spec)
