"""What a round derives from workers and placements is kept per object (views.py), which
holds only because those objects are replaced, never changed in place: a reader outside
the scheduler's lock (a round's gather, GetClusterState) then always reads a whole one."""

from __future__ import annotations

import threading

from gearshift.scheduler.round.views import HeldAssignments, LiveDevices, assignment_of
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.state.records import JobRecord, TaskRecord, WorkerRecord
from gearshift.scheduler.types import Device
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.helpers import wait_until
from tests.sched_harness import Clock, job_spec, make_scheduler, register

C = common_pb2
S = scheduler_pb2


def worker(worker_id: str, count: int, *, alive: bool = True) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        address="10.0.0.1:1",
        hostname="h",
        devices=[C.DeviceGroup(accelerator_type="k80", count=count)],
        alive=alive,
        registered_at=0.0,
        last_heartbeat_at=0.0,
    )


def placement(*ranks: tuple[str, int, int]) -> C.Placement:
    out = C.Placement()
    for rank, (worker_id, index, ests) in enumerate(ranks):
        out.processes.add(
            rank=rank,
            worker_id=worker_id,
            device_index=index,
            accelerator_type="k80",
            est_ids=list(range(ests)),
        )
    return out


def test_live_devices_are_rebuilt_when_a_worker_is_replaced_or_lost_and_kept_otherwise() -> None:
    devices = LiveDevices()
    workers = {"b": worker("b", 1), "a": worker("a", 2)}
    first = devices.of(workers.values())
    assert first == (Device("a", 0, "k80"), Device("a", 1, "k80"), Device("b", 0, "k80"))
    assert devices.of(workers.values()) is first  # nothing changed: the same tuple
    workers["a"] = worker("a", 1)  # registered again with fewer devices
    assert devices.of(workers.values()) == (Device("a", 0, "k80"), Device("b", 0, "k80"))
    workers["b"].alive = False  # lost: its record stays, changed
    assert devices.of(workers.values()) == (Device("a", 0, "k80"),)


def test_a_held_assignment_is_kept_per_placement_object() -> None:
    held = HeldAssignments()
    job = JobRecord(job_id="j", spec=C.JobSpec(), state=C.JOB_STATE_RUNNING, submitted_at=0.0)
    job.placement = placement(("w", 1, 2), ("v", 0, 2))
    first = held.of(job)
    assert first == [(Device("w", 1, "k80"), 2), (Device("v", 0, "k80"), 2)]
    assert held.of(job) is first
    job.placement = placement(("w", 0, 4))  # a new placement: worked out again
    assert held.of(job) == [(Device("w", 0, "k80"), 4)] == assignment_of(job.placement)
    held.forget("j")
    assert held.of(job) is not first


def test_placements_are_replaced_never_changed_through_start_requeue_and_end() -> None:
    """Fails if a placement is changed in place again (a reader outside the lock would see
    half of one, and views.py would keep an assignment for a placement that moved)."""
    clock = Clock()
    settings = SchedulerSettings(policy="las", round_seconds=60.0, heartbeat_timeout=1e9)
    scheduler, _ = make_scheduler(settings, clock=clock)
    try:
        register(scheduler, "w1", {"k80": 2})
        job, _ = scheduler.submit(job_spec("a", 2), "")
        scheduler.run_round()
        started = job.placement
        kept = started.SerializeToString()
        assert len(started.processes) == 2 and job.state == C.JOB_STATE_RUNNING
        with scheduler.state.lock:
            scheduler.state.requeue(job, S.JOB_EVENT_TYPE_PREEMPTED, "test")
        assert job.placement is not started and not job.placement.processes
        assert started.SerializeToString() == kept  # the old one is as it was
        scheduler.run_round()
        again = job.placement
        assert again is not started and len(again.processes) == 2
        scheduler.cancel(job.job_id, "test")
        assert started.SerializeToString() == kept and len(again.processes) == 2
    finally:
        scheduler.stop()


