"""Gavel's objectives over elastic configurations: hand-solved cases, mixing for D2 jobs,
hysteresis, and the configurations themselves."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gearshift.scheduler.plugins.gavel.elastic_rounds import ElasticRounds
from gearshift.scheduler.plugins.gavel.policies import make_policy, policy_names
from gearshift.scheduler.plugins.gavel.policies.base import PolicyInput
from gearshift.scheduler.plugins.gavel.policies.configs import Configurations
from gearshift.scheduler.round.ests import ElasticJob, configurations, elastic_job
from gearshift.scheduler.types import Device, JobSnapshot, Snapshot, config_of


def devices(**counts: int) -> tuple[Device, ...]:
    return tuple(
        Device(f"{kind}-{i}", 0, kind) for kind, n in sorted(counts.items()) for i in range(n)
    )


def job(
    job_id: str,
    ests: int,
    capability: dict[str, float],
    *,
    mixing: bool = False,
    current: tuple[tuple[str, int], ...] = (),
    efficiency: dict[int, float] | None = None,
    at: float = 0.0,
) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        num_ests=ests,
        min_devices=1,
        max_devices=ests,
        types=tuple(t for t, c in capability.items() if c > 0),
        capability=capability,
        throughputs={t: c * ests for t, c in capability.items()},
        steps_remaining=1e6,
        arrival_time=at,
        mixing=mixing,
        efficiency=efficiency or {},
        current=current,
        attained_seconds=100.0 if current else 0.0,
    )


def las_inputs(jobs: list[JobSnapshot], capacity: dict[str, int]) -> PolicyInput:
    types = sorted(capacity)
    rows = [configurations(elastic_job(j), capacity) for j in jobs]
    return PolicyInput.create(
        [j.job_id for j in jobs],
        types,
        [[j.capability.get(t, 0.0) for t in types] for j in jobs],
        [capacity[t] for t in types],
        configs=Configurations.build(types, rows),
        max_devices=[j.max_devices for j in jobs],
    )


def test_elastic_las_hand_case_two_types_three_jobs() -> None:
    """One V100, two K80s; jobs a and b run 4x faster on the V100, c alike on both (2 ESTs
    each, one type at a time). Equal shares weigh a type by its count (1/3, 2/3), so a
    and b's unit is 4/3 + 2/3 = 2 steps/s and c's is 1. Max-min by hand: c takes y K80
    device-seconds per second (level y); a and b split the V100 (rate 2 each) and the K80s
    left ((2 - y) / 2 each): level (2 + (2 - y) / 2) / 2. Equal at y = 1.2: every job's
    level is 1.2, and that uses every device."""
    jobs = [
        job("a", 2, {"v100": 4.0, "k80": 1.0}),
        job("b", 2, {"v100": 4.0, "k80": 1.0}),
        job("c", 2, {"v100": 1.0, "k80": 1.0}),
    ]
    inp = las_inputs(jobs, {"v100": 1, "k80": 2})
    result = make_policy("las").allocate_elastic(inp)
    assert inp.configs is not None
    x = np.zeros(inp.configs.num_rows)
    for r, (m, config) in enumerate(zip(inp.configs.job, inp.configs.configs, strict=True)):
        x[r] = result.shares[inp.job_ids[int(m)]].get(config, 0.0)
    rates = inp.configs.throughputs(x, 3)
    units = np.array([2.0, 2.0, 1.0])
    assert rates / units == pytest.approx([1.2, 1.2, 1.2], abs=1e-4)
    used = result.device_shares()
    assert sum(u["v100"] for u in used.values()) == pytest.approx(1.0, abs=1e-4)
    assert sum(u["k80"] for u in used.values()) == pytest.approx(2.0, abs=1e-4)
    assert used["c"]["v100"] == pytest.approx(0.0, abs=1e-6)  # c never takes the V100


def test_a_d2_job_whose_best_configuration_mixes_types_gets_it() -> None:
    """4 ESTs on one fast device (3 mini-batches/s per EST-slot) and one slow (1): the mix
    steps in max(3/3, 1/1) = 1 s (4 mini-batches/s), the fast one alone in 4/3 s."""
    speeds = {"fast": 3.0, "slow": 1.0}
    mixed = ElasticRounds(make_policy("las"), round_seconds=360)
    snap = Snapshot(1.0, devices(fast=1, slow=1), (job("a", 4, speeds, mixing=True),))
    target = mixed.allocate(snap)["a"]
    assert target.devices == (("fast", 1), ("slow", 1))
    assert dict(target.ests) == {"fast": (3,), "slow": (1,)}
    one_type = ElasticRounds(make_policy("las"), round_seconds=360)
    snap = Snapshot(1.0, devices(fast=1, slow=1), (job("a", 4, speeds),))
    assert one_type.allocate(snap)["a"].devices == (("fast", 1),)


@pytest.mark.parametrize(("hysteresis", "devices_after"), [(0.10, 2), (0.01, 3)])
def test_hysteresis_holds_a_resize_below_its_gain(hysteresis: float, devices_after: int) -> None:
    """A job on 2 V100s; a third would make it 5% faster (its scaling efficiency on 3
    devices). Below a 10% bound it stays where it is; with a 1% bound it grows."""
    speeds = {"v100": 1.0}
    eff = {1: 1.0, 2: 1.0, 3: 0.7}  # 6 ESTs: 2 devices x3 ESTs = 2/s; 3 x2 x0.7 = 2.1/s
    rounds = ElasticRounds(make_policy("las"), round_seconds=360, hysteresis=hysteresis)
    running = job("a", 6, speeds, current=(("v100", 2),), efficiency=eff)
    target = rounds.allocate(Snapshot(1.0, devices(v100=3), (running,)))["a"]
    assert target.size == devices_after


@pytest.mark.parametrize(
    ("exempt", "placed_ago", "kept"), [(60, 10, True), (0, 10, False), (60, 61, False)]
)
def test_a_new_placement_is_exempt_from_preemption_for_a_while(
    exempt: float, placed_ago: float, kept: bool
) -> None:
    """Job a runs on both V100s; b arrives (never ran: first, by Gavel's rule). Without an
    exemption, or once a's placement is older than it, b runs and a gives up devices;
    within it, a keeps both and b waits (Slurm's PreemptExemptTime)."""
    rounds = ElasticRounds(make_policy("las"), round_seconds=360, preempt_exempt_seconds=exempt)
    now = 1000.0
    a = replace(job("a", 2, {"v100": 1.0}, current=(("v100", 2),)), placed_at=now - placed_ago)
    targets = rounds.allocate(Snapshot(now, devices(v100=2), (a, job("b", 2, {"v100": 1.0}))))
    assert ("a" in targets and targets["a"].size == 2) == kept
    assert ("b" in targets) != kept


@pytest.mark.parametrize(("exempt", "size"), [(60, 1), (0, 2)])
def test_an_exempt_job_is_not_grown_either(exempt: float, size: int) -> None:
    """A job alone on one of two V100s would double its rate on both; within its exemption
    it keeps its placement (a resize is a restart too)."""
    rounds = ElasticRounds(make_policy("las"), round_seconds=360, preempt_exempt_seconds=exempt)
    a = replace(job("a", 2, {"v100": 1.0}, current=(("v100", 1),)), placed_at=995.0)
    assert rounds.allocate(Snapshot(1000.0, devices(v100=2), (a,)))["a"].size == size


@pytest.mark.parametrize(("budget", "moved"), [(0, 4), (2, 2), (10, 4)])
def test_moves_per_round_are_bounded_the_oldest_placements_first(budget: int, moved: int) -> None:
    """Four jobs run on the four V100s, one each; four new jobs arrive and Gavel's rule puts
    them first, so the round would preempt all four. With at most 2 moves a round, the two
    placed earliest (r0, r1) give way and the others keep running."""
    rounds = ElasticRounds(make_policy("las"), round_seconds=360, max_moves_per_round=budget)
    running = [
        replace(job(f"r{i}", 1, {"v100": 1.0}, current=(("v100", 1),)), placed_at=100.0 * i)
        for i in range(4)
    ]
    new = [job(f"n{i}", 1, {"v100": 1.0}) for i in range(4)]
    targets = rounds.allocate(Snapshot(1000.0, devices(v100=4), (*running, *new)))
    kept = [j.job_id for j in running if j.job_id in targets]
    assert len(running) - len(kept) == moved
    assert sum(j.job_id in targets for j in new) == moved
    if budget == 2:
        assert kept == ["r2", "r3"]


def test_no_runnable_job_is_an_empty_allocation_not_an_error() -> None:
    """Jobs that can run on no type present (their only type's workers are gone): every
    objective answers nothing to run, where the LP alone would be unbounded."""
    inp = PolicyInput.create(["a", "b"], ["cpu"], [[0.0], [0.0]], [4])
    for name in policy_names():
        assert make_policy(name).allocate(inp).fractions.sum() == 0, name


def test_configurations_leave_out_devices_that_do_not_help() -> None:
    """8 ESTs on one type: 5, 6 or 7 devices step no faster than 4 (two ESTs on the busiest
    device), so they are never offered; a D1 job has no mixed configuration."""
    model = ElasticJob("a", 8, 1, 8, {"v100": 1.0, "k80": 0.5}, mixing=False)
    rows = dict(configurations(model, {"v100": 8, "k80": 8}))
    assert {n for c in rows for t, n in c if t == "v100"} == {1, 2, 3, 4, 8}
    assert all(len(c) == 1 for c in rows)
    mixing = dict(
        configurations(
            ElasticJob("a", 8, 1, 8, {"v100": 1.0, "k80": 0.5}),
            {
                "v100": 8,
                "k80": 8,
            },
        )
    )
    assert config_of({"v100": 1, "k80": 1}) in mixing  # 1/1 vs 1/0.5: 8 ESTs as 5+3 -> 5/s
