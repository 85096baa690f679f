"""The rounds' in-place path (round.rescaleInPlace) on the daemon's wiring with simulated
workers: a shrink and a grow that keep devices change membership instead of restarting, the
task records follow the ranks, a refused change restarts the job in the same round, and a
job that keeps no device restarts as before."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.v1 import common_pb2, worker_pb2
from tests.sched_harness import Clock, SimulatedAgents, job_spec, make_scheduler, register

C = common_pb2


class Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "refused by the test"


@pytest.fixture
def cluster() -> Iterator[tuple[Scheduler, SimulatedAgents, Clock]]:
    clock = Clock()
    settings = SchedulerSettings(
        policy="easyscale", round_seconds=60.0, rescale_in_place=True, restart_seconds=0.0
    )
    scheduler, agents = make_scheduler(settings, clock=clock)
    register(scheduler, "a", {"t4": 2})
    register(scheduler, "b", {"t4": 2})
    try:
        yield scheduler, agents, clock
    finally:
        scheduler.stop()


def _running(scheduler: Scheduler, job_id: str) -> None:
    """Every open task of the job reports RUNNING (as its worker's heartbeat would)."""
    for task in scheduler.state.open_tasks(job_id):
        status = C.TaskStatus(task_id=task.task_id, job_id=job_id, state=C.TASK_STATE_RUNNING)
        scheduler.heartbeat(task.worker_id, [status])


def _big_on_four(scheduler: Scheduler, agents: SimulatedAgents) -> str:
    job, _ = scheduler.submit(job_spec("big", 4), "")
    scheduler.run_round()
    assert len(scheduler.get(job.job_id).placement.processes) == 4
    _running(scheduler, job.job_id)
    agents.started.clear()
    return job.job_id


def test_a_shrink_and_a_grow_that_keep_devices_go_in_place(
    cluster: tuple[Scheduler, SimulatedAgents, Clock],
) -> None:
    scheduler, agents, clock = cluster
    big = _big_on_four(scheduler, agents)
    before = {t.task_id: t.local_ranks for t in scheduler.state.open_tasks(big)}
    small, _ = scheduler.submit(job_spec("small", 1), "")
    clock.now += 1
    scheduler.run_round()
    job = scheduler.get(big)
    assert len(job.placement.processes) < 4 and job.state == C.JOB_STATE_RUNNING
    assert job.placement.membership_generation == 1
    # no stop, no restart: the change went to every running task of the job
    assert not [t for t, _ in agents.stopped if t in before]
    assert {r.task_id for r in agents.changed} == set(before)
    change = agents.changed[0].change
    assert change.generation == 1 and sum(change.mapping) == 4 and -1 not in change.sources
    started = [r.job_id for r in agents.started]
    assert started == [small.job_id]  # the newcomer; nothing of the big job's
    after = {t.task_id: t.local_ranks for t in scheduler.state.tasks.values() if t.job_id == big}
    kept = sorted(r for ranks in after.values() for r in ranks)
    assert kept == list(range(len(job.placement.processes)))
    assert () in after.values()  # a task whose processes all leave keeps no rank
    events = [e.message for e in scheduler.state.store.events_after(big, 0)]
    assert any("in place (generation 1:" in m for m in events), events
    # The newcomer leaves: the job grows back, the joiners started as such.
    scheduler.cancel(small.job_id, "leaving")
    _running(scheduler, big)
    agents.started.clear()
    agents.changed.clear()
    clock.now += 1
    scheduler.run_round()
    job = scheduler.get(big)
    assert len(job.placement.processes) == 4 and job.placement.membership_generation == 2
    joins = [r for r in agents.started if r.job_id == big]
    assert joins and all(r.join_generation == 2 and r.membership.generation == 2 for r in joins)
    assert all(r.task_id.endswith("-m2") and not r.resume for r in joins)
    assert {r.change.generation for r in agents.changed} == {2}


def test_a_refused_change_restarts_the_job_in_the_same_round(
    cluster: tuple[Scheduler, SimulatedAgents, Clock],
) -> None:
    scheduler, agents, clock = cluster

    def refuse(address: str, request: worker_pb2.ChangeMembershipRequest) -> C.TaskStatus:
        raise Refused()

    big = _big_on_four(scheduler, agents)
    running = {t.task_id for t in scheduler.state.open_tasks(big)}
    agents.change = refuse  # type: ignore[method-assign]
    scheduler.submit(job_spec("small", 1), "")
    clock.now += 1
    scheduler.run_round()
    job = scheduler.get(big)
    # stopped with a checkpoint and started anew: the restart path
    assert {t for t, checkpoint in agents.stopped if checkpoint} >= running
    assert job.generation == 2 and job.placement.membership_generation == 0
    assert [r.resume for r in agents.started if r.job_id == big] == [True] * len(
        {p.worker_id for p in job.placement.processes}
    )


def test_off_every_rescale_restarts() -> None:
    clock = Clock()
    scheduler, agents = make_scheduler(
        SchedulerSettings(policy="easyscale", round_seconds=60.0, restart_seconds=0.0), clock=clock
    )
    try:
        register(scheduler, "a", {"t4": 2})
        register(scheduler, "b", {"t4": 2})
        big = _big_on_four(scheduler, agents)
        scheduler.submit(job_spec("small", 1), "")
        clock.now += 1
        scheduler.run_round()
        assert not agents.changed and agents.stopped
        assert scheduler.get(big).generation == 2
    finally:
        scheduler.stop()
