"""DeepPool's multiplexing on a real worker daemon: a foreground task (2 ranks on 2 CPU slots)
and a background task (1 rank on one of those slots) started by StartTask, without a
scheduler. With a bound this tight the worker surely pauses the background at least once;
both tasks complete with the digests of the same jobs run alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.common.channel import connect
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import DaemonFactory
from tests.helpers import wait_until
from tests.integration.test_worker_daemon import (
    WAIT,
    FakeScheduler,
    finished,
    local_digest,
    serve_fake,
    spec,
    start_request,
    start_worker,
    status,
)

C = common_pb2


@pytest.fixture
def recorder() -> Iterator[tuple[FakeScheduler, str]]:
    servicer, server, address = serve_fake()
    yield servicer, address
    server.stop(0)


def collocated(
    tmp_path: Path,
    task_id: str,
    job_spec: C.JobSpec,
    role: C.CollocationRole.ValueType,
    partner: str,
    *,
    ranks: int,
) -> worker_pb2.StartTaskRequest:
    request = start_request(tmp_path, task_id, job_spec)
    if ranks == 1:  # all 4 ESTs on device 0, the foreground's rank 0's slot
        del request.placement.processes[1:]
        request.placement.processes[0].est_ids[:] = [0, 1, 2, 3]
        del request.local_ranks[1:]
    request.collocation.CopyFrom(
        C.Collocation(role=role, partner_job_id=partner, max_foreground_slowdown=0.0001)
    )
    return request


def test_a_background_task_is_paused_for_its_foreground_and_both_keep_their_digests(
    daemons: DaemonFactory, recorder: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    fake, address = recorder
    worker = start_worker(
        daemons, address, tmp_path, "cpu:2", "--log-every", "1", "--pause-seconds", "1"
    )
    fg_spec, bg_spec = spec(500), spec(120)
    bg_spec.dataset.seed = 11
    fg = collocated(tmp_path, "t-fg", fg_spec, C.COLLOCATION_ROLE_FOREGROUND, "job-t-bg", ranks=2)
    bg = collocated(tmp_path, "t-bg", bg_spec, C.COLLOCATION_ROLE_BACKGROUND, "job-t-fg", ranks=1)
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        stub.StartTask(fg)
        first = stub.StartTask(bg)
    assert first.paused and "measuring foreground job-t-fg's step time alone" in first.pause_reason

    def paused_for_slowdown() -> C.TaskStatus | None:
        now = status(worker, "t-bg")
        return now if now.paused and now.pause_count >= 1 else None

    seen = wait_until(paused_for_slowdown, WAIT, "the background paused for a slowdown")
    assert seen is not None
    assert seen.pause_reason.startswith("foreground job-t-fg at "), seen.pause_reason
    assert "s/step > bound" in seen.pause_reason and "(baseline " in seen.pause_reason
    fg_end, bg_end = finished(fake, "t-fg"), finished(fake, "t-bg")
    assert fg_end.state == C.TASK_STATE_COMPLETED, fg_end.message
    assert bg_end.state == C.TASK_STATE_COMPLETED, bg_end.message
    assert bg_end.pause_count >= 1 and not bg_end.paused
    beats = [t for h in list(fake.heartbeats) for t in h.tasks if t.task_id == "t-bg"]
    assert any(t.paused and t.pause_count >= 1 for t in beats)  # the scheduler is told
    log = (tmp_path / "work" / "tasks" / "t-bg" / "rank0.log").read_text()
    assert "background task: SCHED_IDLE" in log or "background task: nice 19" in log, log
    assert "paused before step" in log
    daemon_log = worker.log_path.read_text()
    assert "background task paused" in daemon_log
    assert "device still held" not in daemon_log  # collocated on purpose
    assert fg_end.digest == local_digest(tmp_path / "fg", fg_spec)
    assert bg_end.digest == local_digest(tmp_path / "bg", bg_spec)


def test_a_paused_background_task_stops_with_a_checkpoint(
    daemons: DaemonFactory, recorder: tuple[FakeScheduler, str], tmp_path: Path
) -> None:
    """A stop ends the pause: the task runs the step at which its processes agree to stop,
    checkpoints and ends CHECKPOINTED; its foreground, stopped without one, is killed."""
    fake, address = recorder
    worker = start_worker(daemons, address, tmp_path, "cpu:2", "--log-every", "1")
    fg = collocated(
        tmp_path, "t-fg", spec(1_000_000), C.COLLOCATION_ROLE_FOREGROUND, "job-t-bg", ranks=2
    )
    bg = collocated(
        tmp_path, "t-bg", spec(1_000_000), C.COLLOCATION_ROLE_BACKGROUND, "job-t-fg", ranks=1
    )
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        stub.StartTask(fg)
        stub.StartTask(bg)

        def paused_after_steps() -> bool:
            now = status(worker, "t-bg")
            return now.paused and now.pause_count >= 1

        wait_until(paused_after_steps, WAIT, "the background paused for a slowdown")
        stopped = stub.StopTask(
            worker_pb2.StopTaskRequest(task_id="t-bg", checkpoint=True, timeout_seconds=60)
        )
        assert stopped.state == C.TASK_STATE_CHECKPOINTED, stopped.message
        assert list((tmp_path / "ckpt" / "t-bg").glob("ckpt-*.pt"))
        killed = stub.StopTask(
            worker_pb2.StopTaskRequest(task_id="t-fg", checkpoint=False, timeout_seconds=60)
        )
    assert killed.state == C.TASK_STATE_FAILED and "terminated" in killed.message
    assert finished(fake, "t-bg").state == C.TASK_STATE_CHECKPOINTED
    assert finished(fake, "t-fg").state == C.TASK_STATE_FAILED  # reported before teardown
