"""Stragglers through the scheduler (simulated workers, heartbeats with per-process step
times): the straggler's worker is marked degraded, shown in the cluster state, the job
moves off it at the next round when it can, and the mark clears."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.types import StragglerPolicy
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.helpers import wait_until
from tests.sched_harness import Clock, SimulatedAgents, job_spec, make_scheduler, register

C = common_pb2
S = scheduler_pb2
POLICY = StragglerPolicy(margin=0.5, reports=2, clear_seconds=60.0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def made(clock: Clock) -> Iterator[tuple[Scheduler, SimulatedAgents]]:
    settings = SchedulerSettings(round_seconds=1.0, stragglers=POLICY)
    scheduler, agents = make_scheduler(settings, clock=clock)
    try:
        yield scheduler, agents
    finally:
        scheduler.stop()


def start_job(scheduler: Scheduler, agents: SimulatedAgents) -> tuple[str, dict[str, str]]:
    """A 2-process job; (job id, worker -> its task id)."""
    spec = job_spec("s", 2)
    spec.elastic.min_devices = 2
    job, _ = scheduler.submit(spec, "")
    scheduler.run_round()
    tasks = {r.task_id.rpartition(".")[2]: r.task_id for r in agents.started}
    assert len(tasks) == 2, tasks
    return job.job_id, tasks


def report(
    scheduler: Scheduler, job_id: str, tasks: dict[str, str], step: int, times: dict[str, float]
) -> None:
    """Each worker's heartbeat: its task's one process (rank by the job's placement)."""
    placement = scheduler.get(job_id).placement
    rank_of = {p.worker_id: p.rank for p in placement.processes}
    for worker, seconds in times.items():
        timing = C.ProcessTiming(
            rank=rank_of[worker], step=step, compute_seconds_per_step=seconds, ests=1
        )
        status = C.TaskStatus(
            task_id=tasks[worker],
            job_id=job_id,
            state=C.TASK_STATE_RUNNING,
            process_timings=[timing],
        )
        assert not scheduler.heartbeat(worker, [status])


def degraded(scheduler: Scheduler) -> dict[str, str]:
    return {w.worker_id: w.degraded_reason for w in scheduler.cluster_state().workers if w.degraded}


def events(scheduler: Scheduler, job_id: str) -> list[tuple[int, str]]:
    return [(e.type, e.message) for e in scheduler.state.store.events_after(job_id, 0)]


def test_the_job_moves_off_a_straggler_worker_and_the_mark_expires(
    made: tuple[Scheduler, SimulatedAgents], clock: Clock
) -> None:
    scheduler, agents = made
    for worker in ("a", "b", "c"):
        register(scheduler, worker, {"cpu": 1})
    job_id, tasks = start_job(scheduler, agents)
    fast, slow = sorted(tasks)
    report(scheduler, job_id, tasks, 5, {fast: 0.1, slow: 0.4})
    assert degraded(scheduler) == {}  # one slow report of the two it takes
    report(scheduler, job_id, tasks, 5, {fast: 0.1, slow: 0.4})  # the same one, repeated
    assert degraded(scheduler) == {}
    report(scheduler, job_id, tasks, 10, {fast: 0.1, slow: 0.4})
    reason = degraded(scheduler)[slow]
    assert reason.startswith(f"STRAGGLER rank 1 on worker {slow}: 0.4 s/step vs median 0.1 s")
    stragglers = [m for t, m in events(scheduler, job_id) if t == S.JOB_EVENT_TYPE_STRAGGLER]
    assert len(stragglers) == 1 and f"worker {slow} marked degraded" in stragglers[0]
    clock.now += 2.0
    scheduler.run_round()
    moving = [m for t, m in events(scheduler, job_id) if t == S.JOB_EVENT_TYPE_RESCALING]
    assert moving == [f"moving to a new placement, off degraded worker {slow}"]
    why = scheduler.get(job_id).reason  # round/why.py: the move's reason
    assert why is not None and why.code == "degraded_worker" and why.facts == {"workers": slow}
    wait_until(lambda: not scheduler.state.stopping, 10.0, "the old tasks stopped")
    clock.now += 2.0
    scheduler.run_round()
    now_on = {p.worker_id for p in scheduler.get(job_id).placement.processes}
    assert now_on == {"a", "b", "c"} - {slow}
    clock.now += POLICY.clear_seconds
    scheduler.run_round()
    assert degraded(scheduler) == {}  # tried again after --straggler-clear-seconds


def test_with_no_other_placement_the_job_stays_and_normal_reports_clear_the_mark(
    made: tuple[Scheduler, SimulatedAgents], clock: Clock
) -> None:
    scheduler, agents = made
    for worker in ("a", "b"):
        register(scheduler, worker, {"cpu": 1})
    job_id, tasks = start_job(scheduler, agents)
    report(scheduler, job_id, tasks, 5, {"a": 0.1, "b": 0.4})
    report(scheduler, job_id, tasks, 10, {"a": 0.1, "b": 0.4})
    assert set(degraded(scheduler)) == {"b"}
    clock.now += 2.0
    scheduler.run_round()
    assert len(agents.started) == 2  # nowhere else to go: it stays, no restart
    assert all(t != S.JOB_EVENT_TYPE_RESCALING for t, _ in events(scheduler, job_id))
    report(scheduler, job_id, tasks, 15, {"a": 0.1, "b": 0.1})
    assert set(degraded(scheduler)) == {"b"}  # one normal report of the two it takes
    report(scheduler, job_id, tasks, 20, {"a": 0.1, "b": 0.1})
    assert degraded(scheduler) == {}


def test_a_one_process_job_never_marks_its_worker(
    made: tuple[Scheduler, SimulatedAgents],
) -> None:
    scheduler, agents = made
    register(scheduler, "a", {"cpu": 1})
    job, _ = scheduler.submit(job_spec("one", 1), "")
    scheduler.run_round()
    task_id = agents.started[-1].task_id
    for step in range(5, 50, 5):
        timing = C.ProcessTiming(rank=0, step=step, compute_seconds_per_step=9.0, ests=1)
        status = C.TaskStatus(
            task_id=task_id, job_id=job.job_id, state=C.TASK_STATE_RUNNING,
            process_timings=[timing],
        )  # fmt: skip
        scheduler.heartbeat("a", [status])
    assert degraded(scheduler) == {}
