"""A real worker daemon runs a parameter-server job's task: the PS launcher with the plan's
counts and cores, progress and measured PS metrics carried by heartbeats, a stop request
that ends the phase checkpointed, and a restart with other counts that resumes from it
(shard manager on Redis for the dynamic shards)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from gearshift.worker.ps import checkpoint as ckpt
from gearshift.worker.shard_client import ShardClient
from tests.conftest import DaemonFactory
from tests.helpers import wait_until
from tests.integration.test_shard_service import sm  # noqa: F401 (the fixture)
from tests.integration.test_worker_daemon import (
    WAIT,
    FakeScheduler,
    fake,
    finished,
    start_worker,
    status,
)

C = common_pb2
__all__ = ["fake"]  # the fixture, used by name
TOTAL = 2000  # global batches (~10 s here): the first task is stopped long before
# 3 PS x 4 workers on 2 cores beside another test took over 60 s on a slow CI machine.
FINISH_WAIT = 3 * WAIT


def ps_spec(total: int) -> C.JobSpec:
    return C.JobSpec(
        name="wd",
        total_steps=total,
        parameter_server=C.ParameterServerSpec(
            seed=5, fields=4, vocab=2000, batch=128, train_blocks=40, eval_blocks=10
        ),
    )


def ps_request(
    tmp_path: Path, task_id: str, sm_address: str, ps: int, workers: int
) -> worker_pb2.StartTaskRequest:
    return worker_pb2.StartTaskRequest(
        task_id=task_id,
        job_id="job-ps",
        spec=ps_spec(TOTAL),
        placement=C.Placement(
            processes=[C.ProcessAssignment(rank=0, worker_id="wA", device_index=0, est_ids=[0])]
        ),
        local_ranks=[0],
        checkpoint_dir=str(tmp_path / "ckpt" / "job-ps"),
        resume=True,
        endpoints=worker_pb2.ServiceEndpoints(shard_manager=sm_address),
        dataset_id="job-ps",
        ps_plan=C.ParameterServerPlan(ps=ps, workers=workers, ps_cores=1, worker_cores=1),
    )


@pytest.mark.slow
def test_a_ps_task_trains_stops_checkpointed_and_resumes_with_other_counts(
    daemons: DaemonFactory,
    fake: tuple[FakeScheduler, str],
    tmp_path: Path,
    sm: Callable[..., str],  # noqa: F811
) -> None:
    recorder, address = fake
    shard_manager = sm()
    worker = start_worker(daemons, address, tmp_path)
    root = tmp_path / "ckpt" / "job-ps"
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        stub.StartTask(ps_request(tmp_path, "ps.g0", shard_manager, 2, 2))

        def measured() -> C.TaskStatus | None:
            s = status(worker, "ps.g0")
            return s if s.progress.step >= 50 and s.ps_metrics.measured_seconds > 0 else None

        running = wait_until(measured, WAIT, "the PS task training and measured")
        assert running is not None
        metrics = running.ps_metrics
        assert (metrics.ps, metrics.workers) == (2, 2)
        assert len(metrics.ps_cores_used) == 2 and metrics.worker_cores_used > 0
        assert metrics.ps_cores_per_worker > 0 and metrics.worker_memory_bytes_used > 0
        stopped = stub.StopTask(
            worker_pb2.StopTaskRequest(task_id="ps.g0", checkpoint=True, timeout_seconds=60)
        )
        assert stopped.state == C.TASK_STATE_CHECKPOINTED, stopped.message
        # Heartbeats carried the measurements while it ran.
        heard = wait_until(
            lambda: [
                t for h in list(recorder.heartbeats) for t in h.tasks
                if t.task_id == "ps.g0" and t.ps_metrics.measured_seconds > 0
            ],
            WAIT,
            "a heartbeat with the PS metrics",
        )  # fmt: skip
        assert heard[-1].progress.total_steps == TOTAL
        first = ckpt.read_manifest(root)
        assert first is not None and 50 <= first.next_batch < TOTAL
        assert first.num_ps == 2 and first.updates_acked == first.updates_applied
        table = ckpt.load_table(root)
        # The next task: 3 PS x 4 workers from that checkpoint (rows re-partitioned), to the end.
        stub.StartTask(ps_request(tmp_path, "ps.g1", shard_manager, 3, 4))
        probe = ps_request(tmp_path, "ps.bad", shard_manager, 3, 4)
        probe.ps_plan.workers = 99
        with pytest.raises(grpc.RpcError) as err:
            stub.StartTask(probe)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ps_plan.workers" in (err.value.details() or "")
    final = finished(recorder, "ps.g1", FINISH_WAIT)
    assert final.state == C.TASK_STATE_COMPLETED, final.message
    assert final.digest and final.progress.step == TOTAL
    assert final.ps_metrics.ps == 3 and final.ps_metrics.workers == 4
    assert 0.5 < final.ps_metrics.heldout_auc <= 1.0
    last = ckpt.read_manifest(root)
    assert last is not None and last.num_ps == 3 and last.updates_acked == last.updates_applied
    assert last.next_batch == TOTAL
    # Rows no batch of the second phase touched are those the first checkpoint held.
    after = ckpt.load_table(root)
    assert after.shape == table.shape and (after != table).any()
    with ShardClient(shard_manager) as client:
        done = sum(e.shards_done for e in client.describe("job-ps").epochs)
    assert done == last.next_batch  # every batch of the checkpoint is an acknowledged shard


def processes_of(root: Path) -> list[int]:
    """Pids of the processes whose command line names this checkpoint folder."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_a_ps_task_stopped_without_checkpoint_takes_its_processes_along(
    daemons: DaemonFactory,
    fake: tuple[FakeScheduler, str],
    tmp_path: Path,
    sm: Callable[..., str],  # noqa: F811
) -> None:
    """Cancel's path: the launcher is killed, and its PS and worker processes die with it."""
    _, address = fake
    shard_manager = sm()
    worker = start_worker(daemons, address, tmp_path)
    root = tmp_path / "ckpt" / "job-ps"
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        stub.StartTask(ps_request(tmp_path, "ps.k", shard_manager, 2, 2))
        wait_until(lambda: status(worker, "ps.k").progress.step > 0, WAIT, "training")
        assert len(processes_of(root)) == 5  # the launcher, 2 PS, 2 workers
        stopped = stub.StopTask(worker_pb2.StopTaskRequest(task_id="ps.k", checkpoint=False))
    assert stopped.state == C.TASK_STATE_FAILED
    wait_until(lambda: not processes_of(root), WAIT, "PS processes outlived their launcher")
    assert ckpt.read_manifest(root) is None  # nothing published: the next start redoes it


