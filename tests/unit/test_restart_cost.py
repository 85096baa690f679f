"""Moves that pay for themselves (issue 49): every allocator weighs a move against the job's
restart seconds, and a new placement keeps its residency; the simulator charges restarts,
the first start included, and reports them per job."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gearshift.common.gavel import JobKey, ThroughputTable, load_throughputs
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.registry import LasArgs, ObjectiveArgs, Point, plugin
from gearshift.scheduler.round.restart_cost import Reallocated, RestartCost, work_gain
from gearshift.scheduler.sim.simulate import parse_prior
from gearshift.scheduler.sim.simulator import restart_seconds_of, simulate_pipeline
from gearshift.scheduler.sim.trace import TraceJob
from gearshift.scheduler.types import Config, Device, JobSnapshot, Ran, Snapshot

RESTART = 57.0
RULE = RestartCost(residency_multiple=30.0, horizon_seconds=3600.0)
RESIDENCY = replace(RULE, share_multiple=0.0)  # the residency alone: every round may re-share


def test_a_move_is_made_only_when_its_gain_over_the_horizon_beats_its_cost() -> None:
    # 1 -> 2 steps/s: over a 100 s horizon it gains 100 steps, restarting loses 2 x 57.
    assert not RULE.move_pays(1.0, 2.0, steps_remaining=100.0, restart_seconds=RESTART)
    assert RULE.move_pays(1.0, 2.0, steps_remaining=1000.0, restart_seconds=RESTART)
    # The horizon is capped: a long job's tiny gain does not pay whatever its length.
    assert not RULE.move_pays(1.0, 1.01, steps_remaining=1e9, restart_seconds=RESTART)
    assert RULE.move_pays(0.0, 1.0, steps_remaining=1.0, restart_seconds=RESTART)  # a start


def test_residency_is_a_multiple_of_the_restart() -> None:
    assert RULE.resident(placed_at=0.0, now=30 * RESTART - 1, restart_seconds=RESTART)
    assert not RULE.resident(placed_at=0.0, now=30 * RESTART, restart_seconds=RESTART)
    # 60 s rounds at a 57 s restart: the restart is shorter than a round, 30 restarts.
    assert RULE.residency(RESTART, round_seconds=60.0) == 30 * RESTART
    # A restart counts one round at most: 1 s rounds at the live prior of 10 s share a
    # device every 30 s, not every 5 minutes.
    assert RULE.residency(10.0, round_seconds=1.0) == 30.0
    assert not RULE.resident(placed_at=0.0, now=30.0, restart_seconds=10.0, round_seconds=1.0)
    assert not RestartCost.off().resident(placed_at=0.0, now=1.0, restart_seconds=RESTART)
    with pytest.raises(ValueError, match="horizon_seconds"):
        RestartCost(horizon_seconds=0.0)


def _devices(count: int) -> tuple[Device, ...]:
    return tuple(Device(f"v100-{i}", 0, "v100") for i in range(count))


def _elastic(job_id: str, steps: float, current: Config = ()) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        num_ests=2,
        min_devices=1,
        max_devices=2,
        types=("v100",),
        capability={"v100": 1.0},
        throughputs={"v100": 2.0},
        steps_remaining=steps,
        arrival_time=0.0,
        efficiency={1: 1.0, 2: 1.0},
        current=current,
        attained_seconds=100.0 if current else 0.0,
        placed_at=9_990.0 if current else -math.inf,  # resident: it may still grow
        restart_seconds=RESTART,
    )


@pytest.mark.parametrize("name", ["las", "easyscale"])
@pytest.mark.parametrize(("steps", "grown"), [(100.0, False), (5000.0, True)])
def test_a_running_job_grows_only_when_the_gain_pays_its_restart(
    name: str, steps: float, grown: bool
) -> None:
    """A job on 1 of 2 free devices: doubling its rate gains `steps` over its remaining
    time; with 100 steps left that is below the 2 x 57 steps a restart costs."""
    allocator = make_allocator(name, elastic=True, round_seconds=60.0, restart=RULE)
    job = _elastic("a", steps, current=(("v100", 1),))
    targets = allocator.allocate(Snapshot(10_000.0, _devices(2), (job,)))
    assert targets["a"].devices == ((("v100", 2),) if grown else (("v100", 1),))


@pytest.mark.parametrize("name", ["las", "easyscale"])
def test_a_grow_in_place_is_weighed_at_its_own_cost(name: str) -> None:
    """The same job with 100 steps left: a restart (57 s) does not pay for the grow, but a
    grow in place keeps its device and costs 0.3 s (round.rescaleInPlace), which does. A
    move that keeps nothing still costs the restart: JobSnapshot.change_seconds."""
    allocator = make_allocator(name, elastic=True, round_seconds=60.0, restart=RULE)
    job = replace(_elastic("a", 100.0, current=(("v100", 1),)), resize_seconds=0.3)
    targets = allocator.allocate(Snapshot(10_000.0, _devices(2), (job,)))
    assert targets["a"].devices == (("v100", 2),)
    assert (job.change_seconds(keeps_devices=True), job.change_seconds(False)) == (0.3, RESTART)
    assert replace(job, resize_seconds=None).change_seconds(keeps_devices=True) == RESTART


def test_without_the_rule_the_paper_allocators_move_for_any_gain() -> None:
    allocator = make_allocator("easyscale", elastic=True)
    job = _elastic("a", 100.0, current=(("v100", 1),))
    targets = allocator.allocate(Snapshot(10_000.0, _devices(2), (job,)))
    assert targets["a"].devices == (("v100", 2),)


def _rigid(
    job_id: str,
    arrival: float,
    current: Config = (),
    placed_at: float = -math.inf,
    attained: float = 0.0,
) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        num_ests=1,
        min_devices=1,
        max_devices=1,
        types=("v100",),
        capability={"v100": 1.0},
        throughputs={"v100": 1.0},
        steps_remaining=1e6,
        arrival_time=arrival,
        current=current,
        placed_at=placed_at,
        attained_seconds=attained,
        restart_seconds=RESTART,
    )


@pytest.mark.parametrize(
    ("since", "attained", "preempted"),
    [(60.0, 60.0, False), (30 * RESTART, 60.0, True), (60.0, 0.0, True)],
)
def test_a_priority_flip_inside_the_residency_does_not_preempt(
    since: float, attained: float, preempted: bool
) -> None:
    """Rigid LAS, one device, job a running since t=0 and job b waiting (it ran before):
    once a has run a round more than b, b's priority (X / its share of time received) is the
    higher; inside a's residency (30 x 57 s) a stays all the same. A job that never ran is
    served as Gavel serves it, residency or not. (The residency alone: every round may
    re-share; the share period is tested below.)"""
    allocator = make_allocator("las", round_seconds=60.0, restart=RESIDENCY)
    assert set(allocator.allocate(Snapshot(0.0, _devices(1), (_rigid("a", 0.0),)))) == {"a"}
    running = _rigid("a", 0.0, current=(("v100", 1),), placed_at=0.0)
    waiting = _rigid("b", since - 1, attained=attained)
    tie = allocator.allocate(Snapshot(since, _devices(1), (running, waiting)))
    assert set(tie) == {"a"}  # equal shares received since X was recomputed: arrival order
    ran = (Ran("a", (("v100", 1),), 60.0),)
    later = Snapshot(since + 60.0, _devices(1), (running, waiting), ran)
    assert set(allocator.allocate(later)) == ({"b"} if preempted else {"a"})


@pytest.mark.parametrize(
    ("round_seconds", "restart", "held"), [(1.0, 10.0, 30.0), (60.0, 57.0, 30 * 57.0)]
)
def test_rounds_shorter_than_a_restart_still_share_a_device(
    round_seconds: float, restart: float, held: float
) -> None:
    """Rigid LAS, one device, two started jobs: the running one keeps it for 30 restarts, a
    restart counted one round at most (1 s rounds at 10 s: 30 s; 60 s rounds at 57 s: 28.5
    minutes), then the other gets its turn (the residency alone, as above)."""
    allocator = make_allocator("las", round_seconds=round_seconds, restart=RESIDENCY)

    def snapshot(now: float, ran: tuple[Ran, ...] = ()) -> Snapshot:
        a = replace(
            _rigid("a", 0.0, current=(("v100", 1),), placed_at=0.0, attained=now),
            restart_seconds=restart,
        )
        b = replace(_rigid("b", 0.0, attained=1.0), restart_seconds=restart)
        return Snapshot(now, _devices(1), (a, b), ran)

    assert set(allocator.allocate(snapshot(0.0))) == {"a"}
    for now in np.arange(round_seconds, held, round_seconds):  # a's residency
        ran = (Ran("a", (("v100", 1),), round_seconds),)
        assert set(allocator.allocate(snapshot(float(now), ran))) == {"a"}, now
    ran = (Ran("a", (("v100", 1),), round_seconds),)
    assert set(allocator.allocate(snapshot(held, ran))) == {"b"}


ON_V100 = (("v100", 1),)


def _ran(*job_ids: str) -> tuple[Ran, ...]:
    return tuple(Ran(j, ON_V100, 60.0) for j in job_ids)


@pytest.mark.parametrize(("share_multiple", "turn"), [(8.0, 480.0), (0.0, 60.0)])
def test_between_shares_a_running_job_keeps_its_devices(share_multiple: float, turn: float) -> None:
    """Rigid LAS, one device, 60 s rounds, no residency: b's priority passes a's after a
    round. With the share period (8 x 57 s = 456 s) a runs until the round nearest its end
    (480 s), as a 360 s round would keep it; without it the device flips every round."""
    rule = RestartCost(0.0, 3600.0, share_multiple=share_multiple)
    allocator = make_allocator("las", round_seconds=60.0, restart=rule)

    def snapshot(now: float) -> Snapshot:
        a = _rigid("a", 0.0, current=ON_V100, placed_at=0.0, attained=now)
        b = _rigid("b", 0.0, attained=1.0)
        return Snapshot(now, _devices(1), (a, b), _ran("a") if now else ())

    assert set(allocator.allocate(snapshot(0.0))) == {"a"}
    for now in np.arange(60.0, turn, 60.0):
        assert set(allocator.allocate(snapshot(float(now)))) == {"a"}, now
    assert set(allocator.allocate(snapshot(turn))) == {"b"}


@pytest.mark.parametrize("share_multiple", [8.0, 0.0])
def test_a_newcomer_lifts_only_residencies_that_lasted_a_share_period(
    share_multiple: float,
) -> None:
    """Two devices, 60 s rounds. c, n1 and n2 arrive between two shares: c, first in line,
    starts at once on the free device (X is brought up to date without waiting for the
    share). At the next share n1 and n2 still wait and rank first (Gavel's deficits): a,
    placed a period ago, yields to one of them; c, placed a round ago, keeps its device for
    a period, as a 360 s round would keep it. Without the share period every residency
    lapses and both newcomers take the devices."""
    rule = replace(RULE, share_multiple=share_multiple)
    allocator = make_allocator("las", round_seconds=60.0, restart=rule)
    assert set(allocator.allocate(Snapshot(0.0, _devices(2), (_rigid("a", 0.0),)))) == {"a"}
    a = _rigid("a", 0.0, current=ON_V100, placed_at=0.0, attained=420.0)
    newcomers = (_rigid("n1", 410.0), _rigid("n2", 410.0))
    between = Snapshot(420.0, _devices(2), (a, _rigid("c", 400.0), *newcomers), _ran("a"))
    assert set(allocator.allocate(between)) == {"a", "c"}
    a = replace(a, attained_seconds=480.0)
    c = _rigid("c", 400.0, current=ON_V100, placed_at=420.0, attained=60.0)
    share = Snapshot(480.0, _devices(2), (a, c, *newcomers), _ran("a", "c"))
    expected = {"c", "n1"} if share_multiple else {"n1", "n2"}
    assert set(allocator.allocate(share)) == expected


@pytest.mark.parametrize(("steps_left", "kept"), [(100.0, True), (1e6, False)])
def test_a_job_about_to_finish_keeps_its_devices_at_a_share(steps_left: float, kept: bool) -> None:
    """One device, a newcomer waits at a share and a's residency has lasted a period: a
    yields to it, unless a ends before the next share (100 s left against 456 s), when the
    flip would buy the newcomer less than a restart of a costs."""
    allocator = make_allocator("las", round_seconds=60.0, restart=RULE)
    assert set(allocator.allocate(Snapshot(0.0, _devices(1), (_rigid("a", 0.0),)))) == {"a"}
    a = replace(
        _rigid("a", 0.0, current=ON_V100, placed_at=0.0, attained=420.0),
        steps_remaining=steps_left,
    )
    n = _rigid("n", 410.0)
    assert set(allocator.allocate(Snapshot(420.0, _devices(1), (a, n), _ran("a")))) == {"a"}
    a = replace(a, attained_seconds=480.0)
    share = Snapshot(480.0, _devices(1), (a, n), _ran("a"))
    assert set(allocator.allocate(share)) == ({"a"} if kept else {"n"})


def _scaling(job_id: str, curve: dict[int, float], **kw: Any) -> JobSnapshot:
    """A job of as many ESTs as `curve` has device counts, scaling by it (Eq. 1's efficiency)."""
    devices = max(curve)
    return JobSnapshot(
        job_id=job_id,
        num_ests=devices,
        min_devices=1,
        max_devices=devices,
        types=("v100",),
        capability={"v100": 1.0},
        throughputs={"v100": devices * curve[devices]},
        steps_remaining=1e6,
        arrival_time=0.0,
        efficiency=curve,
        restart_seconds=RESTART,
        **kw,
    )


SUBLINEAR = {1: 1.0, 2: 0.9, 3: 0.6, 4: 0.5}  # 1, 1.8, 1.8 and 2 steps/s
LINEAR = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}


@pytest.mark.parametrize(("curve", "shrunk"), [(SUBLINEAR, True), (LINEAR, False)])
def test_a_resident_job_is_shrunk_for_another_only_when_that_pays_for_both(
    curve: dict[int, float], shrunk: bool
) -> None:
    """Elastic LAS, 4 devices: job a holds all four within its residency; job b (1 device,
    it ran before, so not served first as a newcomer) waits. Shrinking a to 2 devices gains
    b's steps over a's horizon (1 device-second a second); a loses the rate it gives up and
    its restart at the new rate. Sublinear, a's last two devices add 0.2 steps/s: it pays.
    At linear scaling they add as much as b gains, and the restart is lost: a keeps
    its four devices, and b waits for the residency's end."""
    allocator = make_allocator("las", elastic=True, round_seconds=60.0, restart=RULE)
    a = _scaling("a", curve, current=(("v100", 4),), attained_seconds=100.0, placed_at=9_990.0)
    b = _scaling("b", {1: 1.0}, attained_seconds=50.0)
    targets = allocator.allocate(Snapshot(10_000.0, _devices(4), (a, b)))
    if shrunk:
        assert targets["a"].devices == (("v100", 2),) and targets["b"].devices == (("v100", 1),)
    else:
        assert targets["a"].devices == (("v100", 4),) and "b" not in targets
    # Without the rule the objective shrinks a whatever the scaling; a job that never ran is
    # served first (as Gavel serves newcomers), the residency yielding to it.
    for other, rule in ((b, None), (replace(b, attained_seconds=0.0), RULE)):
        free = make_allocator("las", elastic=True, round_seconds=60.0, restart=rule)
        targets = free.allocate(Snapshot(10_000.0, _devices(4), (a, other)))
        assert targets["a"].devices == (("v100", 2),) and targets["b"].devices == (("v100", 1),)


@pytest.mark.parametrize(("curve", "kept"), [(SUBLINEAR, False), (LINEAR, True)])
def test_easyscale_hands_a_running_job_its_devices_back_unless_others_gain_more(
    curve: dict[int, float], kept: bool
) -> None:
    """EasyScale's greedy from the current placement, 5 devices: job a runs on four, job b
    (up to 2 devices, linear) arrives. Both get their minimum; a gets its other devices
    back only when that gains more work over the horizon than the greedy's use of them:
    not when a's third and fourth devices add 0.2 steps/s and b's second adds 1."""
    allocator = make_allocator("easyscale", elastic=True, restart=RULE)
    a = _scaling("a", curve, current=(("v100", 4),), attained_seconds=100.0, placed_at=9_990.0)
    b = _scaling("b", {1: 1.0, 2: 1.0})
    targets = allocator.allocate(Snapshot(10_000.0, _devices(5), (a, b)))
    expected = {"a": 4, "b": 1} if kept else {"a": 2, "b": 2}
    assert {j: t.devices[0][1] for j, t in targets.items()} == expected


def test_the_work_a_reallocation_gains_counts_every_job_it_changes() -> None:
    """A resident at 3 steps/s shrunk to 2 (one device given up) for a job that gains 1
    step/s on it, over a 3,600 s horizon, a 57 s restart: +3,600 - 3,600 - 2 x 57."""
    shrunk = Reallocated(1.0, 1e9, RESTART, 3.0, False, 2.0, True)
    admitted = Reallocated(1.0, 1e9, RESTART, 0.0, False, 1.0, False)
    assert work_gain([shrunk, admitted], 3600.0) == pytest.approx(-2 * RESTART)
    faster = replace(admitted, rate_with=1.5)  # the device is worth more to the newcomer
    assert work_gain([shrunk, faster], 3600.0) == pytest.approx(1800.0 - 2 * RESTART)
    short = replace(faster, steps_remaining=10.0)  # it needs the device 10 steps' time only
    assert work_gain([shrunk, short], 3600.0) < 0


def test_the_plugins_arguments_turn_the_rule_on_by_default() -> None:
    assert ObjectiveArgs().restart_cost() == RestartCost(30.0, 3600.0)
    assert ObjectiveArgs(restart_aware=False).restart_cost() is None
    # LAS, the default profile's objective, has Sia's re-allocation factor on
    assert LasArgs().restart_cost() == RestartCost(30.0, 3600.0, realloc_factor=True)
    las, ftf = plugin(Point.ALLOCATE, "las"), plugin(Point.ALLOCATE, "finish_time_fairness")
    assert las is not None and las.args is LasArgs
    assert ftf is not None and ftf.args is ObjectiveArgs


def test_the_prior_is_per_model_longest_match_first() -> None:
    prior = parse_prior("ResNet=50, resnet-50=120,LM=60")
    assert restart_seconds_of("ResNet-50 (batch size 64)", prior, 10.0) == 120.0
    assert restart_seconds_of("ResNet-18 (batch size 32)", prior, 10.0) == 50.0
    assert restart_seconds_of("Transformer (batch size 16)", prior, 10.0) == 10.0
    with pytest.raises(Exception, match="MODEL=SECONDS"):
        parse_prior("ResNet=-1")


@pytest.fixture(scope="module")
def table(gavel_data: Path) -> ThroughputTable:
    return load_throughputs(gavel_data / "simulation_throughputs.json")


@pytest.mark.parametrize("first", [False, True])
def test_the_simulator_charges_restarts_and_reports_them_per_job(
    table: ThroughputTable, first: bool
) -> None:
    job = TraceJob("ResNet-18 (batch size 32)", total_steps=1000, scale_factor=1, arrival_time=0.0)
    alone = simulate_pipeline([job], {"v100": 1}, table, make_allocator("las"))
    charged = simulate_pipeline(
        [job],
        {"v100": 1},
        table,
        make_allocator("las"),
        rescale_seconds=5.0,
        restart_prior={"resnet-18": RESTART},
        charge_first_start=first,
    )
    lost = RESTART if first else 0.0
    assert charged.jobs[0].restart_seconds_lost == pytest.approx(lost)
    assert charged.average_jct == pytest.approx(alone.average_jct + lost, rel=1e-3)
    assert charged.to_json()["restart_seconds_lost"] == pytest.approx(lost)


def test_a_restart_longer_than_a_round_holds_up_no_other_job(table: ThroughputTable) -> None:
    """Gavel's rounds end when the last job has done its steps. A job restarting for 300 s in
    60 s rounds does no step until its restart is over; the other job's rounds stay 60 s, so
    it ends as it would alone (it used to wait out the restart every round)."""
    resnet = TraceJob(
        "ResNet-18 (batch size 32)", total_steps=20_000, scale_factor=1, arrival_time=0.0
    )
    transformer = TraceJob("Transformer (batch size 16)", 20_000, 1, 0.0)
    alone = simulate_pipeline(
        [resnet], {"v100": 2}, table, make_allocator("las"), round_seconds=60.0
    )
    both = simulate_pipeline(
        [resnet, transformer],
        {"v100": 2},
        table,
        make_allocator("las", round_seconds=60.0),
        round_seconds=60.0,
        restart_prior={"transformer": 300.0},
        charge_first_start=True,
    )
    assert both.jobs[0].jct == pytest.approx(alone.jobs[0].jct, rel=1e-3)  # rounds: int(steps)
    assert both.jobs[1].restart_seconds_lost == pytest.approx(300.0)


def _short_jobs(table: ThroughputTable, seed: int) -> list[TraceJob]:
    """Sia's Philly workloads in miniature: an arrival every 3 minutes, mostly 10-30 minute
    jobs on 1-4 devices, a few of 2-4 hours."""
    rng = random.Random(seed)
    model, now, jobs = "ResNet-18 (batch size 32)", 0.0, []
    for _ in range(60):
        now += rng.expovariate(1 / 180.0)
        devices = rng.choice([1, 1, 2, 2, 4])
        minutes = rng.choice([10, 15, 20, 30]) if rng.random() < 0.85 else rng.choice([120, 240])
        steps = minutes * 60 * table.throughput(JobKey(model, devices), "v100")
        jobs.append(TraceJob(model, int(steps), devices, now))
    return jobs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_short_rounds_never_hurt_rigid_las(table: ThroughputTable, seed: int) -> None:
    """Issue 49's "short rounds never hurt" on short jobs with 100 s restarts, 8 devices:
    with the share period 60 s rounds do at least as well as 360 s rounds; with the
    residency alone (every round re-shares) they flip jobs and lose a third or more."""
    jobs = _short_jobs(table, seed)

    def jct(rule: RestartCost, round_seconds: float) -> float:
        allocator = make_allocator("las", round_seconds=round_seconds, restart=rule)
        return simulate_pipeline(
            jobs,
            {"v100": 8},
            table,
            allocator,
            round_seconds=round_seconds,
            rescale_seconds=100.0,
            charge_first_start=True,
        ).average_jct

    assert jct(RULE, 60.0) <= 1.0 * jct(RULE, 360.0)
    assert jct(RESIDENCY, 60.0) > 1.25 * jct(RESIDENCY, 360.0)


def test_sias_realloc_factor_is_the_share_of_time_restarts_leave() -> None:
    sia = RestartCost(realloc_factor=True)
    # Sia's sia.py: max(age - restarts x restart, 0) / (age + restart)
    assert sia.factor(10_000.0, 4, 1000.0) == pytest.approx(6000.0 / 11_000.0)
    assert sia.factor(10_000.0, 20, 1000.0) == 0.0
    assert sia.factor(500.0, 3, 1000.0) == 1.0  # younger than a restart: not penalized
    assert RULE.factor(10_000.0, 4, 1000.0) == 1.0  # off by default
    assert ObjectiveArgs(realloc_factor=True).restart_cost() == RestartCost(
        30.0, 3600.0, realloc_factor=True
    )


@pytest.mark.parametrize(
    ("factor", "restarted", "grown"), [(False, 5, True), (True, 0, True), (True, 5, False)]
)
def test_a_job_whose_restarts_ate_its_time_is_not_grown(
    factor: bool, restarted: int, grown: bool
) -> None:
    """Elastic LAS, job a (restart 1,000 s, arrived at 0) on 1 device; at t=10,000 a second
    device frees. Doubling its rate pays its restart over the horizon (3,600 steps against
    2,000). With Sia's factor, after 5 restarts since its first start, its rate on 2
    devices counts (10,000 - 5,000) / 11,000 = 0.45 times: 0.91 steps/s, not worth leaving
    its 1 step/s for; with none, 0.91 times: 1.82."""
    rule = replace(RULE, realloc_factor=factor)
    allocator = make_allocator("las", elastic=True, round_seconds=60.0, restart=rule)
    job = replace(_elastic("a", 1e6, current=(("v100", 1),)), restart_seconds=1000.0)
    for k in range(restarted + 1):  # its first placement, then one per restart
        placed = replace(job, placed_at=1000.0 * k)
        allocator.allocate(Snapshot(1000.0 * k + 1.0, _devices(1), (placed,)))
    last = replace(job, placed_at=1000.0 * restarted)
    targets = allocator.allocate(Snapshot(10_000.0, _devices(2), (last,)))
    assert targets["a"].devices == ((("v100", 2),) if grown else (("v100", 1),))
