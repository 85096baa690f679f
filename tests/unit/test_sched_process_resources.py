"""The scheduler gives each process its worker's share of cores and memory, and a job that
ran out of memory restarts with twice the memory (the harness's simulated workers)."""

from __future__ import annotations

from gearshift.scheduler.round.process_resources import cannot_fit, process_resources
from gearshift.scheduler.service import SchedulerSettings
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.helpers import wait_until
from tests.sched_harness import Clock, job_spec, make_scheduler

C = common_pb2
GIB = 1 << 30


def test_memory_doubles_per_factor_up_to_the_workers_whole() -> None:
    four = [C.DeviceGroup(accelerator_type="cpu", count=4)]
    assert process_resources(8, 16 * GIB, four, memory_factor=2) == (2, 8 * GIB)
    assert process_resources(8, 16 * GIB, four, memory_factor=8) == (2, 16 * GIB)


def test_start_requests_carry_the_share_and_an_oom_restart_doubles_the_memory() -> None:
    clock = Clock()
    settings = SchedulerSettings(policy="fifo", round_seconds=1.0)
    scheduler, agents = make_scheduler(settings, clock=clock)
    try:
        scheduler.register_worker(
            "a",
            "127.0.0.1:1001",
            "test",
            [C.DeviceGroup(accelerator_type="cpu", count=2)],
            [],
            cpu_cores=4,
            memory_bytes=8 * GIB,
        )
        job, _ = scheduler.submit(job_spec("m", 2), "")
        scheduler.run_round()
        first = agents.started[-1]
        assert (first.cpu_cores_per_process, first.memory_bytes_per_process) == (2, 4 * GIB)
        oom = C.TaskStatus(
            task_id=first.task_id,
            job_id=job.job_id,
            state=C.TASK_STATE_FAILED,
            exit_code=137,
            out_of_memory=True,
            message="out of memory: rank 0 killed by the worker's watchdog",
        )
        scheduler.task_finished("a", oom)
        wait_until(lambda: not scheduler.state.stopping, 10.0, "the job's tasks stopped")
        clock.now += 2.0
        scheduler.run_round()
        second = agents.started[-1]
        assert second.task_id != first.task_id
        assert (second.cpu_cores_per_process, second.memory_bytes_per_process) == (2, 8 * GIB)
        events = [e.message for e in scheduler.state.store.events_after(job.job_id, 0)]
        assert any("with 2x its memory share" in m for m in events), events
    finally:
        scheduler.stop()


def test_cannot_fit_only_with_the_largest_workers_whole_memory() -> None:
    assert cannot_fit(8 * GIB, [8 * GIB, 4 * GIB])
    assert not cannot_fit(4 * GIB, [8 * GIB, 4 * GIB])  # a larger worker is left
    assert not cannot_fit(0, [8 * GIB]) and not cannot_fit(8 * GIB, [])  # unknown memory


def test_a_job_out_of_memory_with_the_whole_worker_fails_saying_it_cannot_fit() -> None:
    clock = Clock()
    scheduler, agents = make_scheduler(
        SchedulerSettings(policy="fifo", round_seconds=1.0), clock=clock
    )
    try:
        scheduler.register_worker(
            "a",
            "127.0.0.1:1001",
            "test",
            [C.DeviceGroup(accelerator_type="cpu", count=2)],
            [],
            cpu_cores=4,
            memory_bytes=8 * GIB,
        )
        job, _ = scheduler.submit(job_spec("m", 2), "")
        for memory in (4 * GIB, 8 * GIB):  # the share, then doubled: the whole worker
            scheduler.run_round()
            started = agents.started[-1]
            assert started.memory_bytes_per_process == memory
            oom = C.TaskStatus(
                task_id=started.task_id,
                job_id=job.job_id,
                state=C.TASK_STATE_FAILED,
                exit_code=137,
                out_of_memory=True,
                message="out of memory: rank 0 killed by the worker's watchdog\nlog tail",
            )
            scheduler.task_finished("a", oom)
            wait_until(lambda: not scheduler.state.stopping, 10.0, "the job's tasks stopped")
            clock.now += 2.0
        events = scheduler.state.store.events_after(job.job_id, 0)
        restart = next(e.message for e in events if "memory share" in e.message)
        assert restart.splitlines()[0].endswith(
            "with 2x its memory share (8 GiB a process on a, was 4 GiB) (restart 1 of 3)"
        ), restart
        assert restart.splitlines()[1] == "log tail"
        last = events[-1]
        assert last.type == scheduler_pb2.JOB_EVENT_TYPE_FAILED
        assert "the job cannot fit: a process ran out of memory with 8 GiB, the whole " in (
            last.message
        )
        assert scheduler.get(job.job_id).state == C.JOB_STATE_FAILED
    finally:
        scheduler.stop()
