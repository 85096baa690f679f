"""--decision-process: the round's decision in a child process gives the answers the
scheduler's own process gives, round after round, with only the changed job snapshots
sent; a killed child is replaced; the scheduler stops it with itself."""

from __future__ import annotations

import dataclasses
import io
import logging
import multiprocessing as mp
import os
import signal
import threading
from typing import Any

import pytest

from gearshift.common import logs
from gearshift.common.rubick.model import A800
from gearshift.scheduler.plugins.rubick.fits import Fitted
from gearshift.scheduler.plugins.stages import (
    allocator_for,
    collocator_for,
    decision_stages,
)
from gearshift.scheduler.round import decider
from gearshift.scheduler.round.decider import (
    DECISION_NICENESS,
    DecisionProcess,
    InProcess,
    recv_chunks,
    send_chunks,
)
from gearshift.scheduler.round.pipeline import plan_round
from gearshift.scheduler.service import Scheduler, SchedulerSettings
from gearshift.scheduler.types import Snapshot
from gearshift.v1 import common_pb2
from tests.helpers import wait_until
from tests.sched_harness import Clock, job_spec, make_scheduler, register
from tests.unit.test_elastic_policies import job as job_snapshot
from tests.unit.test_rubick_live import ACTIVATIONS, PARAMS
from tests.unit.test_rubick_live import devices as rubick_devices
from tests.unit.test_rubick_live import facts as rubick_facts
from tests.unit.test_rubick_live import live as rubick_live
from tests.unit.test_rubick_live import snap as rubick_snap
from tests.unit.test_rubick_live import worker as rubick_worker
from tests.unit.test_sched_scale import settings as elastic_las

C = common_pb2


def settings(**fields: Any) -> SchedulerSettings:
    """Elastic LAS with both move bounds on, so that the child keeps what they need."""
    bounds = {"heartbeat_timeout": 1e9, "preempt_exempt_seconds": 30.0, "max_moves_per_round": 3}
    return elastic_las(**{**bounds, **fields})


def snapshot_of(scheduler: Scheduler, now: float) -> tuple[Snapshot, Any]:
    rounds = scheduler.rounds
    return rounds._snapshot(now, rounds.gather(now))


@pytest.mark.parametrize("chunk", [decider.CHUNK, 3])  # 3: every message in pieces
def test_the_child_decides_as_the_scheduler_would_round_after_round(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decider, "CHUNK", chunk)
    clock = Clock()
    config = settings()
    scheduler, _ = make_scheduler(config, clock=clock)
    here = InProcess(allocator_for(config), collocator_for(config))
    child = DecisionProcess(config, decision_stages)
    try:
        for i in range(6):
            register(scheduler, f"w{i}", {("v100", "k80")[i % 2]: 2})
        for i in range(10):
            scheduler.submit(job_spec(f"j{i}", 1 + i % 4), "")
        for step in range(5):
            clock.now += 20.0
            scheduler.submit(job_spec(f"late{step}", 2), "")
            snapshot, current = snapshot_of(scheduler, clock.now)
            expected = here.decide(snapshot, current)
            assert child.decide(snapshot, current) == expected, f"round {step}"
            assert expected[1], "a round that places nothing proves little"
            scheduler.run_round()  # the jobs move on: the next snapshot differs
        assert child.restarts == 0
    finally:
        child.close()
        scheduler.stop()


