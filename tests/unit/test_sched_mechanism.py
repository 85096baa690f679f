"""Gavel's round mechanism step by step: ledger and priorities, ranking, greedy selection,
placement with lease renewal and consolidation, and when X is recomputed."""

from __future__ import annotations

import random

import pytest

from gearshift.scheduler.plugins.gavel.mechanism import (
    NEW_JOB_PRIORITY_SCALE,
    Candidate,
    Combo,
    JobView,
    Ledger,
    RoundScheduler,
    place,
    priorities,
    rank,
    select,
    type_order,
)
from gearshift.scheduler.plugins.gavel.policies import make_policy
from gearshift.scheduler.round import placement
from gearshift.scheduler.round.placement import consolidate
from gearshift.scheduler.types import Device, Target


def test_priority_is_share_over_fraction_received() -> None:
    ledger = Ledger(round_seconds=100)
    ledger.add(("a",), ["v100"])
    ledger.add(("b",), ["v100"])
    allocation: dict[Combo, dict[str, float]] = {("a",): {"v100": 0.5}, ("b",): {"v100": 0.5}}
    runnable: dict[Combo, dict[str, bool]] = {("a",): {"v100": True}, ("b",): {"v100": True}}
    # Nothing recorded yet since the reset (worker time 0): new jobs score X * 1e9.
    scores = priorities(allocation, ledger, runnable)["v100"]
    assert scores[("a",)] == pytest.approx(0.5 * NEW_JOB_PRIORITY_SCALE)
    ledger.reset(0.0, allocation)  # every entry back to half a round
    ledger.record(("a",), "v100", 300)
    scores = priorities(allocation, ledger, runnable)["v100"]
    # a: 350 of 400 seconds, b: 50 of 400 -> b is far behind its share.
    assert scores[("a",)] == pytest.approx(0.5 / (350 / 400))
    assert scores[("b",)] == pytest.approx(0.5 / (50 / 400))
    assert scores[("b",)] > scores[("a",)]


def test_reset_accumulates_deficits() -> None:
    ledger = Ledger(round_seconds=100)
    ledger.add(("a",), ["v100"])
    allocation: dict[Combo, dict[str, float]] = {("a",): {"v100": 1.0}}
    ledger.record(("a",), "v100", 200)
    ledger.reset(1000.0, allocation)
    # Should have had 1000 s, received 200 s.
    assert ledger.deficits["v100"][("a",)] == pytest.approx(800)
    assert ledger.job_time[("a",)]["v100"] == 50


def test_rank_orders_by_priority_then_deficit_then_share() -> None:
    ledger = Ledger(round_seconds=100)
    for job in ("a", "b", "c"):
        ledger.add((job,), ["v100"])
    ledger.deficits["v100"][("c",)] = 5.0
    scores: dict[str, dict[Combo, float]] = {"v100": {("a",): 1.0, ("b",): 2.0, ("c",): 1.0}}
    allocation: dict[Combo, dict[str, float]] = {
        ("a",): {"v100": 0.9},
        ("b",): {"v100": 0.1},
        ("c",): {"v100": 0.2},
    }
    ranked = [c.combo for c in rank(scores, ledger, allocation, ["v100"])]
    assert ranked == [("b",), ("c",), ("a",)]


def test_rank_leaves_out_jobs_not_in_x() -> None:
    ledger = Ledger(round_seconds=100)
    ledger.add(("a",), ["v100"])
    ledger.add(("new",), ["v100"])
    scores: dict[str, dict[Combo, float]] = {"v100": {("a",): 1.0, ("new",): 0.0}}
    allocation: dict[Combo, dict[str, float]] = {("a",): {"v100": 1.0}}
    ranked = rank(scores, ledger, allocation, ["v100"])
    assert [c.combo for c in ranked] == [("a",)]


def cand(job: str, kind: str, priority: float) -> Candidate:
    return Candidate((job,), kind, priority, 0.0, 0.5)