@pytest.mark.slow
def test_a_ps_task_checkpoints_every_n_batches_so_a_kill_loses_at_most_n(
    daemons: DaemonFactory,
    fake: tuple[FakeScheduler, str],
    tmp_path: Path,
    sm: Callable[..., str],  # noqa: F811
) -> None:
    """`checkpoint_every_steps` on a PS job: phases of the same counts, each published, so a
    task killed mid-run (no stop checkpoint) resumes from the last of them, not from 0."""
    _, address = fake
    shard_manager = sm()
    worker = start_worker(daemons, address, tmp_path)
    root = tmp_path / "ckpt" / "job-ps"
    every = 300
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        request = ps_request(tmp_path, "ps.c0", shard_manager, 1, 2)
        request.spec.checkpoint_every_steps = every
        stub.StartTask(request)

        def checkpointed() -> ckpt.Manifest | None:
            found = ckpt.read_manifest(root)
            return found if found is not None and found.next_batch >= every else None

        published = wait_until(checkpointed, WAIT, "a checkpoint published while the task runs")
        assert published is not None
        assert status(worker, "ps.c0").state == C.TASK_STATE_RUNNING
        assert published.next_batch % every == 0 and published.num_ps == 1
        stopped = stub.StopTask(worker_pb2.StopTaskRequest(task_id="ps.c0", checkpoint=False))
        assert stopped.state == C.TASK_STATE_FAILED  # killed: no checkpoint of its own
        kept = ckpt.read_manifest(root)
        assert kept is not None and kept.next_batch >= published.next_batch
        assert kept.next_batch % every == 0 and kept.updates_acked == kept.updates_applied
        again = ps_request(tmp_path, "ps.c1", shard_manager, 1, 2)
        stub.StartTask(again)
        step = wait_until(lambda: status(worker, "ps.c1").progress.step, WAIT, "resumed")
        assert step >= kept.next_batch  # not from 0
        stub.StopTask(worker_pb2.StopTaskRequest(task_id="ps.c1", checkpoint=False))
