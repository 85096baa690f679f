"""The daemon's round on its own wiring (in-memory store, simulated workers, a manual clock):
it never dies, sees types that join late, keeps D1 jobs on one type, and reasons with
estimates that measurements and the Brain keep fresh."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from gearshift.common.errors import ValidationError
from gearshift.common.jobspec import with_defaults
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.round.rounds import ROUND_PHASES
from gearshift.scheduler.round.task_control import RENDEZVOUS_PORTS
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.state.records import TaskRecord
from gearshift.scheduler.types import Snapshot, Target
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.helpers import wait_until
from tests.sched_harness import (
    Clock,
    SimulatedAgents,
    TableBrain,
    job_spec,
    make_scheduler,
    register,
)

C = common_pb2
S = scheduler_pb2


def settings(policy: str = "las", **fields: object) -> SchedulerSettings:
    base: dict[str, object] = {
        "policy": policy,
        "round_seconds": 60.0,
        "heartbeat_interval": 1.0,
        "heartbeat_timeout": 5.0,
    }
    base.update(fields)
    return SchedulerSettings(**base)  # type: ignore[arg-type]


def placement_types(scheduler: object, job_id: str) -> list[str]:
    job = scheduler.get(job_id)  # type: ignore[attr-defined]
    return [p.accelerator_type for p in job.placement.processes]


@pytest.mark.parametrize("elastic", [False, True])
def test_a_lost_gpu_worker_does_not_kill_the_rounds(elastic: bool) -> None:
    """A job limited to `gpu`, workers of types gpu and cpu, the gpu worker goes silent: the
    round that declares it lost has nothing the job can run on, and answers nothing to run
    (Gavel's LP there would be unbounded)."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(elastic=elastic), clock=clock)
    try:
        register(scheduler, "gpu-box", {"gpu": 1})
        register(scheduler, "cpu-box", {"cpu": 2})
        job, _ = scheduler.submit(job_spec("train", 1, accelerator_types=["gpu"]), "")
        scheduler.run_round()
        assert placement_types(scheduler, job.job_id) == ["gpu"]
        clock.now += 10.0
        scheduler.heartbeat("cpu-box", [])
        report = scheduler.run_round()  # declares gpu-box lost, then allocates
        assert report.lost_workers == ["gpu-box"]
        assert scheduler.get(job.job_id).state == C.JOB_STATE_QUEUED
        clock.now += 60.0
        scheduler.heartbeat("cpu-box", [])
        assert scheduler.run_round().started == []
        register(scheduler, "gpu-box", {"gpu": 1})  # back: the job runs again
        assert scheduler.run_round().started == [job.job_id]
    finally:
        scheduler.stop()


class FlakyAllocator:
    """Raises on its first call, then allocates nothing."""

    name = "flaky"
    replans_on_events = True

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        with self.lock:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("a policy that breaks once")
        return {}


def test_a_round_reports_how_long_each_phase_took() -> None:
    """Every phase, in order, timed; the Prometheus histogram gets each one (what the
    dashboard's round phases panel and bench/load.py show)."""

    def observed(phase: str) -> float:
        value = REGISTRY.get_sample_value(
            "gearshift_scheduler_round_phase_seconds_count", {"phase": phase}
        )
        return value or 0.0

    scheduler, _ = make_scheduler(settings(), clock=Clock())
    try:
        register(scheduler, "a", {"v100": 1})
        scheduler.submit(job_spec("one", 1), "")
        before = {phase: observed(phase) for phase in ROUND_PHASES}
        report = scheduler.run_round()  # its observers include metrics.round_finished
    finally:
        scheduler.stop()
    assert report.started
    assert tuple(report.phases) == ROUND_PHASES
    assert all(seconds >= 0 for seconds in report.phases.values())
    assert {phase: observed(phase) - before[phase] for phase in ROUND_PHASES} == dict.fromkeys(
        ROUND_PHASES, 1.0
    )


def test_a_round_that_raises_does_not_stop_the_loop() -> None:
    flaky = FlakyAllocator()
    scheduler, _ = make_scheduler(settings(round_seconds=0.05), clock=Clock(), allocator=flaky)
    real_clock = __import__("time").monotonic
    scheduler.state.clock = real_clock  # the loop waits on real time
    try:
        scheduler.start()
        scheduler.wake()
        wait_until(lambda: flaky.calls >= 2, 10.0, "a second round after the one that raised")
    finally:
        scheduler.stop()


def test_a_task_its_restarted_worker_no_longer_lists_is_rescheduled() -> None:
    """A worker daemon restarted within the heartbeat timeout registers again under its id
    without the task it ran: the task is gone once the timeout passes (a start may be in
    flight before that), and its job runs again; a task still listed stays."""
    clock = Clock()
    scheduler, agents = make_scheduler(settings(), clock=clock)
    try:
        register(scheduler, "a", {"t4": 1})
        register(scheduler, "b", {"t4": 1})
        lost, _ = scheduler.submit(job_spec("lost", 1), "")
        kept, _ = scheduler.submit(job_spec("kept", 1), "")
        scheduler.run_round()
        on = {r.job_id: r.placement.processes[0].worker_id for r in agents.started}
        running = {r.job_id: r.task_id for r in agents.started}
        restarted = on[lost.job_id]
        other = on[kept.job_id]
        clock.now += 2.0
        register(scheduler, restarted, {"t4": 1})  # back at once, with no task
        listed = common_pb2.TaskStatus(
            task_id=running[kept.job_id], job_id=kept.job_id, state=C.TASK_STATE_RUNNING
        )
        for _ in range(6):  # heartbeats past the 5 s timeout
            clock.now += 1.0
            assert not scheduler.heartbeat(restarted, [])
            assert not scheduler.heartbeat(other, [listed])
        report = scheduler.run_round()
        assert lost.job_id in report.started, report
        assert scheduler.get(kept.job_id).state == C.JOB_STATE_RUNNING
        messages = [e.message for e in scheduler.state.store.events_after(lost.job_id, 0)]
        assert any("no longer runs the job's task" in m for m in messages), messages
    finally:
        scheduler.stop()


def test_a_running_job_left_without_tasks_is_requeued() -> None:
    """A scheduler stopped between saving a task's end and its job's requeue comes back with
    the job running and no task: after the heartbeat timeout it runs again."""
    clock = Clock()
    scheduler, agents = make_scheduler(settings(), clock=clock)
    try:
        register(scheduler, "a", {"t4": 1})
        job, _ = scheduler.submit(job_spec("orphan", 1), "")
        assert scheduler.run_round().started == [job.job_id]
        with scheduler.state.lock:  # what recovery finds after such a crash
            scheduler.state.tasks.clear()
        for step in range(7):
            clock.now += 1.0
            scheduler.heartbeat("a", [])
            report = scheduler.run_round()
            if step < 4:  # within the 5 s heartbeat timeout: left alone
                assert scheduler.get(job.job_id).state == C.JOB_STATE_RUNNING
        assert len(agents.started) == 2, "started again"
        assert scheduler.get(job.job_id).state == C.JOB_STATE_RUNNING
        messages = [e.message for e in scheduler.state.store.events_after(job.job_id, 0)]
        assert any("no task of the job runs" in m for m in messages), (messages, report)
    finally:
        scheduler.stop()


def test_jobs_on_two_workers_of_one_host_get_different_rendezvous_ports() -> None:
    """Ports are per host, not per worker: two worker daemons on one machine once got the
    same port for two jobs, and a process of one joined the other's group."""
    scheduler, agents = make_scheduler(settings(), clock=Clock())
    try:
        register(scheduler, "a", {"t4": 2})  # both at 127.0.0.1
        register(scheduler, "b", {"t4": 2})
        for name in ("x", "y"):
            spec = job_spec(name, 2)
            spec.elastic.min_devices = 2
            scheduler.submit(spec, "")
        scheduler.run_round()
        by_job = {r.job_id: r.rendezvous_address for r in agents.started}
        workers = {r.job_id: {p.worker_id for p in r.placement.processes} for r in agents.started}
        assert len(by_job) == 2 and all(len(w) == 1 for w in workers.values()), workers
        assert len(set(by_job.values())) == 2, by_job
    finally:
        scheduler.stop()


def test_a_burst_of_submissions_makes_few_rounds_not_one_each() -> None:
    """Elastic LAS re-plans on events, but a round waits `event_round_gap` after the last one
    ended: 40 submissions in a burst make a handful of rounds, and the last job still starts
    without waiting for the round boundary (an hour here)."""
    rounds: list[int] = []
    scheduler, _ = make_scheduler(
        settings(elastic=True, round_seconds=3600.0, event_round_gap=0.3), clock=Clock()
    )
    scheduler.state.clock = __import__("time").monotonic  # the loop waits on real time
    scheduler.rounds.observers.append(lambda report, _seconds: rounds.append(report.round))
    try:
        register(scheduler, "box", {"t4": 64})
        scheduler.start()
        started = scheduler.state.clock()
        jobs = [scheduler.submit(job_spec(f"j{i}", 1), "")[0] for i in range(40)]
        burst = scheduler.state.clock() - started
        wait_until(
            lambda: scheduler.get(jobs[-1].job_id).state == C.JOB_STATE_RUNNING,
            10.0,
            "the last job of the burst starts",
        )
        assert len(rounds) <= 2 + burst / 0.3, (rounds, burst)
    finally:
        scheduler.stop()


@pytest.mark.parametrize("event_rounds", ["always", "free-devices"])
def test_free_devices_event_rounds_leave_a_full_cluster_to_the_boundary(event_rounds: str) -> None:
    """With --event-rounds free-devices an arrival at a full cluster asks for no round (it
    would move running jobs for every arrival): the new job waits for the boundary, an hour
    here, or for a device to free up; with 'always' elastic LAS shares at once."""
    rounds: list[int] = []
    quick = settings(
        elastic=True, round_seconds=3600.0, event_round_gap=0.05, event_rounds=event_rounds
    )
    scheduler, _ = make_scheduler(quick, clock=Clock())
    scheduler.state.clock = __import__("time").monotonic  # the loop waits on real time
    scheduler.rounds.observers.append(lambda report, _seconds: rounds.append(report.round))
    try:
        register(scheduler, "box", {"t4": 2})
        scheduler.start()
        first, _ = scheduler.submit(job_spec("first", 2), "")
        wait_until(lambda: len(placement_types(scheduler, first.job_id)) == 2, 10.0, "first on 2")
        second, _ = scheduler.submit(job_spec("second", 2), "")
        if event_rounds == "always":
            wait_until(
                lambda: scheduler.get(second.job_id).state == C.JOB_STATE_RUNNING,
                10.0,
                "the arrival shares the cluster at once",
            )
            return
        wait_until(lambda: scheduler.rounds._early_refused_at > 0, 10.0, "the early round refused")
        ran = len(rounds)
        assert scheduler.get(second.job_id).state == C.JOB_STATE_QUEUED
        scheduler.cancel(first.job_id, "test")  # its devices free up: an event round again
        wait_until(
            lambda: scheduler.get(second.job_id).state == C.JOB_STATE_RUNNING,
            10.0,
            "the waiting job starts once a device is free",
        )
        # The round's observers hear of it after its placements are out: wait for them too.
        wait_until(lambda: len(rounds) > ran, 10.0, "the event round that started it")
    finally:
        scheduler.stop()


def test_starts_over_the_bound_are_left_to_the_next_round_in_the_decisions_order() -> None:
    """--max-starts-per-round 2: five queued jobs that all fit start two a round, in the
    order the decision gave them; each round that left some asks for the next at once."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(elastic=True, max_starts_per_round=2), clock=clock)
    try:
        register(scheduler, "box", {"t4": 8})
        jobs = [scheduler.submit(job_spec(f"j{i}", 1), "")[0].job_id for i in range(5)]
        started: list[str] = []
        for expected, left in ((2, 3), (2, 1), (1, 0)):
            clock.now += 1.0
            report = scheduler.run_round()
            assert len(report.started) == expected and report.deferred == left
            assert list(report.desired)[: len(started) + expected][len(started) :] == report.started
            started += report.started
            assert scheduler.rounds._wake.is_set() == bool(left)  # the next round, asked for
            scheduler.rounds._wake.clear()
        assert sorted(started) == sorted(jobs)
        assert all(scheduler.get(j).state == C.JOB_STATE_RUNNING for j in jobs)
    finally:
        scheduler.stop()


def test_a_preemption_that_only_made_room_for_a_left_start_waits_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two new jobs take the devices of two running ones (LAS: new jobs first), one start a
    round: one running job is preempted for the start, the other runs on (renewed, not
    restarted for a new plan: the decision did not place it); the next round starts the
    second new job and preempts one for it."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(elastic=True, max_starts_per_round=1), clock=clock)
    try:
        register(scheduler, "box", {"t4": 2})
        old = [scheduler.submit(job_spec(f"old{i}", 1), "")[0].job_id for i in range(2)]
        assert len(scheduler.run_round().started) == 1
        clock.now += 1.0
        assert len(scheduler.run_round().started) == 1
        new = [scheduler.submit(job_spec(f"new{i}", 1), "")[0].job_id for i in range(2)]
        clock.now += 1.0
        scheduler.heartbeat("box", [])
        monkeypatch.setattr(scheduler.rounds, "_restart_reason", lambda job_id: "a new plan")
        report = scheduler.run_round()
        assert (len(report.started), len(report.preempted), report.deferred) == (1, 1, 1)
        assert report.rescaled == []
        assert set(report.started) < set(new) and set(report.preempted) < set(old)
        (kept,) = set(old) - set(report.preempted)
        assert kept in report.renewed
        assert scheduler.get(kept).state == C.JOB_STATE_RUNNING
        clock.now += 1.0
        second = sorted(set(new) - set(report.started))
        report = scheduler.run_round()
        assert (report.started, len(report.preempted), report.deferred) == (second, 1, 0)
    finally:
        scheduler.stop()


def test_left_starts_do_not_wait_for_a_gavel_rounds_boundary() -> None:
    """Gavel's rigid rounds run early only while nothing runs; a round that left starts
    is followed at once all the same (an hour's boundary here)."""
    quick = settings(round_seconds=3600.0, event_round_gap=0.05, max_starts_per_round=1)
    scheduler, _ = make_scheduler(quick, clock=Clock())
    scheduler.state.clock = __import__("time").monotonic  # the loop waits on real time
    try:
        register(scheduler, "box", {"t4": 4})
        jobs = [scheduler.submit(job_spec(f"j{i}", 1), "")[0].job_id for i in range(3)]
        scheduler.start()
        wait_until(
            lambda: all(scheduler.get(j).state == C.JOB_STATE_RUNNING for j in jobs),
            10.0,
            "the three jobs start, one a round, without waiting for the boundary",
        )
    finally:
        scheduler.stop()


@pytest.mark.parametrize(
    ("policy", "elastic"), [("las", False), ("las", True), ("easyscale", False)]
)
def test_a_job_submitted_before_any_worker_runs_when_one_joins(policy: str, elastic: bool) -> None:
    clock = Clock()
    scheduler, _ = make_scheduler(settings(policy, elastic=elastic), clock=clock)
    try:
        early, _ = scheduler.submit(job_spec("early", 2), "")
        assert scheduler.run_round().started == []  # no worker, no type
        register(scheduler, "late", {"t4": 2})
        clock.now += 1.0
        assert scheduler.run_round().started == [early.job_id]
        assert placement_types(scheduler, early.job_id)[0] == "t4"
    finally:
        scheduler.stop()


def test_a_d1_job_keeps_its_first_type_and_a_d2_job_may_mix() -> None:
    """D1 keeps bits on one kind of device only: once placed on v100 a D1 job never runs on
    t4, even when only t4 devices are free; a D2 job of 3 ESTs spreads over all three."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings("easyscale"), clock=clock)
    try:
        register(scheduler, "a", {"v100": 1})
        d1, _ = scheduler.submit(job_spec("d1", 2, determinism=C.DETERMINISM_LEVEL_D1), "")
        scheduler.run_round()
        assert placement_types(scheduler, d1.job_id) == ["v100"]
        assert scheduler.get(d1.job_id).locked_type == "v100"
        register(scheduler, "b", {"t4": 2})
        clock.now += 1.0
        scheduler.run_round()
        assert set(placement_types(scheduler, d1.job_id)) == {"v100"}
        d2, _ = scheduler.submit(job_spec("d2", 3, determinism=C.DETERMINISM_LEVEL_D2), "")
        scheduler.cancel(d1.job_id, "make room")
        clock.now += 1.0
        scheduler.run_round()
        assert set(placement_types(scheduler, d2.job_id)) == {"v100", "t4"}
    finally:
        scheduler.stop()


def test_measured_throughput_feeds_the_est_planner() -> None:
    """Without a Brain every type looks alike. The job (D2, 4 ESTs) runs on the slow device
    alone (0.25 global steps/s: 1 EST-step/s per device), then on the fast one alone (0.75:
    3); back on both, the planner gives the fast device 3 ESTs and the slow one 1."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings("easyscale"), clock=clock)

    def report(steps_per_second: float) -> None:
        (task,) = list(scheduler.state.tasks.values())
        progress = C.JobProgress(step=10, samples_per_second=steps_per_second * 32)
        status = C.TaskStatus(
            task_id=task.task_id, job_id=job.job_id, state=C.TASK_STATE_RUNNING, progress=progress
        )
        assert not scheduler.heartbeat(task.worker_id, [status])

    try:
        register(scheduler, "slow-box", {"slow": 1})
        job, _ = scheduler.submit(job_spec("mix", 4, determinism=C.DETERMINISM_LEVEL_D2), "")
        scheduler.run_round()
        report(0.25)
        clock.now += 10.0  # slow-box falls silent; fast-box joins
        register(scheduler, "fast-box", {"fast": 1})
        scheduler.run_round()
        assert placement_types(scheduler, job.job_id) == ["fast"]
        report(0.75)
        record = scheduler.get(job.job_id)
        assert scheduler.estimates.capability(record, ["fast", "slow"]) == {
            "fast": pytest.approx(3.0),
            "slow": pytest.approx(1.0),
        }
        register(scheduler, "slow-box", {"slow": 1})
        clock.now += 1.0
        scheduler.run_round()
        placement = scheduler.get(job.job_id).placement
        split = {p.accelerator_type: len(p.est_ids) for p in placement.processes}
        assert split == {"fast": 3, "slow": 1}
    finally:
        scheduler.stop()


def beat(scheduler: Scheduler, task: TaskRecord, **progress: Any) -> None:
    """The heartbeat of the task's worker, listing the task with that progress."""
    status = C.TaskStatus(
        task_id=task.task_id,
        job_id=task.job_id,
        state=C.TASK_STATE_RUNNING,
        progress=C.JobProgress(total_steps=1000, **progress),
    )
    assert not scheduler.heartbeat(task.worker_id, [status])


def count_events(scheduler: Scheduler, job_id: str, kind: int) -> int:
    return sum(e.type == kind for e in scheduler.state.store.events_after(job_id, 0))


def test_a_relays_batch_of_heartbeats_is_applied_in_one_hold_with_one_commit() -> None:
    """HeartbeatBatch: each worker's liveness and task reports as its own heartbeat would
    apply them, an unknown worker told to register again, in one hold of the lock and one
    commit (a heartbeat that changed nothing durable commits nothing)."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings("easyscale"), clock=clock)
    try:
        register(scheduler, "a", {"t4": 1})
        register(scheduler, "b", {"t4": 1})
        one, _ = scheduler.submit(job_spec("one", 1), "")
        two, _ = scheduler.submit(job_spec("two", 1), "")
        scheduler.run_round()
        by_job = {t.job_id: t for t in scheduler.state.tasks.values()}
        order = scheduler.state.store._order  # type: ignore[attr-defined]
        taken = order._taken
        clock.now += 5.0
        running = C.TaskStatus(
            task_id=by_job[one.job_id].task_id, job_id=one.job_id, state=C.TASK_STATE_RUNNING
        )
        assert scheduler.heartbeats([("a", []), ("b", [])]) == [False, False]
        assert order._taken == taken  # nothing durable changed: no commit
        done = C.TaskStatus(
            task_id=by_job[two.job_id].task_id, job_id=two.job_id, state=C.TASK_STATE_COMPLETED
        )
        beats = [
            (by_job[one.job_id].worker_id, [running]),
            ("nobody", []),
            (by_job[two.job_id].worker_id, [done]),
        ]
        assert scheduler.heartbeats(beats) == [False, True, False]
        assert order._taken == taken + 1  # the ended task and its job: one commit
        assert all(w.last_heartbeat_at == clock.now for w in scheduler.state.workers.values())
        assert scheduler.get(two.job_id).state == C.JOB_STATE_SUCCEEDED
        assert scheduler.get(one.job_id).state == C.JOB_STATE_RUNNING
    finally:
        scheduler.stop()


def test_the_heartbeat_carries_rank_0s_progress_to_the_job_and_the_estimates() -> None:
    """Progress takes one path, the workers' heartbeats. Rank 0's task's progress that
    advances the job updates it, feeds the measured throughput and is recorded as a PROGRESS
    event (throttled); the other task's (step 0) and steps the job already passed change
    nothing. A placement that started fresh says so once, before its first step, and its
    progress counts from its first step although the job had gone further."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings("easyscale"), clock=clock)
    try:
        register(scheduler, "a", {"t4": 1})
        register(scheduler, "b", {"t4": 1})
        job, _ = scheduler.submit(job_spec("p", 2), "")  # global batch 16
        scheduler.run_round()
        tasks = sorted(scheduler.state.tasks.values(), key=lambda t: 0 not in t.local_ranks)
        assert len(tasks) == 2, tasks
        rank0, other = tasks
        beat(scheduler, other, step=0)
        assert scheduler.get(job.job_id).progress.step == 0
        assert scheduler.estimates.marks([job.job_id])[job.job_id][0] == 0  # rates unchanged
        beat(scheduler, rank0, step=5, loss=0.5, samples_per_second=32.0)
        assert scheduler.get(job.job_id).progress.loss == 0.5
        record = scheduler.get(job.job_id)
        assert scheduler.estimates.capability(record, ["t4"]) == {"t4": pytest.approx(2.0)}
        clock.now += 1.0
        beat(scheduler, rank0, step=7, samples_per_second=32.0)
        beat(scheduler, rank0, step=6, samples_per_second=32.0)  # behind the job: not its
        assert scheduler.get(job.job_id).progress.step == 7
        assert count_events(scheduler, job.job_id, S.JOB_EVENT_TYPE_PROGRESS) == 1  # throttled

        failed = C.TaskStatus(task_id=other.task_id, job_id=job.job_id, state=C.TASK_STATE_FAILED)
        scheduler.task_finished(other.worker_id, failed)  # the job restarts
        wait_until(lambda: not scheduler.state.stopping, 10.0, "rank 0's task stopped")
        clock.now += 1.0
        scheduler.run_round()
        fresh = next(t for t in scheduler.state.tasks.values() if 0 in t.local_ranks)
        assert fresh.generation == 2
        for _ in range(2):
            beat(scheduler, fresh, step=0, started_fresh=True)
        assert count_events(scheduler, job.job_id, S.JOB_EVENT_TYPE_STARTED_FRESH) == 1
        assert scheduler.get(job.job_id).progress.step == 7
        beat(scheduler, fresh, step=2, started_fresh=True)
        assert scheduler.get(job.job_id).progress.step == 2
        assert count_events(scheduler, job.job_id, S.JOB_EVENT_TYPE_STARTED_FRESH) == 1
    finally:
        scheduler.stop()


class Unreachable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the worker cannot be reached"


class FailingStops(SimulatedAgents):
    """Workers whose StopTask fails (with `error`) once the test lets it go on."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def stop(
        self, address: str, task_id: str, *, checkpoint: bool, reason: str, timeout: float
    ) -> C.TaskStatus:
        self.entered.set()
        assert self.go_on.wait(10.0)
        raise self.error


@pytest.mark.parametrize("error", [Unreachable(), RuntimeError("a bug in the call")])
def test_a_stop_that_cannot_reach_the_worker_still_ends_through_the_lease(
    error: Exception,
) -> None:
    """StopTask is the one stop request and a lease only a fence: a task the scheduler holds
    for its worker keeps its lease, even while a stop is under way and its job is gone; once
    a StopTask fails, the task is given up all the same, and its worker's next renewal is
    refused (the worker then terminates it)."""
    clock = Clock()
    agents = FailingStops(error)
    scheduler, _ = make_scheduler(settings(), clock=clock, agents=agents)
    try:
        register(scheduler, "a", {"t4": 1})
        job, _ = scheduler.submit(job_spec("j", 1), "")
        scheduler.run_round()
        (task,) = scheduler.state.tasks.values()
        renewed, lease = scheduler.renew_lease("a", task.task_id)
        assert renewed and lease.expires_at == clock.now + scheduler.settings.lease_seconds
        assert scheduler.renew_lease("b", task.task_id) == (False, C.Lease(task_id=task.task_id))
        assert not scheduler.renew_lease("a", "job-x.g1.a")[0]
        scheduler.cancel(job.job_id, "")
        assert agents.entered.wait(10.0)
        clock.now += 1.0
        assert scheduler.renew_lease("a", task.task_id)[0]  # the stop is StopTask's
        agents.go_on.set()
        wait_until(lambda: not scheduler.state.stopping, 10.0, "the stop ended")
        assert scheduler.renew_lease("a", task.task_id) == (False, C.Lease(task_id=task.task_id))
        assert task.task_id not in scheduler.state.tasks and task.state == C.TASK_STATE_FAILED
    finally:
        scheduler.stop()


class OrderedAgents(SimulatedAgents):
    """Simulated workers that keep every call, starts and stops, in one list."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def start(self, address: str, request: Any) -> C.TaskStatus:
        self.calls.append("start " + request.task_id)
        return super().start(address, request)

    def stop(
        self, address: str, task_id: str, *, checkpoint: bool, reason: str, timeout: float
    ) -> C.TaskStatus:
        self.calls.append(f"stop {task_id} checkpoint={checkpoint}")
        return super().stop(address, task_id, checkpoint=checkpoint, reason=reason, timeout=timeout)


def test_an_earlier_placements_task_is_stopped_before_the_job_starts_again() -> None:
    """A scheduler stopped between requeuing a job and stopping its task comes back with both.
    The job must not run two placements at once (both would read and cover the same data
    holders and write the same checkpoint folder): the round that starts it again first
    stops the old task (StopTask, no checkpoint: the job resumes from its last one), then
    starts the new placement."""
    clock = Clock()
    agents = OrderedAgents()
    scheduler, _ = make_scheduler(settings(), clock=clock, agents=agents)
    try:
        register(scheduler, "a", {"t4": 2})
        job, _ = scheduler.submit(job_spec("j", 1), "")
        scheduler.run_round()
        (old,) = scheduler.state.tasks.values()
        with scheduler.state.lock:  # what recovery finds after such a crash
            scheduler.state.requeue(scheduler.get(job.job_id), S.JOB_EVENT_TYPE_PREEMPTED, "")
        scheduler.run_round()
        (new,) = scheduler.state.tasks.values()
        assert new.generation == old.generation + 1
        assert agents.calls == [
            f"start {old.task_id}",
            f"stop {old.task_id} checkpoint=False",
            f"start {new.task_id}",
        ]
        assert old.task_id not in scheduler.state.tasks and not scheduler.state.stopping
        assert scheduler.get(job.job_id).state == C.JOB_STATE_RUNNING
    finally:
        scheduler.stop()


def test_the_brains_estimates_are_asked_again_after_the_refresh_period() -> None:
    speeds = {"v100": 1.0}
    clock = Clock()
    brain = TableBrain(lambda job_id, kind, count: speeds[kind] * count)
    scheduler, _ = make_scheduler(
        settings("easyscale", estimate_refresh_seconds=30.0), clock=clock, brain=brain
    )
    try:
        register(scheduler, "a", {"v100": 1})
        job, _ = scheduler.submit(job_spec("j", 2), "")
        scheduler.run_round()
        asked = brain.asked
        assert asked > 0
        record = scheduler.get(job.job_id)
        assert scheduler.estimates.capability(record, ["v100"]) == {"v100": 2.0}
        clock.now += 4.0
        scheduler.heartbeat("a", [])
        scheduler.run_round()
        assert brain.asked == asked  # fresh enough
        speeds["v100"] = 2.0  # the Brain learned more
        for _ in range(8):  # 32 s more, heartbeating
            clock.now += 4.0
            scheduler.heartbeat("a", [])
        scheduler.run_round()
        assert brain.asked > asked
        assert scheduler.estimates.capability(record, ["v100"]) == {"v100": 4.0}
    finally:
        scheduler.stop()


def test_the_allocator_names() -> None:
    assert make_allocator("las", elastic=True).replans_on_events
    assert not make_allocator("las").replans_on_events
    assert scheduler_pb2.JobEventType.Name(scheduler_pb2.JOB_EVENT_TYPE_RESCALED)


def test_the_job_runs_its_plan_and_a_new_plan_is_an_event() -> None:
    """The scheduler sends the job's current plan (default: all off, one thread), refuses
    one the spec does not allow, and records the plan with the start that changes it."""
    scheduler, agents = make_scheduler(settings(), clock=Clock())
    try:
        register(scheduler, "a", {"t4": 2})
        spec = job_spec("p", 2)
        spec.plan_dimensions.gradient_checkpointing = True
        job_id = scheduler.submit(spec, "")[0].job_id
        scheduler.run_round()
        (first,) = agents.started
        assert first.plan == C.ExecutionPlan()
        assert "plan:" not in scheduler.state.store.events_after(job_id, 0)[-1].message
        job = scheduler.state.jobs[job_id]
        two_threads = C.ExecutionPlan(threads_per_process=2)
        with pytest.raises(ValidationError, match=r"plan\.threads_per_process: job 'p' runs"):
            scheduler.control.prepare_start(job, [], plan=two_threads)
        assert job.generation == 1  # nothing changed
        gc_on = C.ExecutionPlan(gradient_checkpointing=True)
        with scheduler.state.lock:
            scheduler.rounds._started(job, job.placement, gc_on, rescaled=True)
        last = scheduler.state.store.events_after(job_id, 0)[-1]
        assert last.type == S.JOB_EVENT_TYPE_RESCALED
        assert last.message.endswith("; plan: gc on, 1 thread"), last.message
        assert scheduler.get(job_id).plan == gc_on
    finally:
        scheduler.stop()


def test_a_placement_carries_its_generation_and_its_release_names_it() -> None:
    """StartTaskRequest.generation is the placement's (gN of its task id); the release of
    the holders of a placement that ended names that placement's generation (the task's;
    the job's last one when no task is left), so a late release is fenced off the next."""
    clock = Clock()
    scheduler, agents = make_scheduler(settings(), clock=clock)
    released: list[int] = []

    def record(job: object, reason: str, generation: int) -> None:
        released.append(generation)

    scheduler.state.release_holders = record  # type: ignore[method-assign]
    try:
        register(scheduler, "a", {"t4": 1})
        job, _ = scheduler.submit(job_spec("fenced", 1), "")
        scheduler.run_round()
        (first,) = agents.started
        assert first.generation == 1 and ".g1." in first.task_id
        failed = C.TaskStatus(task_id=first.task_id, job_id=job.job_id, state=C.TASK_STATE_FAILED)
        scheduler.task_finished("a", failed)
        assert released == [1]
        wait_until(lambda: not scheduler.state.stopping, 10.0, "the task stopped")
        clock.now += 1.0
        scheduler.run_round()
        second = agents.started[-1]
        assert second.generation == 2 and ".g2." in second.task_id
        with scheduler.state.lock:  # no task left to name the placement
            scheduler.state.tasks.clear()
        for _ in range(7):
            clock.now += 1.0
            scheduler.heartbeat("a", [])
            scheduler.run_round()
        assert released[:2] == [1, 2]
    finally:
        scheduler.stop()


def test_a_placements_holders_are_fenced_before_it_is_sent_out() -> None:
    """The holders of a dynamic-mode job are released at the new placement's generation
    before any StartTask, so an older placement still running anywhere cannot cover a
    read once the new one may read."""
    clock = Clock()
    agents = OrderedAgents()
    scheduler, _ = make_scheduler(settings(), clock=clock, agents=agents)

    def fence(job: object, generation: int) -> None:
        agents.calls.append(f"fence g{generation}")

    scheduler.state.fence_holders = fence  # type: ignore[method-assign]
    scheduler.state.has_holders = lambda job: True  # type: ignore[method-assign]
    try:
        register(scheduler, "a", {"t4": 1})
        job, _ = scheduler.submit(job_spec("fenced", 1), "")
        scheduler.run_round()
        (first,) = scheduler.state.tasks.values()
        with scheduler.state.lock:
            scheduler.state.requeue(scheduler.get(job.job_id), S.JOB_EVENT_TYPE_PREEMPTED, "")
        scheduler.run_round()
        (second,) = scheduler.state.tasks.values()
        assert agents.calls == [
            "fence g1",
            f"start {first.task_id}",
            f"stop {first.task_id} checkpoint=False",
            "fence g2",
            f"start {second.task_id}",
        ]
    finally:
        scheduler.stop()


def test_a_restarted_scheduler_keeps_a_ps_jobs_plan_and_its_pin() -> None:
    """`gearshift scale` pins a PS job's counts; the scheduler restarts (same store): the
    job still runs the pinned plan, without a restart, and the pin holds."""
    clock = Clock()
    scheduler, agents = make_scheduler(settings(), clock=clock)
    ps_spec = with_defaults(  # as SubmitJob completes it
        C.JobSpec(
            name="wide-deep",
            total_steps=1000,
            parameter_server=C.ParameterServerSpec(ps=1, workers=1, max_ps=4, max_workers=4),
        )
    )
    again = None
    try:
        register(scheduler, "a", {"t4": 1})
        job, _ = scheduler.submit(ps_spec, "")
        scheduler.run_round()
        assert agents.started[-1].ps_plan.ps == 1
        scheduler.scale(
            job.job_id, ps=2, workers=3, ps_cores=0, worker_cores=0, auto=False, who="admin"
        )
        clock.now += 1.0
        scheduler.run_round()  # the pin is a new shape: restarted with it
        assert (agents.started[-1].ps_plan.ps, agents.started[-1].ps_plan.workers) == (2, 3)
        starts = len(agents.started)
        scheduler.stop()

        again, _ = make_scheduler(settings(), clock=clock, store=scheduler.store, agents=agents)
        again.recover()
        ps_plans = again.ps_plans
        assert ps_plans.pinned(job.job_id)
        plan = ps_plans.plan(job.job_id)
        assert plan is not None and (plan.ps, plan.workers) == (2, 3)
        clock.now += 1.0
        register(again, "a", {"t4": 1})
        again.run_round()
        assert len(agents.started) == starts  # kept running: nothing to restart for
        assert again.get(job.job_id).state == C.JOB_STATE_RUNNING
        again.scale(job.job_id, ps=0, workers=0, ps_cores=0, worker_cores=0, auto=True, who="a")
        stored = again.store.get_job(job.job_id)
        assert stored is not None and stored.ps_pin == "" and stored.ps_plan != ""
    finally:
        scheduler.stop()
        if again is not None:
            again.stop()


def test_a_host_out_of_rendezvous_ports_leaves_the_job_queued_unchanged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every port of a host's rendezvous range held by a running job's rank 0: the next job
    is not started (one warning naming the host and the range, no traceback) and waits,
    its generation unchanged."""
    clock = Clock()
    scheduler, agents = make_scheduler(settings("fifo"), clock=clock)
    try:
        register(scheduler, "a", {"t4": RENDEZVOUS_PORTS + 1})
        jobs = [scheduler.submit(job_spec(f"j{i}", 1), "")[0] for i in range(RENDEZVOUS_PORTS + 1)]
        scheduler.run_round()  # the starts span several holds of the lock: one port index
        assert len(agents.started) == RENDEZVOUS_PORTS
        assert len({r.rendezvous_address for r in agents.started}) == RENDEZVOUS_PORTS
        (waiting,) = [j for j in jobs if scheduler.get(j.job_id).state == C.JOB_STATE_QUEUED]
        assert scheduler.get(waiting.job_id).generation == 0
        warned = [r for r in caplog.records if r.getMessage() == "job not started"]
        assert len(warned) == 1 and not warned[0].exc_info
        assert "no free rendezvous port on 127.0.0.1" in warned[0].__dict__["why"]
    finally:
        scheduler.stop()


@pytest.mark.parametrize("exempt", [60.0, 0.0])
def test_a_new_placement_is_kept_for_the_preempt_exempt_time(exempt: float) -> None:
    """Elastic LAS puts a new job first: b takes a device of a's at once, unless a's
    placement is younger than --preempt-exempt-seconds; then b waits until it is not."""
    clock = Clock()
    tuning = settings(elastic=True, heartbeat_timeout=1000.0, preempt_exempt_seconds=exempt)
    scheduler, agents = make_scheduler(tuning, clock=clock)
    try:
        register(scheduler, "w", {"t4": 2})
        a = scheduler.submit(job_spec("a", 2), "")[0].job_id
        scheduler.run_round()
        assert len(scheduler.get(a).placement.processes) == 2
        clock.now += 30.0
        b = scheduler.submit(job_spec("b", 2), "")[0].job_id
        scheduler.run_round()
        ran = {r.job_id for r in agents.started}
        assert (b in ran) == (exempt == 0.0), ran
        if exempt:
            assert len(scheduler.get(a).placement.processes) == 2
            clock.now += 31.0  # a's placement is 61 s old now
            scheduler.run_round()
            assert b in {r.job_id for r in agents.started}
    finally:
        scheduler.stop()


def test_a_task_whose_processes_left_in_place_ends_only_that_task() -> None:
    """TASK_STATE_LEFT (an in-place change took its processes' ESTs elsewhere): the task's
    record closes, the job runs on: not completed, not failed, not requeued."""
    scheduler, agents = make_scheduler(settings(), clock=Clock())
    try:
        register(scheduler, "a", {"t4": 1})
        job, _ = scheduler.submit(job_spec("left", 1), "")
        scheduler.run_round()
        (task,) = agents.started
        left = C.TaskStatus(task_id=task.task_id, job_id=job.job_id, state=C.TASK_STATE_LEFT)
        scheduler.task_finished("a", left)
        assert task.task_id not in scheduler.state.tasks
        record = scheduler.get(job.job_id)
        assert record.state == C.JOB_STATE_RUNNING and not record.final_digest
    finally:
        scheduler.stop()