def test_select_respects_scale_factors_and_one_type_per_job() -> None:
    ranked = [
        cand("big", "v100", 9.0),
        cand("a", "v100", 8.0),
        cand("a", "k80", 7.0),
        cand("b", "v100", 6.0),
        cand("c", "k80", 0.0),
    ]
    size: dict[Combo, int] = {("big",): 4, ("a",): 1, ("b",): 1, ("c",): 1}
    runnable: dict[Combo, dict[str, bool]] = {c: {"v100": True, "k80": True} for c in size}
    chosen = select(ranked, {"v100": 3, "k80": 1}, size, runnable)
    # big does not fit on 3 V100s; a takes a V100 (and so not the K80); b the next V100;
    # the idle K80 goes to c even with priority 0 (work conserving)...
    assert chosen == {"v100": [("a",), ("b",)], "k80": [("c",)]}
    # ... unless the policy says idle devices stay idle (Gavel's FIFO).
    fifo = select(ranked, {"v100": 3, "k80": 1}, size, runnable, skip_zero_priority=True)
    assert fifo == {"v100": [("a",), ("b",)], "k80": []}


def devices(worker: str, kind: str, count: int) -> list[Device]:
    return [Device(worker, i, kind) for i in range(count)]


def test_place_keeps_a_job_on_its_devices_and_consolidates_the_rest() -> None:
    free = [*devices("w1", "v100", 4), *devices("w2", "v100", 2)]
    previous: dict[Combo, tuple[Device, ...]] = {("a",): (Device("w1", 2, "v100"),)}
    chosen: dict[str, list[Combo]] = {"v100": [("a",), ("b",), ("c",)]}
    size: dict[Combo, int] = {("a",): 1, ("b",): 2, ("c",): 2}
    out = place(chosen, size, free, previous)
    assert out[("a",)] == (Device("w1", 2, "v100"),)  # lease renewal
    # Two-device jobs each land on one worker (best fit: the smallest that holds them).
    for combo in (("b",), ("c",)):
        assert len({d.worker_id for d in out[combo]}) == 1
    assert len({d for ds in out.values() for d in ds}) == 5


def test_a_pair_whose_members_each_held_a_device_shares_one() -> None:
    """a and b ran alone last round, each on its own V100; now they share one and c needs
    the other. Each member keeping its device would take both and leave c out."""
    free = devices("w1", "v100", 2)
    v100 = (("v100", 1),)
    targets = {
        "a": Target("a", v100, {"v100": (1,)}, ("b",), "shared"),
        "b": Target("b", v100, {"v100": (1,)}, ("a",), "shared"),
        "c": Target("c", v100, {"v100": (1,)}),
    }
    current = {"a": [(free[0], 1)], "b": [(free[1], 1)]}
    out = placement.place(targets, free, current)
    assert [d for d, _ in out["a"]] == [d for d, _ in out["b"]] == [free[0]]
    assert [d for d, _ in out["c"]] == [free[1]]


def test_packed_ledger_holds_every_pair_from_arrival_as_gavel_does() -> None:
    """Gavel's ledger has an entry for every pair of jobs of one scale factor, at 0 s until
    the next reset gives it half a round like the others, so each type's total counts it."""
    sched = RoundScheduler(make_policy("las_packed"), round_seconds=10)
    capacity = {"v100": 1}
    for job in ("a", "b"):
        sched.add_job(view(job, speeds={"v100": 1.0}), capacity)
    assert sched.ledger.job_time[("a", "b")] == {"v100": 0.0}
    sched.ledger.reset(10.0, {})
    assert sched.ledger.job_time[("a", "b")] == {"v100": 5.0}
    assert sched.ledger.worker_time["v100"] == 15.0


