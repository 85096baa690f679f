"""What keeps the scheduler's RPCs fast with thousands of queued jobs (bench/load.py) without
changing an answer: the per-tenant queued count, the per-job snapshot kept between rounds and
what the elastic allocator works out of it."""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Any

import pytest

from gearshift.common.daemon import GC_YOUNG_THRESHOLD, quiet_collector
from gearshift.common.errors import ResourceExhaustedError
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.gavel.elastic_rounds import ElasticRounds
from gearshift.scheduler.round import rounds as rounds_module
from gearshift.scheduler.round.ests import configurations
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.state.state import RUNNING_STATES as RUNNING
from gearshift.scheduler.types import Allocator, Device, Snapshot, Target
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.sched_harness import Clock, TableBrain, job_spec, make_scheduler, register
from tests.unit.test_elastic_policies import job as job_snapshot

C = common_pb2


def settings(**fields: Any) -> SchedulerSettings:
    base: dict[str, Any] = {
        "policy": "las",
        "elastic": True,
        "round_seconds": 60.0,
        "heartbeat_interval": 1.0,
        "heartbeat_timeout": 5.0,
    }
    return SchedulerSettings(**{**base, **fields})


def recount(scheduler: Scheduler) -> dict[str, set[str]]:
    """The queued jobs per tenant, counted the slow way."""
    out: dict[str, set[str]] = {}
    for job in scheduler.state.jobs.values():
        if job.state == C.JOB_STATE_QUEUED:
            out.setdefault(job.spec.tenant, set()).add(job.job_id)
    return out


def test_the_queued_count_follows_every_change_of_a_job() -> None:
    """Submitted, started, preempted back to the queue, cancelled, reloaded: the index the
    --max-queued-jobs check reads equals a recount after each, and the limit lets a tenant
    submit again once one of its jobs has left the queue."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(max_queued_jobs=2), clock=clock)
    try:
        register(scheduler, "a", {"t4": 1})
        scheduler.submit(job_spec("one", 1, tenant="t"), "")
        second, _ = scheduler.submit(job_spec("two", 1, tenant="t"), "")
        scheduler.submit(job_spec("other", 1, tenant="u"), "")
        assert scheduler.state.queued == recount(scheduler)
        with pytest.raises(ResourceExhaustedError, match="tenant 't' has 2 queued jobs"):
            scheduler.submit(job_spec("three", 1, tenant="t"), "")
        scheduler.run_round()  # one job starts on the one device
        assert scheduler.state.queued == recount(scheduler)
        assert sum(len(ids) for ids in scheduler.state.queued.values()) == 2
        running = next(j for j in scheduler.state.jobs.values() if j.state != C.JOB_STATE_QUEUED)
        clock.now += 10.0  # its worker falls silent: the job goes back to the queue
        scheduler.run_round()
        assert scheduler.state.jobs[running.job_id].state == C.JOB_STATE_QUEUED
        assert scheduler.state.queued == recount(scheduler)
        scheduler.cancel(second.job_id, "test")
        assert scheduler.state.queued == recount(scheduler)
        third, _ = scheduler.submit(job_spec("three", 1, tenant="t"), "")  # room again
        assert third.job_id in scheduler.state.queued["t"]
        assert scheduler.state.queued == recount(scheduler)

        again, _ = make_scheduler(settings(max_queued_jobs=2), clock=clock, store=scheduler.store)
        try:
            again.recover()
            assert again.state.queued == recount(again) == recount(scheduler)
        finally:
            again.stop()
    finally:
        scheduler.stop()


class Recording:
    """An allocator that keeps every snapshot it is handed and allocates nothing."""

    name = "recording"
    replans_on_events = True

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        self.snapshots.append(snapshot)
        return {}


def test_a_running_jobs_snapshot_is_copied_with_its_attained_service_not_rebuilt() -> None:
    """Each round a running job's attained service moves on and nothing else: its snapshot
    is the last one with that field replaced (a rebuild was most of the snapshot's time at
    5,000 jobs), and equals what a rebuild makes."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(heartbeat_timeout=1e9), clock=clock)
    rounds = scheduler.rounds
    try:
        register(scheduler, "a", {"v100": 2})
        job, _ = scheduler.submit(job_spec("runs", 2), "")
        scheduler.run_round()
        clock.now += 10.0
        scheduler.run_round()
        before = rounds._snapshots[job.job_id][1]
        built: list[str] = []
        build = rounds._build_job

        def counted(view: Any, types: list[str]) -> Any:
            built.append(view.job.job_id)
            return build(view, types)

        rounds._build_job = counted  # type: ignore[method-assign]
        clock.now += 10.0
        scheduler.run_round()
        after = rounds._snapshots[job.job_id][1]
        assert built == [] and after.attained_seconds > before.attained_seconds
        assert after == replace(before, attained_seconds=after.attained_seconds)
        rounds._snapshots.clear()  # what a rebuild makes of the same job now
        state = scheduler.state
        gathered = rounds._gather(
            clock.now,
            list(state.jobs.values()),
            rounds._devices.of(state.workers.values()),
            frozenset(),
        )
        (view,) = [v for v in gathered.jobs if v.job.job_id == job.job_id]
        types = sorted({d.worker_type for d in gathered.devices})
        assert build(view, types) == after
    finally:
        scheduler.stop()