def test_the_child_holds_every_job_as_the_scheduler_sees_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's side run here, in a thread, keeping what its decision was given: round
    after round, the jobs as the scheduler's snapshot has them, the running ones'
    attained service sent alone."""
    given: list[tuple[Snapshot, Any]] = []
    decided: list[Any] = []

    def keep(snapshot: Snapshot, allocator: Any, current: Any, *args: Any) -> Any:
        given.append((snapshot, current))  # the scheduler's rounds too: after each check
        decided.append(plan_round(snapshot, allocator, current, *args))
        return decided[-1]

    monkeypatch.setattr("gearshift.scheduler.round.decider.plan_round", keep)
    monkeypatch.setattr(os, "nice", lambda _: 0)  # the thread is this process
    moved: list[int] = []  # per round: jobs sent as their attained service alone
    changes = decider._changes

    def counted(sent: Any, jobs: Any) -> Any:
        out = changes(sent, jobs)
        moved.append(len(out[1]))
        return out

    monkeypatch.setattr(decider, "_changes", counted)
    answered: list[tuple[int, int, int, int]] = []  # per round: targets, re-sent, desired, moved
    answer = decider._answer

    def told(*args: Any) -> Any:
        out = answer(*args)
        answered.append(tuple(len(part) for part in out))  # type: ignore[arg-type]
        return out

    monkeypatch.setattr(decider, "_answer", told)
    clock = Clock()
    config = settings()
    scheduler, _ = make_scheduler(config, clock=clock)
    here, there = mp.Pipe()

    def serve() -> None:
        try:
            decider._serve(there, config, decision_stages)
        finally:  # a failure here ends the test's wait for an answer (EOFError)
            there.close()

    child = threading.Thread(target=serve, daemon=True)
    child.start()
    sender = DecisionProcess(config, decision_stages)
    sender._conn = here  # the thread is its child
    try:
        for i in range(4):
            register(scheduler, f"w{i}", {"v100": 2})
        for i in range(6):
            scheduler.submit(job_spec(f"j{i}", 1 + i % 2), "")
        for step in range(5):
            clock.now += 20.0
            if step == 3:  # new devices: sent again
                register(scheduler, "late", {"k80": 2})
                scheduler.submit(job_spec("late", 2, accelerator_types=["k80"]), "")
            snapshot, current = snapshot_of(scheduler, clock.now)
            targets, desired = sender.decide(snapshot, current)
            held, held_current = given[-1]
            assert held.jobs == snapshot.jobs, f"round {step}"
            assert held.devices == snapshot.devices and held_current == current, f"round {step}"
            assert (targets, desired) == decided[-1], f"round {step}"
            assert list(desired) == list(decided[-1][1]), f"round {step}: the order"
            kept = [j for j, a in desired.items() if current.get(j) == a]
            assert all(desired[j] is current[j] for j in kept), f"round {step}"
            scheduler.run_round()
        assert moved[0] == 0 and max(moved) > 0, moved  # the running jobs' service moved on
        # Only what changed came back: every target and assignment in the first round, then
        # the running jobs' mostly as they stood
        assert answered[0][1] == answered[0][0] and answered[0][3] == answered[0][2], answered
        later = answered[1:]
        assert any(re_sent < targets for targets, re_sent, _, _ in later), answered
        assert any(moved_to < wanted for _, _, wanted, moved_to in later), answered
        assert sender.restarts == 0
        here.send(None)
    finally:
        child.join(timeout=10)
        sender.close()
        scheduler.stop()
    assert not child.is_alive()


def test_only_a_job_whose_attained_service_alone_moved_on_is_sent_as_that() -> None:
    same, ran, rebuilt, other, new = (
        job_snapshot(name, 2, {"v100": 1.0}).with_attained(5.0)
        for name in ("same", "ran", "rb", "o", "new")
    )
    sent = {j.job_id: j for j in (same, ran, rebuilt, other)}
    later = ran.with_attained(25.0)
    assert later == dataclasses.replace(ran, attained_seconds=25.0) and later is not ran
    assert later.capability is ran.capability  # the same objects, as replace gives
    now = [
        same,
        later,
        dataclasses.replace(rebuilt.with_attained(9.0), steps_remaining=50.0),
        dataclasses.replace(other, types=("k80",)),
        new,
    ]
    changed, moved = decider._changes(sent, now)
    assert moved == [("ran", 25.0)]
    assert [j.job_id for j in changed] == ["rb", "o", "new"]


def test_a_killed_child_is_replaced_and_given_the_whole_snapshot() -> None:
    clock = Clock()
    config = settings()
    scheduler, _ = make_scheduler(config, clock=clock)
    child = DecisionProcess(config, decision_stages)
    try:
        register(scheduler, "w", {"v100": 4})
        for i in range(3):
            scheduler.submit(job_spec(f"j{i}", 2), "")
        snapshot, current = snapshot_of(scheduler, clock.now)
        child.decide(snapshot, current)
        pid = child.pid
        assert pid is not None
        # the child yields the CPU to the RPCs (its decision is a burst once a round)
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(ours + DECISION_NICENESS, 19) > ours
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not child._process.is_alive(), 10.0, "the child dies")
        fresh = InProcess(allocator_for(config), collocator_for(config))
        assert child.decide(snapshot, current) == fresh.decide(snapshot, current)
        assert child.restarts == 1 and child.pid != pid
    finally:
        child.close()
        scheduler.stop()


def test_a_scheduler_with_a_decision_process_starts_jobs_and_stops_it() -> None:
    clock = Clock()
    scheduler, _ = make_scheduler(settings(decision_process=True), clock=clock)
    decider = scheduler.rounds.decider
    assert isinstance(decider, DecisionProcess)
    try:
        register(scheduler, "w", {"t4": 2})
        job, _ = scheduler.submit(job_spec("j", 2), "")
        report = scheduler.run_round()
        assert report.started == [job.job_id]
        assert scheduler.get(job.job_id).state == C.JOB_STATE_RUNNING
        process = decider._process
        assert process is not None and process.is_alive()
    finally:
        scheduler.stop()
    assert not process.is_alive()


def test_rubick_decides_in_the_child_from_the_models_this_process_refreshed() -> None:
    """The scheduler's LiveRubick refreshes the fitted models (here from a dict, in the
    daemon from the Brain) and ships them with the snapshot; the child's copy, with no
    Brain, decides as this process would: GC turned on, which only a fitted job gets
    where GC off does not fit (tests/unit/test_rubick_live.py)."""
    here = rubick_live({"j": Fitted("job j", ACTIVATIONS, PARAMS, A800)})
    workers = [rubick_worker("w", 4, 4.0)]
    here.refresh([rubick_facts("j", gc=True)], workers, 0.0)
    snapshot = Snapshot(0.0, rubick_devices(workers), (rubick_snap("j"),))
    config = SchedulerSettings(policy="rubick", collocation="none")
    child = DecisionProcess(config, decision_stages, here)
    try:
        there = child.decide(snapshot, {})
        expected = InProcess(here, None).decide(snapshot, {})
        assert there == expected
        plan = there[0]["j"].plan
        assert plan is not None and plan.gc and there[0]["j"].size == 4
        assert child.decide(snapshot, {}) == expected  # nothing re-shipped: the same
    finally:
        child.close()


@pytest.mark.parametrize("count", [0, 1, decider.CHUNK, 2 * decider.CHUNK + 1])
def test_items_cross_the_pipe_in_pieces_whole_and_in_order(count: int) -> None:
    here, there = mp.Pipe()
    items = [(f"job-{i}", i) for i in range(count)]
    send_chunks(here, items)
    assert recv_chunks(there) == items
    here.close()
    there.close()


def test_the_child_logs_as_the_scheduler_does_and_solves_beside_its_rounds(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A spawned child configures its logs as the scheduler's (level and format, on the
    stderr it shares): with --recompute-in-background its solve's line reaches them, once
    a later round has taken the recomputation a new job asked for."""
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    logs.configure_logging("info", "text")
    clock = Clock()
    config = settings(recompute_in_background=True)
    scheduler, _ = make_scheduler(config, clock=clock)
    child = DecisionProcess(config, decision_stages)
    try:
        register(scheduler, "w0", {"v100": 4})
        scheduler.submit(job_spec("first", 2), "")
        seen = ""

        def solved() -> bool:  # one round each try: the solve is taken at a later one
            nonlocal seen
            clock.now += 1.0
            child.decide(*snapshot_of(scheduler, clock.now))
            seen += capfd.readouterr().err
            return "allocation recomputed beside the rounds" in seen

        child.decide(*snapshot_of(scheduler, clock.now))  # the first x, in the round
        scheduler.submit(job_spec("second", 2), "")  # the next one is solved beside
        wait_until(solved, 60, "the child's solve never logged", interval=0.05)
        assert "info    gearshift.scheduler: allocation recomputed beside the rounds jobs=2" in seen
    finally:
        child.close()
        scheduler.stop()
        logs.configure_logging("info", "text", io.StringIO())  # stderr's setup forgotten
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]