def test_consolidate_spreads_only_when_no_worker_fits() -> None:
    pool = {"w1": devices("w1", "v100", 3), "w2": devices("w2", "v100", 2)}
    assert {d.worker_id for d in consolidate(pool, 2) or ()} == {"w2"}
    spread = consolidate(pool, 4)
    assert spread is not None and len(spread) == 4
    assert consolidate(pool, 6) is None


def test_type_order_fastest_first_or_shuffled() -> None:
    speed = {"k80": 1.0, "v100": 3.0, "p100": 2.0}
    assert type_order(["k80", "p100", "v100"], speed, None) == ["v100", "p100", "k80"]
    shuffled = {
        tuple(type_order(["k80", "p100", "v100"], speed, random.Random(s))) for s in range(20)
    }
    assert len(shuffled) > 1


def view(job: str, sf: int = 1, speeds: dict[str, float] | None = None) -> JobView:
    return JobView(job, sf, speeds or {"v100": 2.0, "k80": 1.0}, 1000, 0.0)


def test_round_scheduler_recomputes_on_events_spaced_by_the_minimum() -> None:
    sched = RoundScheduler(make_policy("las"), round_seconds=10, min_recompute_seconds=100)
    capacity = {"v100": 1, "k80": 1}
    free = [Device("w1", 0, "v100"), Device("w2", 0, "k80")]
    sched.add_job(view("a"), capacity)
    first = sched.plan(capacity, free, now=1000.0)
    assert first.recomputed and set(first.placements) == {("a",)}
    sched.add_job(view("b"), capacity)
    # b arrived, but X was computed less than 100 s ago: b waits for the next computation.
    assert not sched.plan(capacity, free, now=1050.0).recomputed
    assert ("b",) not in sched.allocation
    later = sched.plan(capacity, free, now=1150.0)
    assert later.recomputed and set(later.placements) == {("a",), ("b",)}
    # Nothing changed: no recomputation.
    assert not sched.plan(capacity, free, now=1300.0).recomputed
    # A lost worker forces a recomputation whatever the spacing.
    sched.workers_changed()
    assert sched.plan({"v100": 1}, free[:1], now=1310.0).recomputed


def test_round_scheduler_renews_leases_and_shares_time() -> None:
    sched = RoundScheduler(make_policy("las"), round_seconds=10)
    capacity = {"v100": 1}
    free = [Device("w1", 0, "v100")]
    for job in ("a", "b"):
        sched.add_job(view(job, speeds={"v100": 1.0}), capacity)
    ran: list[str] = []
    for r in range(6):
        plan = sched.plan(capacity, free, now=r * 10.0)
        (combo,) = plan.placements
        ran.append(combo[0])
        sched.record(combo, "v100", 10.0)
    # One device, equal shares: the two jobs alternate (after the tie at the start).
    assert ran.count("a") == 3 and ran.count("b") == 3


def test_reference_fifo_overcommitted_type_is_time_shared() -> None:
    sched = RoundScheduler(make_policy("fifo", seed=0), round_seconds=10)
    capacity = {"v100": 1, "k80": 2}
    free = [Device("w1", 0, "v100"), Device("w2", 0, "k80"), Device("w2", 1, "k80")]
    for job in ("a", "b", "c"):
        sched.add_job(view(job, speeds={"v100": 1.0, "k80": 1.0}), capacity)
    seen: set[str] = set()
    for r in range(6):
        plan = sched.plan(capacity, free, now=r * 10.0)
        for combo, placed in plan.placements.items():
            assert len(placed) == 1
            seen.add(combo[0])
            sched.record(combo, plan.worker_type[combo], 10.0)
        assert len(plan.placements) <= 3  # never more than the devices
    given = {c[0] for c, row in sched.allocation.items() if max(row.values()) > 0}
    over = {kind: sum(1 for row in sched.allocation.values() if row[kind] > 0) for kind in capacity}
    assert max(over.values()) > 1  # a type holds more jobs than devices...
    assert seen == given  # ...and they take turns on it
