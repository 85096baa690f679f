"""A parameter-server JobSpec: the PS spec decides the generic fields; errors name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearshift.client import render
from gearshift.client.spec import load_spec
from gearshift.common.errors import ValidationError
from gearshift.common.jobspec import PS_MODULE, is_ps_job, validate_job_spec, with_defaults
from gearshift.v1 import common_pb2, scheduler_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ps-wide-deep.yaml"


def ps_spec() -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name="wd",
        total_steps=100,
        parameter_server=common_pb2.ParameterServerSpec(
            ps=2, workers=2, vocab=1000, train_blocks=50
        ),
    )


def test_ps_spec_is_valid_and_defaults_are_derived() -> None:
    spec = ps_spec()
    validate_job_spec(spec)
    full = with_defaults(spec)
    validate_job_spec(full)  # the worker validates the spec with defaults again
    assert is_ps_job(full)
    assert full.entrypoint.module == PS_MODULE
    assert full.num_ests == 1 and full.global_batch_size == 256
    assert full.dataset.size == 50 * 256 and full.dataset.shard_size == 256
    assert full.dataset.mode == common_pb2.DATA_MODE_DYNAMIC
    assert full.determinism == common_pb2.DETERMINISM_LEVEL_D0
    assert full.parameter_server.max_ps == 8 and full.parameter_server.lr == 0.05
    assert full.model_type == "wide-deep"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: setattr(s.parameter_server, "ps", -1), "spec.parameter_server.ps"),
        (lambda s: setattr(s.parameter_server, "max_ps", 1), "spec.parameter_server.ps"),
        (lambda s: setattr(s.parameter_server, "workers", 65), "spec.parameter_server.workers"),
        (lambda s: setattr(s.parameter_server, "batch", -4), "spec.parameter_server.batch"),
        (lambda s: setattr(s.parameter_server, "lr", -0.1), "spec.parameter_server.lr"),
        (lambda s: setattr(s.parameter_server, "vocab", 10**8), "spec.parameter_server.vocab"),
        (lambda s: setattr(s.parameter_server, "read_ms", -1), "spec.parameter_server.read_ms"),
        (lambda s: setattr(s.parameter_server, "slots", 9), "spec.parameter_server.slots"),
        (lambda s: setattr(s.parameter_server, "slots", -1), "spec.parameter_server.slots"),
        (
            lambda s: setattr(s.parameter_server, "read_ms", float("inf")),
            "spec.parameter_server.read_ms",
        ),
        (lambda s: setattr(s, "epochs", 3), "spec.total_steps"),
        (lambda s: setattr(s, "total_steps", -1), "spec.total_steps"),
        (lambda s: setattr(s, "num_ests", 4), "spec.num_ests"),
        (lambda s: setattr(s, "global_batch_size", 64), "spec.global_batch_size"),
        (lambda s: setattr(s.entrypoint, "module", "my.job"), "spec.entrypoint"),
        (lambda s: setattr(s.dataset, "size", 10), "spec.dataset"),
        (lambda s: setattr(s.elastic, "max_devices", 4), "spec.elastic"),
        (lambda s: s.accelerator_types.append("v100"), "spec.accelerator_types"),
        (
            lambda s: setattr(s, "determinism", common_pb2.DETERMINISM_LEVEL_D1),
            "spec.determinism",
        ),
        (lambda s: setattr(s.plan_dimensions, "threads", True), "spec.plan_dimensions"),
    ],
)
def test_bad_ps_spec_names_the_field(change: object, field: str) -> None:
    spec = ps_spec()
    change(spec)  # type: ignore[operator]
    with pytest.raises(ValidationError) as err:
        validate_job_spec(spec)
    assert err.value.field == field, str(err.value)


def test_a_ps_job_of_several_slots_asks_for_as_many_devices() -> None:
    spec = ps_spec()
    spec.parameter_server.slots = 3
    full = with_defaults(spec)
    validate_job_spec(full)  # the worker validates the spec with defaults again
    assert full.num_ests == 3  # one rank a slot
    assert full.elastic.min_devices == full.elastic.max_devices == 3
    assert with_defaults(ps_spec()).parameter_server.slots == 1  # 0: one


def test_example_ps_spec_is_accepted() -> None:
    """`gearshift submit examples/ps-wide-deep.yaml` sends this spec."""
    spec = load_spec(EXAMPLE)
    validate_job_spec(spec)
    assert is_ps_job(spec)
    assert spec.parameter_server.ps == 0  # the Brain decides
    assert with_defaults(spec).parameter_server.max_workers == 4


def test_gearshift_job_says_a_ps_job_is_not_bitwise_reproducible() -> None:
    job = scheduler_pb2.Job(job_id="j", spec=with_defaults(ps_spec()))
    line = next(x for x in render.job_details(job).splitlines() if x.startswith("ps job"))
    assert "starts 2 PS x 2 workers (at most 8 x 8)" in line
    assert "NOT bitwise reproducible" in line


def test_gearshift_watch_shows_no_loss_for_a_ps_job() -> None:
    """A PS job reports no loss (its workers push asynchronously): `watch` leaves it out
    instead of printing 0.0000; an EST job's loss is shown."""
    ps_event = scheduler_pb2.JobEvent(
        progress=common_pb2.JobProgress(step=40, total_steps=100, samples_per_second=9.5)
    )
    assert "loss" not in render.event_line(ps_event) and "step 40/100" in render.event_line(
        ps_event
    )
    est_event = scheduler_pb2.JobEvent(
        progress=common_pb2.JobProgress(step=40, total_steps=100, loss=0.25)
    )
    assert "loss 0.2500" in render.event_line(est_event)
