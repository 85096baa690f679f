"""Execution plans on the data path: the spec's allowed dimensions, the scheduler's and the
worker's refusal of a plan outside them, the runtime flags, and how `gearshift job` shows it."""

from __future__ import annotations

import pytest

from gearshift.client import render
from gearshift.client.spec import spec_from_dict
from gearshift.common import execplan
from gearshift.common.errors import ValidationError
from gearshift.common.jobspec import validate_job_spec
from gearshift.v1 import common_pb2, scheduler_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, plan_task
from tests.unit.task_requests import resolved

Plan = common_pb2.ExecutionPlan
Dims = common_pb2.PlanDimensions
D2 = common_pb2.DETERMINISM_LEVEL_D2


def spec(**fields: object) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(
        name="j",
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.digits_cnn"),
        num_ests=2,
        global_batch_size=16,
        total_steps=10,
        dataset=common_pb2.DatasetSpec(size=256, shard_size=16, seed=1),
        **fields,  # type: ignore[arg-type]
    )


def test_threads_may_vary_only_under_d2() -> None:
    validate_job_spec(spec(plan_dimensions=Dims(threads=True), determinism=D2))
    validate_job_spec(spec(plan_dimensions=Dims(gradient_checkpointing=True)))
    with pytest.raises(
        ValidationError, match=r"spec\.plan_dimensions\.threads: needs determinism D2"
    ):
        validate_job_spec(spec(plan_dimensions=Dims(threads=True)))


def test_yaml_names_the_allowed_dimensions() -> None:
    data = {
        "name": "j",
        "entrypoint": {"module": "m"},
        "num_ests": 2,
        "global_batch_size": 16,
        "total_steps": 10,
        "determinism": "D2",
        "dataset": {"size": 256, "shard_size": 16},
        "plan_dimensions": {"gradient_checkpointing": True, "threads": True},
    }
    parsed = spec_from_dict(data)
    assert parsed.plan_dimensions == Dims(gradient_checkpointing=True, threads=True)
    with pytest.raises(ValidationError, match="spec"):
        spec_from_dict({**data, "plan_dimensions": {"tensor_parallel": 2}})


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        (Plan(gradient_checkpointing=True), "plan.gradient_checkpointing"),
        (Plan(threads_per_process=2), "plan.threads_per_process"),
        (Plan(offload_optimizer=True), "plan.offload_optimizer"),
        (Plan(threads_per_process=-1), "plan.threads_per_process"),
    ],
)
def test_a_plan_outside_the_allowed_dimensions_is_refused(plan: Plan, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        execplan.check_allowed(spec(), plan)
    assert info.value.field == field
    everything = spec(
        plan_dimensions=Dims(gradient_checkpointing=True, threads=True, offload_optimizer=True),
        determinism=D2,
    )
    if plan.threads_per_process >= 0:
        execplan.check_allowed(everything, plan)
    execplan.check_allowed(spec(), Plan(threads_per_process=1))  # one thread is the default


def start(plan: Plan, job: common_pb2.JobSpec) -> worker_pb2.StartTaskRequest:
    processes = [
        common_pb2.ProcessAssignment(rank=0, worker_id="w", device_index=0, est_ids=[0, 1])
    ]
    return worker_pb2.StartTaskRequest(
        task_id="t1",
        job_id="j1",
        spec=job,
        placement=common_pb2.Placement(processes=processes),
        local_ranks=[0],
        checkpoint_dir="/tmp/ckpt",
        plan=plan,
    )


def test_the_worker_hands_the_plan_to_the_runtime() -> None:
    settings = CommandSettings(python="python")
    job = spec(plan_dimensions=Dims(gradient_checkpointing=True, threads=True), determinism=D2)
    given = resolved(
        plan_task(
            start(Plan(gradient_checkpointing=True, threads_per_process=2), job), "w", ["cpu"]
        ),
        settings,
    )
    assert given.threads == 2
    assert given.run.gradient_checkpointing and not given.run.offload_optimizer
    default = resolved(plan_task(start(Plan(), job), "w", ["cpu"]), settings)
    assert default.threads == 1 and not default.run.gradient_checkpointing
    with pytest.raises(ValidationError, match=r"plan\.offload_optimizer: job 'j' does not allow"):
        plan_task(start(Plan(offload_optimizer=True), job), "w", ["cpu"])


def test_job_details_and_json_show_the_plan() -> None:
    job = scheduler_pb2.Job(
        job_id="job-1",
        spec=spec(plan_dimensions=Dims(gradient_checkpointing=True)),
        plan=Plan(gradient_checkpointing=True),
    )
    text = render.job_details(job)
    assert "plan        gc on, 1 thread  (may change: ESTs/device, gc)" in text.splitlines()
    data = render.job_dict(job)
    assert data["plan"] == {
        "gradient_checkpointing": True,
        "threads_per_process": 1,
        "offload_optimizer": False,
    }
    bare = render.job_dict(scheduler_pb2.Job(job_id="job-2", spec=spec()))
    assert bare["plan"]["threads_per_process"] == 1


def test_describe() -> None:
    assert execplan.describe(Plan()) == "gc off, 1 thread"
    assert (
        execplan.describe(
            Plan(gradient_checkpointing=True, threads_per_process=2, offload_optimizer=True)
        )
        == "gc on, 2 threads, optimizer offload"
    )