def test_a_waiting_jobs_snapshot_is_kept_until_what_it_is_made_of_changes() -> None:
    """Round after round a queued job is handed over as the same object (the allocator keeps
    its work on it); a new Brain estimate or a new type makes a new one, with new rates."""
    clock = Clock()
    speeds = {"v100": 1.0, "k80": 0.5}
    brain = TableBrain(lambda job_id, kind, count: speeds[kind] * count)
    recording = Recording()
    allocator: Allocator = recording
    scheduler, _ = make_scheduler(
        settings(estimate_refresh_seconds=30.0), clock=clock, brain=brain, allocator=allocator
    )
    try:
        register(scheduler, "a", {"v100": 1})
        job, _ = scheduler.submit(job_spec("waits", 2, accelerator_types=["a100"]), "")
        for _ in range(3):
            clock.now += 1.0
            scheduler.heartbeat("a", [])
            scheduler.run_round()
        first, second, third = (s.jobs[0] for s in recording.snapshots)
        assert first is second is third
        speeds["v100"] = 3.0  # the Brain learned more; asked again after 30 s
        for _ in range(8):
            clock.now += 4.0
            scheduler.heartbeat("a", [])
        scheduler.run_round()
        refreshed = recording.snapshots[-1].jobs[0]
        assert refreshed is not third
        assert refreshed.throughputs["v100"] == pytest.approx(3 * third.throughputs["v100"])
        register(scheduler, "b", {"k80": 1})
        scheduler.run_round()
        widened = recording.snapshots[-1].jobs[0]
        assert widened is not refreshed and set(widened.capability) == {"k80", "v100"}
        scheduler.cancel(job.job_id, "test")
        assert job.job_id not in scheduler.rounds._snapshots
    finally:
        scheduler.stop()


