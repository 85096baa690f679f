"""The dataset a dynamic-mode job asks the shard manager for: enough epochs for its steps
read twice over (before provisional acknowledgements, every restart from a checkpoint
handed out again the shards of the steps since it, and the chaos soak ran a
one-spare-epoch dataset out after ~20 restarts; the margin stays, as running jobs'
datasets have it); and the daemon's index log flag, which only dynamic mode uses."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, plan_task
from gearshift.worker.run import build_parser
from gearshift.worker.runtime.settings import RunSettings
from gearshift.worker.wiring import _plan


def test_a_dynamic_dataset_has_room_for_restarts() -> None:
    settings = RunSettings(num_ests=4, global_batch_size=16, total_steps=600)
    args = argparse.Namespace(
        dataset_id="job-1", job_id="job-1", data_mode="dynamic", data_size=512
    )
    plan = _plan(args, settings)
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
        argv = plan_task(request, "w", ["cpu"]).command(0, settings, tmp_path, tmp_path / "c")
        assert ("--index-log-dir" in argv) is flagged
        if flagged:
            assert argv[argv.index("--index-log-dir") + 1] == str(tmp_path / "idx")
    # Without the daemon's flag, no process gets one.
    plain = plan_task(request, "w", ["cpu"]).command(
        0, CommandSettings(python="python"), tmp_path, tmp_path / "c"
    )
    assert "--index-log-dir" not in plain


def test_the_placements_generation_reaches_the_training_process(tmp_path: Path) -> None:
    """StartTaskRequest.generation (the scheduler's) becomes --generation, which the dynamic
    feed sends with every holder call (fences); 0 (unset) adds no flag, negative is refused."""
    request = start_request(tmp_path, common_pb2.DATA_MODE_DYNAMIC, generation=7)
    settings = CommandSettings(python="python")
    argv = plan_task(request, "w", ["cpu"]).command(0, settings, tmp_path, tmp_path / "c")
    assert argv[argv.index("--generation") + 1] == "7"
    assert build_parser().parse_args(argv[3:]).generation == 7
    request.generation = 0
    argv = plan_task(request, "w", ["cpu"]).command(0, settings, tmp_path, tmp_path / "c")
    assert "--generation" not in argv
    assert build_parser().parse_args(argv[3:]).generation == 0
    request.generation = -1
    with pytest.raises(ValidationError, match=r"^generation: must be >= 0"):
        plan_task(request, "w", ["cpu"])
