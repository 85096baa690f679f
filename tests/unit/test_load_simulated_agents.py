"""bench/load.py's simulated workers: with --job-seconds a job that has run that long in
all is reported completed by its workers' next heartbeats, once, so the load's jobs end as
on a cluster; a preemption or a rescale pauses its time."""

from __future__ import annotations

import asyncio

from bench.load import SimulatedAgents
from gearshift.v1 import common_pb2, worker_pb2

C = common_pb2


def start(agents: SimulatedAgents, task_id: str, job_id: str, workers: list[str]) -> None:
    placement = C.Placement(processes=[C.ProcessAssignment(worker_id=w) for w in workers])
    request = worker_pb2.StartTaskRequest(
        task_id=task_id, job_id=job_id, placement=placement, local_ranks=range(len(workers))
    )
    asyncio.run(agents.StartTask(request, None))


def states(agents: SimulatedAgents, worker_id: str) -> dict[str, int]:
    return {s.task_id: s.state for s in agents.statuses(worker_id)}


def test_a_task_is_reported_completed_once_after_job_seconds() -> None:
    now = [100.0]
    agents = SimulatedAgents(job_seconds=30.0, clock=lambda: now[0])
    start(agents, "t1", "j1", ["w1", "w2"])
    now[0] = 110.0
    start(agents, "t2", "j2", ["w1"])
    now[0] = 129.9
    assert states(agents, "w1") == {"t1": C.TASK_STATE_RUNNING, "t2": C.TASK_STATE_RUNNING}
    now[0] = 130.0
    assert states(agents, "w1") == {"t1": C.TASK_STATE_COMPLETED, "t2": C.TASK_STATE_RUNNING}
    assert states(agents, "w1") == {"t2": C.TASK_STATE_RUNNING}  # reported once, then gone
    assert states(agents, "w2") == {"t1": C.TASK_STATE_COMPLETED}  # each of its workers says so
    now[0] = 140.0
    assert states(agents, "w1") == {"t2": C.TASK_STATE_COMPLETED}


def stop(agents: SimulatedAgents, task_id: str) -> None:
    asyncio.run(agents.StopTask(worker_pb2.StopTaskRequest(task_id=task_id, checkpoint=True), None))


def test_a_stopped_job_is_paused_and_completes_after_its_time_in_all() -> None:
    now = [0.0]
    agents = SimulatedAgents(job_seconds=30.0, clock=lambda: now[0])
    start(agents, "t1", "j1", ["w1"])
    now[0] = 10.0
    stop(agents, "t1")  # preempted after 10 s
    now[0] = 100.0
    start(agents, "t2", "j1", ["w2", "w3"])  # restarted, rescaled onto two workers
    now[0] = 110.0
    stop(agents, "t2")
    start(agents, "t3", "j1", ["w1"])  # a rescale: stopped and started in the same moment
    now[0] = 119.9
    assert states(agents, "w1") == {"t3": C.TASK_STATE_RUNNING}
    now[0] = 120.0
    assert states(agents, "w1") == {"t3": C.TASK_STATE_COMPLETED}
    assert states(agents, "w2") == {}


def test_without_job_seconds_tasks_run_until_stopped() -> None:
    now = [0.0]
    agents = SimulatedAgents(clock=lambda: now[0])
    start(agents, "t1", "j1", ["w1"])
    now[0] = 1e9
    assert states(agents, "w1") == {"t1": C.TASK_STATE_RUNNING}
    stopped = asyncio.run(
        agents.StopTask(worker_pb2.StopTaskRequest(task_id="t1", checkpoint=True), None)
    )
    assert (stopped.job_id, stopped.state) == ("j1", C.TASK_STATE_CHECKPOINTED)
    assert states(agents, "w1") == {}