def test_the_tenants_view_counts_what_a_walk_over_every_job_counts() -> None:
    """GetClusterState's per-tenant counts (now taken in bulk) equal a plain count over the
    jobs: running ones with their devices by type, the open rest as queued, ended ones
    not at all."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(), clock=clock)
    try:
        register(scheduler, "a", {"v100": 2})
        register(scheduler, "b", {"k80": 1})
        ids = [
            scheduler.submit(job_spec(f"j{i}", 1 + i % 2, tenant=f"t{i % 3}"), "")[0].job_id
            for i in range(9)
        ]
        scheduler.run_round()
        scheduler.cancel(ids[-1], "test")
        scheduler.cancel(ids[0], "test")
        shown = {t.tenant: t for t in scheduler.cluster_state().tenants}
        expected: dict[str, tuple[int, int, dict[str, int]]] = {}
        for job in scheduler.state.jobs.values():
            if job.terminal:
                continue
            running, queued, devices = expected.get(job.spec.tenant, (0, 0, {}))
            if job.state in (C.JOB_STATE_RUNNING, C.JOB_STATE_RESCALING):
                running += 1
                for process in job.placement.processes:
                    kind = process.accelerator_type
                    devices[kind] = devices.get(kind, 0) + 1
            else:
                queued += 1
            expected[job.spec.tenant] = (running, queued, devices)
        assert sum(r for r, _, _ in expected.values()) >= 2, "nothing runs: a weak check"
        assert {
            t: (row.running_jobs, row.queued_jobs, dict(row.devices)) for t, row in shown.items()
        } == expected
    finally:
        scheduler.stop()


def test_a_keyed_retry_gets_its_job_even_at_a_full_queue() -> None:
    """The key is looked up only when the job is refused: a retry of a job that was taken
    returns it (not RESOURCE_EXHAUSTED) when the tenant's queue has since filled, and
    once more when the store refuses the duplicate key."""
    scheduler, _ = make_scheduler(settings(max_queued_jobs=2), clock=Clock())
    try:
        first, created = scheduler.submit(job_spec("one", 1, tenant="t"), "k1")
        assert created
        again, created = scheduler.submit(job_spec("one", 1, tenant="t"), "k1")
        assert (again.job_id, created) == (first.job_id, False)  # the store refused it
        scheduler.submit(job_spec("two", 1, tenant="t"), "k2")
        full, created = scheduler.submit(job_spec("one", 1, tenant="t"), "k1")
        assert (full.job_id, created) == (first.job_id, False)  # the queue refused it
        with pytest.raises(ResourceExhaustedError, match="tenant 't' has 2 queued jobs"):
            scheduler.submit(job_spec("three", 1, tenant="t"), "k3")
        assert len(scheduler.state.jobs) == 2
    finally:
        scheduler.stop()


def test_the_cluster_view_shows_each_placement_as_it_stands_now() -> None:
    """GetClusterState keeps each running placement's part between calls (cluster_view.py):
    a job moved to other devices shows its new placement, one that ended disappears, and
    the allocations and the tenants' devices always equal a plain walk over the jobs."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(), clock=clock)

    def plain() -> tuple[list[scheduler_pb2.Allocation], dict[str, dict[str, int]]]:
        running = sorted(
            (
                j
                for j in scheduler.state.jobs.values()
                if not j.terminal
                and j.state in (C.JOB_STATE_RUNNING, C.JOB_STATE_RESCALING)
                and j.placement.processes
            ),
            key=lambda j: j.submitted_at,
        )
        devices: dict[str, dict[str, int]] = {}
        for job in running:
            row = devices.setdefault(job.spec.tenant, {})
            for process in job.placement.processes:
                row[process.accelerator_type] = row.get(process.accelerator_type, 0) + 1
        allocations = [
            scheduler_pb2.Allocation(job_id=j.job_id, job_name=j.spec.name, placement=j.placement)
            for j in running
        ]
        return allocations, devices

    def shown() -> tuple[list[scheduler_pb2.Allocation], dict[str, dict[str, int]]]:
        state = scheduler.cluster_state()
        return list(state.allocations), {t.tenant: dict(t.devices) for t in state.tenants}

    try:
        register(scheduler, "a", {"v100": 4})
        register(scheduler, "b", {"k80": 2})
        for i in range(5):
            scheduler.submit(job_spec(f"j{i}", 1, tenant=f"t{i % 2}"), "")
        scheduler.run_round()
        first = shown()
        assert len(first[0]) >= 3, "too few run: a weak check"
        assert first == plain()
        assert shown() == first  # kept parts: the same message again
        moved = scheduler.state.jobs[first[0][0].job_id]
        with scheduler.state.lock:  # another device, a new placement (never changed in place)
            placement = common_pb2.Placement()
            placement.CopyFrom(moved.placement)
            placement.processes[0].device_index = 9
            placement.processes[0].accelerator_type = "p100"
            moved.placement = placement
        scheduler.cancel(first[0][1].job_id, "test")
        second = shown()
        assert second == plain()
        assert second[0][0].placement.processes[0].device_index == 9
        assert first[0][1].job_id not in {a.job_id for a in second[0]}
        assert "p100" in second[1][moved.spec.tenant]
    finally:
        scheduler.stop()


