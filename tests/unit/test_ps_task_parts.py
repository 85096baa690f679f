"""A PS task's pure parts: cores per process, DLRover's metrics from measured use, and the
launcher command the worker daemon builds from a StartTaskRequest."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.v1 import common_pb2, worker_pb2
from gearshift.worker.command import CommandSettings, plan_task
from gearshift.worker.ps.task import UseMeter, assign_cores


def test_cores_are_disjoint_when_enough_and_shared_round_robin_when_not() -> None:
    assert assign_cores([4, 5, 6, 7], [1, 2, 1]) == [[4], [5, 6], [7]]
    assert assign_cores([0, 1], [1, 1, 1, 1]) == [[0], [1], [0], [1]]
    assert assign_cores([0, 1], [0.4, 3.0]) == [[0], [0, 1]]  # up to all, at least one
    with pytest.raises(ValueError, match="> 0 cores"):
        assign_cores([0], [0.0])
    with pytest.raises(ValueError, match="no cores"):
        assign_cores([], [1.0])


def test_metrics_are_dlrovers_w_hat_and_s_hat() -> None:
    meter = UseMeter(ps_pids=[1, 2], worker_pids=[3, 4])
    meter.first_at, meter.last_at = 10.0, 20.0
    meter.first_cpu = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}
    meter.last_cpu = {1: 6.0, 2: 2.0, 3: 5.0, 4: 7.0}  # cores: PS .6 .2, workers .5 .7
    meter.peak_rss = {1: 100, 2: 300, 3: 50, 4: 70}
    m = meter.metrics()
    assert m["worker_cores_used"] == pytest.approx(0.6)
    assert m["ps_cores_used"] == pytest.approx([0.6, 0.2])
    assert m["ps_cores_per_worker"] == pytest.approx(0.4)  # (0.6 + 0.2) / 2 workers
    assert (m["worker_memory_bytes_used"], m["ps_memory_bytes_used"]) == (70, 300)
    assert (m["ps"], m["workers"], m["measured_seconds"]) == (2, 2, 10.0)


def request(**plan: float) -> worker_pb2.StartTaskRequest:
    req = worker_pb2.StartTaskRequest(
        task_id="j.g0.w",
        job_id="j",
        spec=common_pb2.JobSpec(
            name="wd",
            total_steps=1000,
            parameter_server=common_pb2.ParameterServerSpec(vocab=100, train_blocks=30, max_ps=4),
        ),
        placement=common_pb2.Placement(
            processes=[common_pb2.ProcessAssignment(rank=0, device_index=0, est_ids=[0])]
        ),
        local_ranks=[0],
        checkpoint_dir="/tmp/ck",
        endpoints=worker_pb2.ServiceEndpoints(shard_manager="127.0.0.1:7000"),
    )
    req.ps_plan.CopyFrom(
        common_pb2.ParameterServerPlan(ps=2, workers=3, ps_cores=1.0, worker_cores=2.0)
    )
    for name, value in plan.items():
        setattr(req.ps_plan, name, value)
    return req


def test_the_daemon_runs_the_ps_launcher_with_the_plan() -> None:
    req = request()
    req.ps_plan.ps_cores_each[:] = [1.0, 3.0]  # PS 1 replaced by a larger one
    task = plan_task(req, "w", ["cpu"])
    argv = task.command(0, CommandSettings(python="py"), Path("/t/task.binpb"))
    text = " ".join(argv)
    assert argv[:4] == ["py", "-m", "gearshift.worker.ps.run", "--task"]
    for part in (
        "--ps 2 --workers 3",
        "--ps-cores-each 1,3",
        "--worker-cores 2",
        "--total-steps 1000",
        "--vocab 100 --batch 256 --train-blocks 30",
        "--shard-manager 127.0.0.1:7000 --dataset-id j --job-id j",
        "--epochs 35",  # ceil(1000 / 30) + 1
        "--progress-file /t/progress.json",
    ):
        assert part in text, (part, text)
    assert "--read-ms 0.0" in text


def test_the_spec_read_ms_reaches_the_launcher() -> None:
    req = request()
    req.spec.parameter_server.read_ms = 12.5
    task = plan_task(req, "w", ["cpu"])
    argv = task.command(0, CommandSettings(python="py"), Path("/t/task.binpb"))
    assert "--read-ms 12.5" in " ".join(argv)


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        ({"ps": 0}, "ps_plan.ps"),
        ({"ps": 5}, "ps_plan.ps"),  # spec.parameter_server.max_ps = 4
        ({"workers": 9}, "ps_plan.workers"),
        ({"worker_cores": 0.0}, "ps_plan.worker_cores"),
        ({"ps_cores": float("nan")}, "ps_plan.ps_cores"),
    ],
)
def test_a_bad_ps_plan_names_the_field(plan: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        plan_task(request(**plan), "w", ["cpu"])
    assert err.value.field == field


def test_ps_plan_is_required_for_a_ps_job_and_refused_for_others() -> None:
    req = request()
    req.ClearField("ps_plan")
    with pytest.raises(ValidationError) as err:
        plan_task(req, "w", ["cpu"])
    assert err.value.field == "ps_plan"
    req = request()
    req.ps_plan.ps_cores_each[:] = [1.0]
    with pytest.raises(ValidationError) as err:
        plan_task(req, "w", ["cpu"])
    assert err.value.field == "ps_plan.ps_cores_each"