def test_the_child_lends_a_copy_of_its_allocator_that_decides_as_it_does() -> None:
    """Estimated starts run the pipeline forward with the allocator that decides: the
    child's, memory of past rounds included, pickled across; running the copy leaves the
    child's own decisions as they were."""
    clock = Clock()
    config = settings()
    scheduler, _ = make_scheduler(config, clock=clock)
    child = DecisionProcess(config, decision_stages)
    try:
        assert child.lend_allocator() is None, "no child before its first decision"
        for i in range(4):
            register(scheduler, f"w{i}", {("v100", "k80")[i % 2]: 2})
        for i in range(8):
            scheduler.submit(job_spec(f"j{i}", 1 + i % 3), "")
        for _ in range(3):
            clock.now += 20.0
            snapshot, current = snapshot_of(scheduler, clock.now)
            child.decide(snapshot, current)
            scheduler.run_round()
        lent = child.lend_allocator()
        assert lent is not None
        clock.now += 20.0
        snapshot, current = snapshot_of(scheduler, clock.now)
        copied = InProcess(lent, collocator_for(config)).decide(snapshot, current)
        assert child.decide(snapshot, current) == copied
        assert copied[1], "a round that places nothing proves little"
        assert child.restarts == 0
    finally:
        child.close()
        scheduler.stop()
