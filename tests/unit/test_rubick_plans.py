"""Rubick's execution plans and their enumeration (gearshift.common.rubick.plans)."""

from __future__ import annotations

import pytest

from gearshift.common.rubick.plans import (
    Plan,
    Resources,
    Zero,
    consolidated,
    enumerate_plans,
    group_spans_nodes,
)


def test_plan_validation() -> None:
    with pytest.raises(ValueError, match="data parallel only"):
        Plan(tp=2, zero=Zero.DP)
    with pytest.raises(ValueError, match="micro_batches"):
        Plan(dp=2, micro_batches=2)
    assert Plan(pp=2, tp=4, dp=8, micro_batches=8).gpus == 64


def test_groups_follow_megatron_rank_order() -> None:
    plan = Plan(pp=2, tp=4, dp=2, micro_batches=2)  # 16 GPUs on two nodes of 8
    assert not group_spans_nodes(plan, (8, 8), "tp")
    assert not group_spans_nodes(plan, (8, 8), "dp")
    assert group_spans_nodes(plan, (8, 8), "pp")
    assert group_spans_nodes(Plan(dp=8), (4, 4), "dp")
    assert not group_spans_nodes(Plan(dp=8), (8,), "dp")


def test_enumeration_respects_every_constraint() -> None:
    res = Resources((8, 4), 2)
    plans = list(enumerate_plans(48, 24, res))
    assert plans and len(set(plans)) == len(plans)
    for p in plans:
        assert p.gpus == 12
        assert all(n % p.tp == 0 for n in res.placement)  # TP inside a node
        assert 24 % p.pp == 0 and 48 % (p.dp * p.ga * p.micro_batches) == 0
        assert p.pp == 1 or p.micro_batches >= p.pp
    assert {p.tp for p in plans} == {1, 2, 4}
    assert Plan(dp=12, zero=Zero.OFFLOAD) in plans
    assert all(p.tp == p.pp == 1 for p in enumerate_plans(48, 24, res, allow_3d=False))


def test_consolidated_placement() -> None:
    assert consolidated(12, 8) == (8, 4)
    assert consolidated(16, 8) == (8, 8)
    assert consolidated(3, 8) == (3,)