def _afresh(scheduler: Scheduler) -> tuple[list[Any], list[Any], list[Any]]:
    """GetClusterState's workers, allocations and tenants built the plain way from every
    record (no part kept between calls)."""
    state = scheduler.state
    workers = [
        scheduler_pb2.WorkerInfo(
            worker_id=w.worker_id,
            address=w.address,
            hostname=w.hostname,
            devices=w.devices,
            alive=w.alive,
            last_heartbeat_at=w.last_heartbeat_at,
            cpu_cores=w.cpu_cores,
            memory_bytes=w.memory_bytes,
            degraded=bool(w.degraded_reason),
            degraded_reason=w.degraded_reason,
        )
        for w in sorted(state.workers.values(), key=lambda w: w.worker_id)
    ]
    jobs = sorted(state.jobs.values(), key=lambda j: j.submitted_at)
    placed = [j for j in jobs if j.state in RUNNING and j.placement.processes]
    allocations = [
        scheduler_pb2.Allocation(job_id=j.job_id, job_name=j.spec.name, placement=j.placement)
        for j in placed
    ]
    tenants: dict[str, scheduler_pb2.TenantState] = {}
    for job in jobs:
        if job.terminal:
            continue
        row = tenants.setdefault(job.spec.tenant, scheduler_pb2.TenantState(tenant=job.spec.tenant))
        if job in placed:
            row.running_jobs += 1
            for process in job.placement.processes:
                row.devices[process.accelerator_type] += 1
        else:
            row.queued_jobs += 1
    return workers, allocations, [tenants[name] for name in sorted(tenants)]


def test_the_cluster_view_kept_between_calls_equals_one_built_afresh_after_every_change() -> None:
    """GetClusterState keeps its workers' and placements' parts and the tenants' counts
    from call to call (cluster_view.py); after each kind of change, and called again with
    none, it equals the message built from every record: heartbeats, a degraded worker, a
    job moved, one cancelled, one started, a worker registered or registered again with
    other devices, workers lost and their jobs back in the queue."""
    clock = Clock()
    scheduler, _ = make_scheduler(settings(), clock=clock)

    def check(what: str) -> None:
        for call in ("first", "second"):
            view = scheduler.cluster_state()
            shown = (list(view.workers), list(view.allocations), list(view.tenants))
            assert shown == _afresh(scheduler), f"after {what}, {call} call"

    try:
        register(scheduler, "a", {"v100": 4})
        register(scheduler, "b", {"k80": 2})
        check("registering")
        for i in range(7):
            scheduler.submit(job_spec(f"j{i}", 1 + i % 2, tenant=f"t{i % 3}"), "")
        check("submitting")
        scheduler.run_round()
        assert len(scheduler.cluster_state().allocations) >= 3, "too few run: a weak check"
        check("a round")
        clock.now += 1.0
        with scheduler.state.lock:  # what a heartbeat writes of its worker
            for worker in scheduler.state.workers.values():
                worker.last_heartbeat_at = clock.now
        check("heartbeats")
        with scheduler.state.lock:
            scheduler.state.workers["b"].degraded_reason = "a straggler ran on it"
        check("a worker degraded")
        running = [j for j in scheduler.state.jobs.values() if j.state in RUNNING]
        with scheduler.state.lock:  # another device, a new placement (never changed in place)
            placement = common_pb2.Placement()
            placement.CopyFrom(running[0].placement)
            placement.processes[0].device_index = 9
            running[0].placement = placement
        check("a job moved")
        scheduler.cancel(running[1].job_id, "test")
        check("a job cancelled")
        register(scheduler, "c", {"p100": 2})
        scheduler.run_round()
        check("a worker registered and a round on it")
        register(scheduler, "b", {"k80": 1})
        check("a worker registered again with fewer devices")
        clock.now += 10.0  # every worker falls silent: lost, their jobs back in the queue
        scheduler.run_round()
        assert not any(w.alive for w in scheduler.state.workers.values())
        check("workers lost")
    finally:
        scheduler.stop()


