"""The worker's checks of in-place changes (inplace.py, plan_task's join_generation, Task.change):
a bad one is refused naming its field and writes nothing; ranks follow the changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearshift.common.errors import PreconditionError, ValidationError
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, plan_task
from gearshift.worker.inplace import moved, to_change
from gearshift.worker.runtime import membership
from gearshift.worker.tasks import Task

C, W = common_pb2, worker_pb2


def _request(**fields: object) -> W.StartTaskRequest:
    spec = C.JobSpec(
        name="t",
        entrypoint=C.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=4,
        global_batch_size=16,
        total_steps=10,
        dataset=C.DatasetSpec(size=256, shard_size=16, seed=3),
    )
    processes = [
        C.ProcessAssignment(rank=r, worker_id="wA", device_index=r, est_ids=ests)
        for r, ests in enumerate([[0, 1], [2], [3]])
    ]
    request = W.StartTaskRequest(
        task_id="j.g0.wA",
        job_id="j",
        spec=spec,
        placement=C.Placement(processes=processes),
        local_ranks=[0, 1, 2],
        rendezvous_address="127.0.0.1:5000",
        checkpoint_dir="/tmp/ckpt",
    )
    for name, value in fields.items():
        if isinstance(value, (W.MembershipChange, C.Placement)):
            getattr(request, name).CopyFrom(value)
        elif isinstance(value, list):
            del getattr(request, name)[:]
            getattr(request, name).extend(value)
        else:
            setattr(request, name, value)
    return request


GROW = W.MembershipChange(
    generation=1, mapping=[2, 1, 1], sources=[0, 1, -1], master_addr="127.0.0.1:5000"
)


def test_a_joining_task_is_planned_with_its_change(tmp_path: Path) -> None:
    request = _request(local_ranks=[2], join_generation=1, membership=GROW)
    plan = plan_task(request, "wA", ["cpu"] * 3)
    assert plan.join is not None and plan.join.sources == (0, 1, None)
    task = plan.training_task(CommandSettings(python="py"), tmp_path)
    assert task.join_generation == 1
    assert task.membership_file == str(tmp_path / "membership.json")


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"join_generation": 1}, "membership", "is required with join_generation"),
        ({"membership": GROW}, "membership", "needs join_generation"),
        (
            {"join_generation": 2, "membership": GROW},
            "membership.generation",
            "not join_generation",
        ),
        ({"join_generation": 1, "membership": GROW}, "membership", "rank 0 is old rank 0's"),
        (
            {"join_generation": 1, "membership": GROW, "local_ranks": [2], "resume": True},
            "resume",
            "takes the running job's state",
        ),
        (
            {
                "join_generation": 1,
                "membership": GROW,
                "local_ranks": [2],
                "rendezvous_address": "127.0.0.1:5001",
            },
            "rendezvous_address",
            "master_addr",
        ),
    ],
)
def test_a_bad_join_is_refused_by_name(fields: dict[str, object], field: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem) as raised:
        plan_task(_request(**fields), "wA", ["cpu"] * 3)
    assert raised.value.field == field


def test_a_change_of_bad_values_names_the_part() -> None:
    with pytest.raises(ValidationError) as raised:
        to_change(W.MembershipChange(generation=1, mapping=[4], sources=[-2]), "change")
    assert raised.value.field == "change.sources"
    with pytest.raises(ValidationError) as raised:
        to_change(W.MembershipChange(generation=0, mapping=[4], sources=[0]), "change")
    assert raised.value.field == "change.generation"


def test_ranks_follow_the_changes() -> None:
    grow = to_change(GROW, "c")
    shrink = to_change(W.MembershipChange(generation=2, mapping=[4], sources=[2]), "c")
    ranks = moved({0: 0, 1: 1}, grow)
    assert ranks == {0: 0, 1: 1}
    assert moved(ranks, shrink) == {0: None, 1: None}
    assert moved({2: 2}, shrink) == {2: 0}


def test_a_task_writes_each_change_once_in_order_and_refuses_a_bad_one(tmp_path: Path) -> None:
    request = _request(
        placement=C.Placement(
            processes=[
                C.ProcessAssignment(rank=0, worker_id="wA", device_index=0, est_ids=[0, 1]),
                C.ProcessAssignment(rank=1, worker_id="wA", device_index=1, est_ids=[2, 3]),
            ]
        ),
        local_ranks=[0, 1],
    )
    task = Task(plan_task(request, "wA", ["cpu"] * 2), tmp_path, lambda t: None)
    task.state = C.TASK_STATE_RUNNING
    with pytest.raises(ValidationError, match="does not split the 4 ESTs"):
        task.change(
            to_change(W.MembershipChange(generation=1, mapping=[3, 2], sources=[0, 1]), "c")
        )
    with pytest.raises(PreconditionError, match="the next change is 1, not 2"):
        task.change(to_change(W.MembershipChange(generation=2, mapping=[4], sources=[0]), "c"))
    assert not task.membership_file.exists()
    grow = to_change(GROW, "c")
    task.change(grow)
    task.change(grow)  # a retry
    assert membership.parse(task.membership_file.read_text()) == [grow]
    assert task.generation == 1 and task.ranks == {0: 0, 1: 1}
    task.state = C.TASK_STATE_STOPPING
    with pytest.raises(PreconditionError, match="only a running task"):
        task.change(to_change(W.MembershipChange(generation=2, mapping=[4], sources=[0]), "c"))
