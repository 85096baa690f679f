"""The dataset a dynamic-mode job asks the shard manager for: enough epochs for its steps
read twice over (before provisional acknowledgements, every restart from a checkpoint
handed out again the shards of the steps since it, and the chaos soak ran a
one-spare-epoch dataset out after ~20 restarts; the margin stays, as running jobs'
datasets have it); and the daemon's index log flag, which only dynamic mode uses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, plan_task
from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.wiring import _plan
from tests.unit.task_requests import resolved


def test_a_dynamic_dataset_has_room_for_restarts() -> None:
    settings = RunSettings(num_ests=4, global_batch_size=16, total_steps=600)
    plan = _plan("job-1", "job-1", "dynamic", 512, settings)
    shards = math.ceil(512 / settings.per_est_batch)  # one shard per EST mini-batch
    needed = math.ceil(600 * 4 / shards)  # epochs the steps read once
    assert plan.shard_size == settings.per_est_batch
    assert plan.num_epochs == 2 * needed + 1


def start_request(tmp_path: Path, mode: int, generation: int = 0) -> worker_pb2.StartTaskRequest:
    """A one-process StartTask of an MLP job with a dataset in `mode`."""
    return worker_pb2.StartTaskRequest(
        task_id=f"job-1.g{generation or 1}.w",
        job_id="job-1",
        spec=common_pb2.JobSpec(
            name="t",
            entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
            num_ests=1,
            global_batch_size=4,
            total_steps=10,
            dataset=common_pb2.DatasetSpec(size=64, shard_size=8, mode=mode),  # type: ignore[arg-type]
        ),
        placement=common_pb2.Placement(
            processes=[common_pb2.ProcessAssignment(rank=0, device_index=0, est_ids=[0])]
        ),
        local_ranks=[0],
        checkpoint_dir=str(tmp_path / "ckpt"),
        endpoints=worker_pb2.ServiceEndpoints(shard_manager="127.0.0.1:1"),
        generation=generation,
    )


def test_the_daemons_index_log_dir_reaches_only_dynamic_mode_processes(tmp_path: Path) -> None:
    settings = CommandSettings(python="python", index_log_dir=tmp_path / "idx")
    for mode, flagged in ((common_pb2.DATA_MODE_DYNAMIC, True), (0, False)):
        request = start_request(tmp_path, mode)
        given = resolved(plan_task(request, "w", ["cpu"]), settings, task_dir=tmp_path)
        assert given.services.index_log_dir == (tmp_path / "idx" if flagged else None)
    # Without the daemon's flag, no process gets one.
    plain = resolved(plan_task(request, "w", ["cpu"]), CommandSettings(python="python"))
    assert plain.services.index_log_dir is None


def test_the_placements_generation_reaches_the_training_process(tmp_path: Path) -> None:
    """StartTaskRequest.generation (the scheduler's) reaches the process, whose dynamic feed
    sends it with every holder call (fences); 0 (unset) is unfenced, negative is refused."""
    request = start_request(tmp_path, common_pb2.DATA_MODE_DYNAMIC, generation=7)
    settings = CommandSettings(python="python")
    assert resolved(plan_task(request, "w", ["cpu"]), settings).services.generation == 7
    request.generation = 0
    assert resolved(plan_task(request, "w", ["cpu"]), settings).services.generation == 0
    request.generation = -1
    with pytest.raises(ValidationError, match=r"^generation: must be >= 0"):
        plan_task(request, "w", ["cpu"])