def test_a_jobs_brain_ask_is_built_once_and_dropped_when_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a round asks the Brain of a job is made of its spec, which does not change: it
    is built in the job's first round only (it was built for every job each round, under
    the lock), still reaches the Brain, and is dropped when the job ends."""
    built: list[str] = []
    build = rounds_module._ask

    def counted(job: Any) -> Any:
        built.append(job.job_id)
        return build(job)

    monkeypatch.setattr(rounds_module, "_ask", counted)
    clock = Clock()
    brain = TableBrain(lambda job_id, kind, count: 1.0 * count)
    scheduler, _ = make_scheduler(settings(), clock=clock, brain=brain)
    try:
        register(scheduler, "a", {"v100": 1})
        one, _ = scheduler.submit(job_spec("one", 1), "")
        two, _ = scheduler.submit(job_spec("two", 2, accelerator_types=["a100"]), "")
        for _ in range(3):
            clock.now += 1.0
            scheduler.heartbeat("a", [])
            scheduler.run_round()
        assert built == [one.job_id, two.job_id]
        assert brain.asked > 0
        three, _ = scheduler.submit(job_spec("three", 1), "")
        scheduler.run_round()
        assert built == [one.job_id, two.job_id, three.job_id]
        scheduler.cancel(two.job_id, "test")
        assert set(scheduler.rounds._asks) == {one.job_id, three.job_id}
    finally:
        scheduler.stop()


def test_the_elastic_allocator_works_out_configurations_once_per_kind_of_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Configurations are worked out once per kind of job (ElasticJob.key) and capacity: the
    two jobs here are of one kind, a new snapshot object of a job (a running job's, each
    round: its attained service changed) reuses them, a new capacity works them out again;
    and the allocation is the same as from scratch."""
    calls: list[str] = []
    real = configurations

    def counting(job: Any, capacity: Any) -> Any:
        calls.append(job.job_id if hasattr(job, "job_id") else "")
        return real(job, capacity)

    monkeypatch.setattr("gearshift.scheduler.plugins.gavel.elastic_rounds.configurations", counting)
    clock = Clock()
    recording = Recording()
    scheduler, _ = make_scheduler(settings(), clock=clock, allocator=recording)
    try:
        register(scheduler, "a", {"v100": 2})
        for name in ("x", "y"):
            scheduler.submit(job_spec(name, 2), "")
        scheduler.run_round()
        scheduler.run_round()
    finally:
        scheduler.stop()
    snapshot, again = recording.snapshots
    assert again.jobs[0] is snapshot.jobs[0]
    bigger = replace(again, devices=(*again.devices, Device("b", 0, "v100")))
    cached = make_allocator("las", elastic=True)
    fresh = make_allocator("las", elastic=True)
    assert isinstance(cached, ElasticRounds)
    worked_out = []
    renewed = replace(again, jobs=tuple(replace(j, attained_seconds=5.0) for j in again.jobs))
    for step in (snapshot, again, bigger, again, renewed):
        before = len(calls)
        got = cached.allocate(step)
        worked_out.append(len(calls) - before)
        copied = replace(step, jobs=tuple(replace(j) for j in step.jobs))
        assert got == fresh.allocate(copied)  # the same as from scratch
    # first round: one kind; same objects: nothing; new capacity: once; the old capacity
    # and new snapshot objects of the same kind: nothing
    assert worked_out == [1, 0, 1, 0, 0]


def test_a_jobs_model_is_kept_while_only_its_attained_service_moves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A running job's snapshot is a new object each round (its attained service): its
    model is kept for it; any other change makes it again, and the allocation is the same
    as from scratch each time."""
    made: list[str] = []
    model = ElasticRounds._model

    def counted(self: ElasticRounds, job: Any) -> Any:
        made.append(job.job_id)
        return model(self, job)

    monkeypatch.setattr(ElasticRounds, "_model", counted)
    devices = tuple(Device("w", i, "v100") for i in range(4))
    x, y = jobs = (job_snapshot("x", 2, {"v100": 1.0}), job_snapshot("y", 2, {"v100": 1.0}, at=1.0))
    rounds = [
        jobs,
        (x.with_attained(5.0), y.with_attained(5.0)),  # kept
        (x.with_attained(10.0), replace(y.with_attained(10.0), max_devices=1)),  # y anew
        (x.with_attained(15.0), replace(y, types=())),  # y anew
    ]
    cached = make_allocator("las", elastic=True)
    made_per_round = []
    for now, step in enumerate(rounds):
        snapshot = Snapshot(float(now), devices, step)
        before = len(made)
        got = cached.allocate(snapshot)
        made_per_round.append(made[before:])
        assert got == make_allocator("las", elastic=True).allocate(snapshot)
    assert made_per_round == [["x", "y"], [], ["y"], ["y"]]


def test_a_ready_daemon_keeps_full_collections_rare() -> None:
    before = gc.get_threshold()
    try:
        quiet_collector()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
