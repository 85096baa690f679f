"""A worker's collocated tasks without processes: what a background task's processes are
told, how a bad collocation is refused, and the collocation loop pausing a background task
through its pause file from its foreground's progress file (a fake clock)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.collocation import Policy
from gearshift.worker.command import CommandSettings, TaskPlan, plan_task
from gearshift.worker.multiplex import Multiplexer
from gearshift.worker.tasks import Task
from tests.unit.task_requests import resolved

C = common_pb2
SETTINGS = CommandSettings(python="python")


def request(job_id: str, role: int = 0, partner: str = "", devices: int = 1) -> Any:
    processes = [
        C.ProcessAssignment(rank=r, worker_id="wA", device_index=r, est_ids=[r])
        for r in range(devices)
    ]
    return worker_pb2.StartTaskRequest(
        task_id=f"{job_id}.g1.wA",
        job_id=job_id,
        spec=C.JobSpec(
            name="t",
            entrypoint=C.Entrypoint(module="gearshift.examples.mlp"),
            num_ests=devices,
            global_batch_size=4 * devices,
            total_steps=100,
            dataset=C.DatasetSpec(size=64, shard_size=8),
        ),
        placement=C.Placement(processes=processes),
        local_ranks=list(range(devices)),
        rendezvous_address="127.0.0.1:1234",
        checkpoint_dir="/tmp/ckpt",
        collocation=C.Collocation(role=role, partner_job_id=partner),  # type: ignore[arg-type]
    )


def plan(*args: object, **kw: object) -> TaskPlan:
    return plan_task(request(*args, **kw), "wA", ["cpu", "cpu"])  # type: ignore[arg-type]


def test_only_a_background_tasks_processes_run_low_and_pausable(tmp_path: Path) -> None:
    bg = plan("job-b", C.COLLOCATION_ROLE_BACKGROUND, "job-f")
    given = resolved(bg, SETTINGS, task_dir=tmp_path)
    assert given.pause_file == tmp_path / "pause"
    assert given.background and given.threads == 1
    for role in (C.COLLOCATION_ROLE_FOREGROUND, C.COLLOCATION_ROLE_SHARED, 0):
        other = plan("job-f", role, "job-b" if role else "", devices=2)
        given = resolved(other, SETTINGS, task_dir=tmp_path)
        assert not given.background and given.pause_file is None


@pytest.mark.parametrize(
    ("collocation", "message"),
    [
        (
            C.Collocation(role=C.COLLOCATION_ROLE_BACKGROUND),
            "collocation.partner_job_id: is required",
        ),
        (
            C.Collocation(role=C.COLLOCATION_ROLE_BACKGROUND, partner_job_id="job-b"),
            "collocation.partner_job_id: names the task's own job",
        ),
        (
            C.Collocation(
                role=C.COLLOCATION_ROLE_BACKGROUND, partner_job_id="f", max_foreground_slowdown=-1
            ),
            "collocation.max_foreground_slowdown: must be a number >= 0",
        ),
        (C.Collocation(role=9), "collocation.role: 9 is not a CollocationRole"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_collocation_is_refused_naming_the_field(
    collocation: C.Collocation, message: str
) -> None:
    start = request("job-b")
    start.collocation.CopyFrom(collocation)
    with pytest.raises(ValidationError) as exc:
        plan_task(start, "wA", ["cpu"])
    assert exc.value.message.startswith(message), exc.value.message


def report(task: Task, step: int, written: float) -> None:
    """Rank 0's progress file, as the runtime writes it, dated `written`."""
    path = task.task_dir / "progress.json"
    path.write_text(json.dumps({"step": step, "samples_per_s": 1.0}))
    os.utime(path, (written, written))


def test_the_loop_pauses_the_background_through_its_file(tmp_path: Path) -> None:
    fg = Task(
        plan("job-f", C.COLLOCATION_ROLE_FOREGROUND, "job-b", devices=2), tmp_path / "f", print
    )
    bg = Task(plan("job-b", C.COLLOCATION_ROLE_BACKGROUND, "job-f"), tmp_path / "b", print)
    for task in (fg, bg):
        task.task_dir.mkdir()
        task.state = C.TASK_STATE_RUNNING
    bg.set_pause(True, "starting")  # as Task.start does, before any process runs
    now = [1000.0]
    policy = Policy(max_slowdown=0.2, pause_s=2.0, baseline_s=1.0, min_steps=3)
    loop = Multiplexer(lambda: [fg, bg], policy, clock=lambda: now[0])

    def advance(seconds: float, step_s: float, step: int) -> int:
        end = now[0] + seconds
        while now[0] < end:
            now[0] += step_s
            step += 1
            report(fg, step, now[0])
            loop.tick()
        return step

    step = advance(1.5, 0.1, 0)  # the baseline, while paused
    assert not bg.pause_file.exists() and not bg.status().paused
    assert bg.status().pause_reason == "foreground job-f alone: 0.100 s/step (baseline)"
    step = advance(0.6, 0.15, step)  # 50% slower: paused
    status = bg.status()
    assert bg.pause_file.exists() and status.paused and status.pause_count == 1
    assert re.fullmatch(
        r"foreground job-f at 0\.1[2-5]\d s/step > bound 0\.120 s \(baseline 0\.100 s\)",
        status.pause_reason,
    ), status.pause_reason
    step = advance(2.1, 0.1, step)
    assert not bg.pause_file.exists() and not bg.status().paused
    fg.state = C.TASK_STATE_COMPLETED  # the foreground ended: nothing to wait for
    loop.tick()
    assert not bg.status().paused
    assert bg.status().pause_reason == (
        "foreground job-f has no progress to measure on this worker: running unpaused"
    )


def test_a_background_process_gets_the_least_cuda_stream_priority_the_others_the_greatest() -> None:
    from gearshift.worker.runtime.priority import device_stream, stream_priority

    assert stream_priority(True) == 0  # CUDA: a lower number is a higher priority
    assert stream_priority(False) == -1
    import torch

    with device_stream(torch.device("cpu"), True) as nothing:  # CPU: no stream at all
        assert nothing is None