def one_running_job() -> tuple[Scheduler, JobRecord, TaskRecord]:
    """A scheduler (in-memory store) running one job of one task."""
    settings = SchedulerSettings(policy="las", round_seconds=60.0, heartbeat_timeout=1e9)
    scheduler, _ = make_scheduler(settings, clock=Clock())
    register(scheduler, "w1", {"k80": 1})
    job, _ = scheduler.submit(job_spec("a", 1), "")
    scheduler.run_round()
    return scheduler, job, next(iter(scheduler.state.tasks.values()))


def hold_commits(scheduler: Scheduler) -> threading.Event:
    """From now on every commit of the scheduler's store waits until the event is set (a
    slow disk, or a commit still in flight when the scheduler is killed)."""
    store = scheduler.state.store
    disk = threading.Event()
    commit = store._commit  # type: ignore[attr-defined]

    def slow_commit(rows: object) -> None:
        assert disk.wait(30), "the test never let the commit through"
        commit(rows)

    store._commit = slow_commit  # type: ignore[attr-defined]
    return disk


def test_a_job_that_ended_while_its_commit_waits_is_read_as_ended() -> None:
    """The hold that ends a job commits after letting the lock go (Store.locked_batch): a
    GetJob or WatchJob that finds the job gone from memory waits for that commit instead
    of answering from the database's older row (RUNNING) or stopping before the last event."""
    scheduler, job, task = one_running_job()
    try:
        seen = scheduler.get(job.job_id).last_sequence
        disk = hold_commits(scheduler)
        done = C.TaskStatus(
            task_id=task.task_id, job_id=job.job_id, state=C.TASK_STATE_COMPLETED, exit_code=0
        )
        ender = threading.Thread(target=scheduler.task_finished, args=(task.worker_id, done))
        ender.start()
        wait_until(lambda: job.job_id not in scheduler.state.jobs, 10, "the job never ended")
        got: list[int] = []
        watched: list[int] = []
        getter = threading.Thread(target=lambda: got.append(scheduler.get(job.job_id).state))
        watcher = threading.Thread(
            target=lambda: watched.extend(
                e.type for e in scheduler.watch(job.job_id, seen, lambda: True)
            )
        )
        getter.start()
        watcher.start()
        disk.set()
        for thread in (ender, getter, watcher):
            thread.join(30)
        assert got == [C.JOB_STATE_SUCCEEDED]
        assert watched and watched[-1] == S.JOB_EVENT_TYPE_SUCCEEDED
    finally:
        scheduler.stop()


def test_get_job_answers_only_what_is_committed() -> None:
    """A hold's writes commit after it lets the lock go: GetJob, which reads memory, waits
    for them, so no state a client was shown can be taken back by a crash (a job shown
    RUNNING, the scheduler killed before the commit: it came back QUEUED, and its task's
    failure was no longer counted against --max-restarts)."""
    scheduler, job, task = one_running_job()
    store = scheduler.state.store
    try:
        disk = hold_commits(scheduler)
        failed = C.TaskStatus(task_id=task.task_id, job_id=job.job_id, state=C.TASK_STATE_FAILED)
        failer = threading.Thread(target=scheduler.task_finished, args=(task.worker_id, failed))
        failer.start()
        wait_until(lambda: job.state == C.JOB_STATE_QUEUED, 10, "the job was never requeued")
        seen: list[tuple[int, int]] = []

        def get() -> None:
            shown = scheduler.get(job.job_id).state
            stored = store.get_job(job.job_id)
            seen.append((shown, stored.state if stored else -1))

        getter = threading.Thread(target=get)
        getter.start()
        getter.join(1.0)  # without the wait it answers now, while the commit is held
        disk.set()
        for thread in (failer, getter):
            thread.join(30)
        assert seen == [(C.JOB_STATE_QUEUED, C.JOB_STATE_QUEUED)]
    finally:
        scheduler.stop()
