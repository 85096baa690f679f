"""EasyScale Eq. 1 and the EST planner, on hand-checked cases and against brute force."""

from __future__ import annotations

import itertools
import random

import pytest

from gearshift.common.estplan import (
    DeviceOffer,
    assign,
    eq1_throughput,
    plan_ests,
    plan_on,
    scale_out_proposals,
    step_time,
)


def test_eq1_with_the_ni_factor_matches_the_notes_example() -> None:
    # 2 V100 (C=2) + 1 P100 (C=1), maxP=4, A_V=1, A_P=2: f=2, throughput 2.0
    # (the printed form without N_i would give 3.5).
    value = eq1_throughput(
        4, {"v100": 2, "p100": 1}, {"v100": 1, "p100": 2}, {"v100": 2, "p100": 1}
    )
    assert value == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("counts", "per_device", "capability", "max_p"),
    [
        ({"v100": 4}, {"v100": 1}, {"v100": 3.0}, 4),
        ({"v100": 2}, {"v100": 2}, {"v100": 3.0}, 4),
        ({"v100": 1, "p100": 2}, {"v100": 2, "p100": 1}, {"v100": 2.0, "p100": 1.0}, 4),
        ({"v100": 3}, {"v100": 2}, {"v100": 2.0}, 5),  # over-provisioned: 6 slots for 5
    ],
)
def test_eq1_equals_maxp_over_f(counts, per_device, capability, max_p) -> None:
    f = max(per_device[t] / capability[t] for t in counts)
    assert eq1_throughput(max_p, counts, per_device, capability) == pytest.approx(max_p / f)


def test_eq1_refuses_too_few_slots() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        eq1_throughput(5, {"v100": 2}, {"v100": 2}, {"v100": 1.0})


def test_assign_balances_by_speed() -> None:
    assert assign(4, [2.0, 2.0, 1.0]) == [2, 1, 1]
    assert assign(4, [1.0, 1.0]) == [2, 2]
    assert assign(3, [3.0, 1.0]) == [2, 1]


def test_plan_prefers_fewest_devices_for_the_best_step() -> None:
    offers = [DeviceOffer("v100", 2, 2.0), DeviceOffer("p100", 1, 1.0)]
    plan = plan_ests(4, offers)
    assert plan is not None
    assert plan.devices_by_type() == {"v100": 2}
    assert plan.ests_per_device() == [2, 2]
    assert plan.minibatches_per_second == pytest.approx(4.0)


def test_plan_uses_one_device_per_est_when_that_is_fastest() -> None:
    plan = plan_ests(4, [DeviceOffer("v100", 8, 1.0)])
    assert plan is not None and plan.ests_per_device() == [1, 1, 1, 1]
    assert plan.steps_per_second == pytest.approx(1.0)


def test_equal_step_time_takes_the_slower_type() -> None:
    # Two ESTs: v100 + t4 or t4 + t4 both step in 1/3 s (the t4 is the bottleneck
    # either way), so the plan leaves the faster v100 to other jobs.
    plan = plan_ests(2, [DeviceOffer("v100", 1, 4.0), DeviceOffer("t4", 2, 3.0)])
    assert plan is not None
    assert plan.devices_by_type() == {"t4": 2}
    assert plan.minibatches_per_second == pytest.approx(6.0)


def test_bounds() -> None:
    offers = [DeviceOffer("v100", 4, 1.0)]
    capped = plan_ests(8, offers, max_devices=2)
    assert capped is not None and capped.ests_per_device() == [4, 4]
    assert plan_ests(8, offers, min_devices=5) is None
    widened = plan_ests(
        2, [DeviceOffer("v100", 1, 10.0), DeviceOffer("k80", 3, 1.0)], min_devices=2
    )
    assert widened is not None and widened.device_count == 2


def _brute_force(num_ests: int, offers: list[DeviceOffer], max_devices: int) -> float:
    best = 0.0
    ranges = [range(o.available + 1) for o in offers]
    for counts in itertools.product(*ranges):
        devices = sum(counts)
        if not 1 <= devices <= min(max_devices, num_ests):
            continue
        speeds = [
            o.minibatches_per_second for o, n in zip(offers, counts, strict=True) for _ in range(n)
        ]
        # every split with at least one EST per device
        for split in itertools.product(range(1, num_ests + 1), repeat=devices):
            if sum(split) == num_ests:
                best = max(best, num_ests / step_time(split, speeds))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_plan_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    offers = [
        DeviceOffer(f"t{i}", rng.randint(0, 3), rng.choice([0.5, 1.0, 1.5, 2.0, 3.0]))
        for i in range(rng.randint(1, 3))
    ]
    num_ests = rng.randint(1, 6)
    max_devices = rng.randint(1, 6)
    plan = plan_ests(num_ests, offers, max_devices=max_devices)
    expected = _brute_force(num_ests, offers, max_devices)
    if expected == 0.0:
        assert plan is None
    else:
        assert plan is not None
        assert plan.minibatches_per_second == pytest.approx(expected)
        assert sum(plan.ests_per_device()) == num_ests
        assert plan.device_count <= max_devices


def test_scale_out_proposals_rank_by_speedup() -> None:
    capability = {"v100": 2.0, "p100": 1.0}
    base = plan_on(8, {"v100": 2}, capability)
    assert base.minibatches_per_second == pytest.approx(4.0)  # 4 ESTs per V100
    proposals = scale_out_proposals(
        8, {"v100": 2}, [DeviceOffer("v100", 2, 2.0), DeviceOffer("p100", 2, 1.0)], top_k=3
    )
    assert (proposals[0].accelerator_type, proposals[0].additional_devices) == ("v100", 2)
    assert proposals[0].speedup == pytest.approx(2.0)
    assert all(p.speedup > 1 for p in proposals)
    assert len(proposals) == 3
