"""The round's reasons on a real scheduler (in-memory store, simulated workers, a manual
clock): set on the job, one REASON event a change and none while it holds, the queue
position, the `gearshift_jobs_pending{reason}` gauge, and the `why:` line."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gearshift.client.render import job_details
from gearshift.scheduler.api.servicer import job_message
from gearshift.scheduler.round import why
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.helpers import wait_until
from tests.sched_harness import Clock, job_spec, make_scheduler, register

C = common_pb2
S = scheduler_pb2


def settings(policy: str = "las", **fields: object) -> SchedulerSettings:
    base: dict[str, object] = {
        "policy": policy,
        "round_seconds": 60.0,
        "heartbeat_interval": 1.0,
        "heartbeat_timeout": 1000.0,
    }
    base.update(fields)
    return SchedulerSettings(**base)  # type: ignore[arg-type]


def reason_events(scheduler: Scheduler, job_id: str) -> list[str]:
    events = scheduler.state.store.events_after(job_id, 0)
    return [e.message for e in events if e.type == S.JOB_EVENT_TYPE_REASON]


def pending(code: str) -> float | None:
    return REGISTRY.get_sample_value("gearshift_jobs_pending", {"reason": code})


def spec(name: str) -> C.JobSpec:
    return job_spec(name, 1)


def test_a_waiting_job_has_one_event_per_change_a_position_a_metric_and_a_why_line() -> None:
    clock = Clock()
    scheduler, _ = make_scheduler(settings("fifo"), clock=clock)
    try:
        register(scheduler, "box", {"t4": 1})
        first = scheduler.submit(spec("first"), "")[0].job_id
        scheduler.run_round()
        waiting = []
        for i in range(2):  # one after the other: the queue is by arrival at equal priority
            clock.now += 1.0
            waiting.append(scheduler.submit(spec(f"w{i}"), "")[0].job_id)
        for _ in range(3):  # three rounds, the same reason: one event
            clock.now += 60.0
            scheduler.heartbeat("box", [])
            scheduler.run_round()
        job = scheduler.get(waiting[0])
        assert job.reason is not None and job.reason.code == why.NO_FREE_DEVICE
        assert reason_events(scheduler, waiting[0]) == [
            "no free device of an accepted type (t4: 0 free)"
        ]
        assert [scheduler.get(j).queue_position for j in waiting] == [1, 2]
        assert pending(why.NO_FREE_DEVICE) == 2.0
        assert pending(why.PREEMPTED) == 0.0
        message = job_message(job)
        assert message.reason.code == why.NO_FREE_DEVICE and message.queue_position == 1
        assert "why:        no free device of an accepted type (t4: 0 free)" in job_details(message)
        assert "queue position 1" in job_details(message)
        scheduler.cancel(first, "")  # the device is free: the first waiting job starts
        clock.now += 60.0
        scheduler.heartbeat("box", [])
        scheduler.run_round()
        started = scheduler.get(waiting[0])
        assert started.state == C.JOB_STATE_RUNNING
        assert started.reason is None and started.queue_position == 0
        assert len(reason_events(scheduler, waiting[0])) == 1  # cleared without an event
        assert scheduler.get(waiting[1]).queue_position == 1
        assert pending(why.NO_FREE_DEVICE) == 1.0
    finally:
        scheduler.stop()


@pytest.mark.parametrize("decision_process", [False, True])
def test_a_preempted_job_names_who_took_its_device_under_which_objective(
    decision_process: bool,
) -> None:
    """LAS on one device: the new job comes first (Gavel's new-job priority) and takes the
    running job's device; the running job says by whom, under which objective, with both
    priorities (from the decision process too, where the allocator runs there)."""
    clock = Clock()
    scheduler, _ = make_scheduler(
        settings("las", elastic=True, decision_process=decision_process), clock=clock
    )
    try:
        register(scheduler, "box", {"t4": 1})
        old = scheduler.submit(spec("old"), "")[0].job_id
        scheduler.run_round()
        clock.now += 60.0
        scheduler.heartbeat("box", [])
        scheduler.run_round()
        new = scheduler.submit(spec("new"), "")[0].job_id
        clock.now += 60.0
        scheduler.heartbeat("box", [])
        report = scheduler.run_round()
        assert report.preempted == [old] and report.started == [new]
        reason = scheduler.get(old).reason
        assert reason is not None and reason.code == why.PREEMPTED
        assert reason.facts["by"] == new
        assert reason.facts["objective"] == scheduler.rounds.allocator.name
        assert float(reason.facts["by_priority"]) > float(reason.facts["priority"])
        assert reason.message.startswith(f"preempted by {new} under ")
        assert scheduler.get(old).state == C.JOB_STATE_QUEUED
        assert scheduler.get(new).reason is None
        events = scheduler.state.store.events_after(old, 0)
        assert [e.message for e in events if e.type == S.JOB_EVENT_TYPE_REASON] == [reason.message]
    finally:
        scheduler.stop()


def test_starts_over_the_bound_are_held_back_with_a_reason() -> None:
    clock = Clock()
    scheduler, _ = make_scheduler(settings(elastic=True, max_starts_per_round=1), clock=clock)
    try:
        register(scheduler, "box", {"t4": 4})
        jobs = [scheduler.submit(spec(f"j{i}"), "")[0].job_id for i in range(3)]
        report = scheduler.run_round()
        assert len(report.started) == 1
        held = [j for j in jobs if j not in report.started]
        for job_id in held:
            reason = scheduler.get(job_id).reason
            assert reason is not None and reason.code == why.START_BOUND
            assert "round.maxStarts = 1" in reason.message
        assert pending(why.START_BOUND) == 2.0
    finally:
        scheduler.stop()


def only_reason(scheduler: Scheduler, job_id: str) -> tuple[str, str]:
    """The job's reason (code, message), and it was said once."""
    reason = scheduler.get(job_id).reason
    assert reason is not None
    assert reason_events(scheduler, job_id) == [reason.message]
    return reason.code, reason.message


def test_a_gang_of_devices_not_yet_free() -> None:
    clock = Clock()
    scheduler, _ = make_scheduler(settings("easyscale"), clock=clock)
    try:
        register(scheduler, "box", {"t4": 2})
        scheduler.submit(job_spec("one", 1), "")
        scheduler.run_round()
        clock.now += 1.0  # it arrives after the running job (ties go by id)
        gang = job_spec("gang", 2)
        gang.elastic.min_devices = 2  # rigid: both devices at once
        waiting = scheduler.submit(gang, "")[0].job_id
        for _ in range(2):
            clock.now += 60.0
            scheduler.heartbeat("box", [])
            scheduler.run_round()
        assert only_reason(scheduler, waiting) == (
            why.GANG_NOT_FREE,
            "a gang of 2 devices is not yet free (t4: 1 free)",
        )
        assert pending(why.GANG_NOT_FREE) == 1.0
    finally:
        scheduler.stop()


def test_a_d1_job_waits_for_its_first_type_while_others_are_free() -> None:
    """The v100 is taken; a D1 job whose first placement was on v100 (its locked type, as a
    restarted scheduler loads it) waits though both t4 are free."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings("easyscale"), clock=clock)
    try:
        register(scheduler, "a", {"v100": 1})
        register(scheduler, "b", {"t4": 2})
        scheduler.submit(job_spec("holder", 1, accelerator_types=["v100"]), "")
        scheduler.run_round()
        clock.now += 1.0  # it arrives after the holder (ties go by id)
        d1 = scheduler.submit(job_spec("d1", 1, determinism=C.DETERMINISM_LEVEL_D1), "")[0]
        with scheduler.state.lock:
            scheduler.state.jobs[d1.job_id].locked_type = "v100"
        clock.now += 60.0
        for worker in ("a", "b"):
            scheduler.heartbeat(worker, [])
        scheduler.run_round()
        code, message = only_reason(scheduler, d1.job_id)
        assert code == why.TYPE_LOCKED
        assert message == (
            "kept on its first type v100 (D0/D1 keep a job on one type); "
            "0 v100 free, 2 of other accepted types"
        )
    finally:
        scheduler.stop()


def test_a_best_effort_job_waits_behind_a_tenants_guarantee(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: {acme: {quota: {t4: 2}}}\n")
    clock = Clock()
    scheduler, _ = make_scheduler(
        settings("max_min_fairness", elastic=True, tenants_file=str(path)), clock=clock
    )
    try:
        register(scheduler, "box", {"t4": 2})
        guaranteed = job_spec("g", 2, tenant="acme", service_class=C.SERVICE_CLASS_GUARANTEED)
        g = scheduler.submit(guaranteed, "")[0].job_id
        clock.now += 1.0
        best_effort = scheduler.submit(job_spec("be", 1, tenant="other"), "")[0].job_id
        scheduler.run_round()
        assert scheduler.get(g).state == C.JOB_STATE_RUNNING
        code, message = only_reason(scheduler, best_effort)
        assert code == why.TENANT_GUARANTEE
        assert message == (
            "waiting behind tenant acme's guarantee (t4: 2 of 2 devices of its quota in use)"
        )
        assert scheduler.get(best_effort).reason.facts == {  # type: ignore[union-attr]
            "tenant": "acme",
            "usage": "t4: 2 of 2",
        }
        assert pending(why.TENANT_GUARANTEE) == 1.0
    finally:
        scheduler.stop()


def test_an_oom_restart_says_its_memory_was_doubled() -> None:
    clock = Clock()
    scheduler, agents = make_scheduler(settings("fifo", round_seconds=1.0), clock=clock)
    try:
        scheduler.register_worker(
            "a", "127.0.0.1:1001", "test", [C.DeviceGroup(accelerator_type="cpu", count=2)], [],
            cpu_cores=4, memory_bytes=8 << 30,
        )  # fmt: skip
        job_id = scheduler.submit(job_spec("m", 2), "")[0].job_id
        scheduler.run_round()
        first = agents.started[-1]
        oom = C.TaskStatus(
            task_id=first.task_id, job_id=job_id, state=C.TASK_STATE_FAILED, exit_code=137,
            out_of_memory=True, message="out of memory",
        )  # fmt: skip
        scheduler.task_finished("a", oom)
        wait_until(lambda: not scheduler.state.stopping, 10.0, "the job's tasks stopped")
        clock.now += 2.0
        scheduler.run_round()
        assert scheduler.get(job_id).state == C.JOB_STATE_RUNNING
        assert only_reason(scheduler, job_id) == (
            why.OOM_RESTART,
            "restarted after running out of memory, with 2x its memory share",
        )
    finally:
        scheduler.stop()


def test_a_restart_for_a_new_plan_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job kept on its devices and restarted there for a new plan (the reconcile's
    restart reason) says which plan."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings("fifo"), clock=clock)
    try:
        register(scheduler, "box", {"t4": 1})
        job_id = scheduler.submit(job_spec("p", 1), "")[0].job_id
        scheduler.run_round()
        monkeypatch.setattr(
            scheduler.rounds,
            "_restart_reason",
            lambda j: "restarting with a new execution plan" if j == job_id else None,
        )
        clock.now += 60.0
        scheduler.heartbeat("box", [])
        report = scheduler.run_round()
        assert report.rescaled == [job_id]
        assert only_reason(scheduler, job_id) == (
            why.PLAN_CHANGE,
            "restarted with a new execution plan",
        )
    finally:
        scheduler.stop()
