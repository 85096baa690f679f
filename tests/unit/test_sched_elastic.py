"""Elastic EST jobs: EasyScale's greedy inter-job policy and the YARN-CS baseline; the
placement of ESTs on devices."""

from __future__ import annotations

import pytest

from gearshift.scheduler.plugins.easyscale.elastic import EasyScale, YarnCs, proposals
from gearshift.scheduler.round.ests import ElasticJob, rate
from gearshift.scheduler.round.placement import (
    assign_ests,
    build_placement,
    local_ranks,
    place,
    placement_devices,
    same_devices,
    workers_of,
)
from gearshift.scheduler.types import Device, Target

SPEEDS = {"v100": 3.0, "k80": 1.0}


def job(job_id: str, ests: int, lo: int = 1, hi: int | None = None, at: float = 0.0) -> ElasticJob:
    return ElasticJob(job_id, ests, lo, hi if hi is not None else ests, SPEEDS, arrival_time=at)


def test_rate_is_eq1() -> None:
    # 4 ESTs on 2 V100 (C=3) + 1 K80 (C=1): best split 2+1 / 1 -> step 2/3 s... the slowest
    # device sets the step: max(a/C) with a = (2,1,1) -> max(2/3, 1/3, 1) = 1 -> 4 mb/s.
    assert rate(job("a", 4), {"v100": 2, "k80": 1}) == pytest.approx(4 / max(2 / 3, 1 / 1))
    assert rate(job("a", 4), {"v100": 4}) == pytest.approx(12.0)
    assert rate(job("a", 4), {}) == 0.0


def test_a_lone_job_scales_out_to_its_maximum() -> None:
    out = EasyScale().allocate([job("a", 4)], {"v100": 4, "k80": 4}, {})
    assert out["a"] == {"v100": 4}  # the fast devices first


def test_devices_that_would_slow_a_job_down_are_not_taken() -> None:
    # 4 ESTs on 2 V100s (2 each) step in 2/3 s; any K80 (one EST takes 1 s) only slows the
    # global step, so the K80s stay free.
    out = EasyScale().allocate([job("a", 4)], {"v100": 2, "k80": 4}, {})
    assert out["a"] == {"v100": 2}


def test_every_job_gets_its_minimum_before_anyone_scales_out() -> None:
    jobs = [job("a", 8, at=0), job("b", 8, at=1), job("c", 8, at=2)]
    out = EasyScale().allocate(jobs, {"v100": 4}, {})
    assert all(sum(out[j].values()) >= 1 for j in "abc")
    assert sum(sum(d.values()) for d in out.values()) == 4


def test_greedy_grants_the_highest_speedup_per_device() -> None:
    # a is already on 1 V100 with 2 ESTs; one more V100 doubles it (speedup 2 per device).
    # b has 1 EST: it can never use more than one device. So the spare V100 goes to a.
    jobs = [job("a", 2), job("b", 1)]
    out = EasyScale().allocate(jobs, {"v100": 3}, {})
    assert out == {"a": {"v100": 2}, "b": {"v100": 1}}
    assert proposals(jobs[1], {"v100": 1}, {"v100": 1}, heterogeneous=True) == []


def test_homogeneous_mode_keeps_one_type() -> None:
    out = EasyScale(heterogeneous=False).allocate([job("a", 4)], {"v100": 1, "k80": 3}, {})
    assert len(out["a"]) == 1
    mixed = EasyScale().allocate([job("a", 4)], {"v100": 1, "k80": 3}, {})
    assert set(mixed["a"]) == {"v100", "k80"}


def test_rigid_job_takes_all_its_devices_of_one_type_or_waits() -> None:
    rigid = job("r", 4, lo=4, hi=4)
    assert EasyScale().allocate([rigid], {"v100": 2, "k80": 4}, {}) == {"r": {"k80": 4}}
    assert EasyScale().allocate([rigid], {"v100": 2, "k80": 2}, {}) == {}


def test_yarn_cs_is_fifo_gang_and_non_preemptive() -> None:
    policy = YarnCs()
    jobs = [job("big", 4, at=0), job("small", 1, at=1)]
    # The head needs 4 of one type; only 3 are free: everyone waits behind it.
    assert policy.allocate(jobs, {"v100": 3}, {}) == {}
    # Running jobs keep their devices even when an older job waits.
    assert policy.allocate(jobs, {"v100": 3}, {"small": {"v100": 1}}) == {"small": {"v100": 1}}
    assert policy.allocate(jobs, {"v100": 2, "k80": 4}, {}) == {
        "big": {"k80": 4},
        "small": {"v100": 1},
    }


def dev(worker: str, index: int, kind: str = "v100") -> Device:
    return Device(worker, index, kind)


def test_placement_numbers_ests_across_ranks() -> None:
    placement = build_placement([(dev("w1", 0), 2), (dev("w2", 0, "k80"), 1), (dev("w1", 1), 1)])
    assert [list(p.est_ids) for p in placement.processes] == [[0, 1], [2], [3]]
    assert [p.rank for p in placement.processes] == [0, 1, 2]
    assert workers_of(placement) == ["w1", "w2"]
    assert local_ranks(placement, "w1") == [0, 2]
    assert placement_devices(placement)[1] == dev("w2", 0, "k80")
    with pytest.raises(ValueError):
        build_placement([(dev("w1", 0), 0)])


def test_assign_ests_pairs_counts_with_devices_by_type() -> None:
    devices = [dev("w1", 0), dev("w1", 1), dev("w2", 0, "k80")]
    out = assign_ests(devices, {"v100": [3, 3], "k80": [2]})
    assert out == [(dev("w1", 0), 3), (dev("w1", 1), 3), (dev("w2", 0, "k80"), 2)]
    with pytest.raises(ValueError):
        assign_ests(devices, {"k80": [1, 1]})


def test_a_moving_job_takes_its_free_devices_then_the_best_fit_for_the_rest() -> None:
    """It holds w1's device 0 and grows to 3: that device, then w1's other two (w1 holds
    just the 2 left once its device is counted out: the best fit, before w2's 3), each
    device once."""
    free = [dev("w1", i) for i in range(3)] + [dev("w2", i) for i in range(3)]
    held = {"j": [(dev("w1", 0), 1)]}
    out = place({"j": Target("j", (("v100", 3),), {"v100": (1, 1, 1)})}, free, held)
    assert [d for d, _ in out["j"]] == [dev("w1", 0), dev("w1", 1), dev("w1", 2)]
    both = {
        "a": Target("a", (("v100", 2),), {"v100": (1, 1)}),
        "b": Target("b", (("v100", 3),), {"v100": (1, 1, 1)}),
    }
    out = place(both, free, {})
    assert len({d for a in out.values() for d, _ in a}) == 5  # each device once


def test_same_devices_means_lease_renewal() -> None:
    a = build_placement([(dev("w1", 0), 2), (dev("w1", 1), 2)])
    b = build_placement([(dev("w1", 0), 2), (dev("w1", 1), 2)])
    c = build_placement([(dev("w1", 1), 2), (dev("w1", 0), 2)])
    assert same_devices(a, b)
    assert not same_devices(a, c)  # rank 0 moved: the processes must restart
