"""In-place membership changes through a real worker daemon (WorkerAgent.ChangeMembership and
StartTask with join_generation): the job grows onto a joining process and shrinks twice
without a restart, keeps the processes that stay, and ends with the fixed run's digest."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.ports import free_port
from gearshift.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import DaemonFactory
from tests.integration.test_worker_daemon import (
    FakeScheduler,
    finished,
    local_digest,
    serve_fake,
    spec,
    start_worker,
)

JOB = "job-ip"
C = common_pb2


def placement(mapping: list[int], devices: list[int]) -> C.Placement:
    processes, first = [], 0
    for rank, (count, device) in enumerate(zip(mapping, devices, strict=True)):
        ests = list(range(first, first + count))
        first += count
        processes.append(
            C.ProcessAssignment(rank=rank, worker_id="wA", device_index=device, est_ids=ests)
        )
    return C.Placement(processes=processes)


def change(
    generation: int, mapping: list[int], sources: list[int], at_step: int = 0
) -> worker_pb2.MembershipChange:
    address = f"127.0.0.1:{free_port()}" if len(mapping) > 1 else ""
    return worker_pb2.MembershipChange(
        generation=generation,
        mapping=mapping,
        sources=sources,
        master_addr=address,
        at_step=at_step,
        timeout_seconds=60,
    )


def test_a_job_grows_and_shrinks_in_place_keeping_its_processes(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    recorder, server, address = serve_fake()
    try:
        _grow_and_shrink(daemons, recorder, address, tmp_path)
    finally:
        server.stop(0)


def _grow_and_shrink(
    daemons: DaemonFactory, recorder: FakeScheduler, address: str, tmp_path: Path
) -> None:
    worker = start_worker(daemons, address, tmp_path, "cpu:3", "--step-delay", "0.05")
    job_spec = spec(60)
    ckpt = str(tmp_path / "ckpt")
    first = worker_pb2.StartTaskRequest(
        task_id=f"{JOB}.g0.wA",
        job_id=JOB,
        spec=job_spec,
        placement=placement([2, 2], [0, 1]),
        local_ranks=[0, 1],
        rendezvous_address=f"127.0.0.1:{free_port()}",
        checkpoint_dir=ckpt,
        epoch=2,  # from an elected leader
    )
    grow = change(1, [2, 1, 1], [0, 1, -1], at_step=3)
    joiner = worker_pb2.StartTaskRequest(  # its task id shares the job's rendezvous group
        task_id=f"{JOB}.g0.wA-j1",
        job_id=JOB,
        spec=job_spec,
        placement=placement([2, 1, 1], [0, 1, 2]),
        local_ranks=[2],
        rendezvous_address=grow.master_addr,
        checkpoint_dir=ckpt,
        join_generation=1,
        membership=grow,
        epoch=2,
    )
    shrink = change(2, [2, 2], [0, 2], at_step=20)  # old rank 1 leaves; the joiner is rank 1
    alone = change(3, [4], [0], at_step=35)  # the joiner leaves too
    with connect(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)

        def ask(task_id: str, to: worker_pb2.MembershipChange, epoch: int = 2) -> None:
            request = worker_pb2.ChangeMembershipRequest(task_id=task_id, change=to, epoch=epoch)
            stub.ChangeMembership(request)

        stub.StartTask(first)
        with pytest.raises(grpc.RpcError) as refused:  # 5 ESTs of 4: named, nothing written
            ask(first.task_id, change(1, [3, 1, 1], [0, 1, -1]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not split the 4 ESTs" in str(refused.value.details())
        with pytest.raises(grpc.RpcError) as fenced:  # a deposed leader's: refused
            ask(first.task_id, grow, epoch=1)
        assert fenced.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "leader epoch 1 is older than epoch 2" in str(fenced.value.details())
        ask(first.task_id, grow)
        ask(first.task_id, grow)  # a retry
        stub.StartTask(joiner)
        for to in (shrink, alone):
            ask(first.task_id, to)
            ask(joiner.task_id, to)
        with pytest.raises(grpc.RpcError) as skipped:  # generation 4 not written yet
            ask(first.task_id, change(5, [4], [0]))
        assert skipped.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    left = finished(recorder, joiner.task_id)
    assert left.state == C.TASK_STATE_LEFT, left.message
    done = finished(recorder, first.task_id)
    assert done.state == C.TASK_STATE_COMPLETED, done.message
    assert done.digest == local_digest(tmp_path, job_spec)
    tasks = tmp_path / "work" / "tasks"
    rank0 = (tasks / first.task_id / "rank0.log").read_text()
    # One process all along: it went through every generation and wrote the digest.
    for line in ("generation 1, 3 processes", "generation 2, 2 processes", "generation 3, 1"):
        assert line in rank0
    assert re.search(r"^digest sha256:" + done.digest, rank0, re.MULTILINE)
    assert "(generation 2)" in (tasks / first.task_id / "rank1.log").read_text()
    assert "(generation 3)" in (tasks / joiner.task_id / "rank2.log").read_text()
