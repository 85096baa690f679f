"""The canonical reduction tree: every placement adds the same operands in the same grouping."""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from gearshift.worker.runtime.tree import ReductionTree, Shape, TreeAccumulator, complete


def compositions(n: int) -> list[list[int]]:
    """Every way to cut 0..n-1 into contiguous, non-empty ranges (all mappings)."""
    out = []
    for cuts in itertools.product([False, True], repeat=n - 1):
        counts, size = [], 1
        for cut in cuts:
            if cut:
                counts.append(size)
                size = 1
            else:
                size += 1
        counts.append(size)
        out.append(counts)
    return out


def placements(counts: list[int]) -> list[list[int]]:
    out, start = [], 0
    for count in counts:
        out.append(list(range(start, start + count)))
        start += count
    return out


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


def add(a: float, b: float) -> float:
    return a + b


def distributed_sum(tree: ReductionTree, values: list[float], placement: list[list[int]]) -> float:
    """What the runtime does: each holder pushes its ESTs, the owner completes the tree."""
    parts: dict[tuple[int, int], float] = {}
    for ests in placement:
        acc: TreeAccumulator[float] = TreeAccumulator(tree, add)
        for est in ests:
            acc.push(est, values[est])
        assert [node for node, _ in acc.nodes] == tree.cover(ests)
        parts.update(acc.nodes)
    return complete(tree, parts, add)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 11])
def test_every_contiguous_placement_gives_the_same_bits(n: int) -> None:
    rng = random.Random(n)
    # Magnitudes far apart, so grouping changes the rounding.
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-8, 8) for _ in range(n)]
    tree = ReductionTree.build(n)
    reference = distributed_sum(tree, values, [[est] for est in range(n)])
    for counts in compositions(n):
        assert bits(distributed_sum(tree, values, placements(counts))) == bits(reference), counts


def test_scattered_placements_give_the_same_bits() -> None:
    rng = random.Random(0)
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-8, 8) for _ in range(8)]
    tree = ReductionTree.build(8)
    reference = distributed_sum(tree, values, [list(range(8))])
    for _ in range(50):
        ests = list(range(8))
        rng.shuffle(ests)
        cut = sorted(rng.sample(range(1, 8), 2))
        placement = [sorted(ests[: cut[0]]), sorted(ests[cut[0] : cut[1]]), sorted(ests[cut[1] :])]
        assert bits(distributed_sum(tree, values, placement)) == bits(reference), placement


def test_the_order_matters_so_the_check_can_fail() -> None:
    values = [1.0, 1e16, -1e16, 1.0]
    balanced = distributed_sum(ReductionTree.build(4), values, [[0, 1, 2, 3]])
    fold = distributed_sum(ReductionTree.build(4, "fold"), values, [[0, 1, 2, 3]])
    per_process = (values[0] + values[1]) + (values[2] + values[3])
    assert balanced == per_process  # N=4 on 2x2: the tree's own grouping
    assert bits(balanced) != bits(fold)
    # A per-process partial sum over a range that is not a subtree breaks it.
    tree = ReductionTree.build(4)
    three_then_one = (values[0] + values[1] + values[2]) + values[3]
    assert tree.cover([0, 1, 2]) == [(0, 2), (2, 3)]
    assert bits(three_then_one) != bits(balanced)


def test_tree_shape_and_covers() -> None:
    tree = ReductionTree.build(6)
    assert tree.children((0, 6)) == ((0, 4), (4, 6))
    assert tree.children((4, 6)) == ((4, 5), (5, 6))
    assert tree.cover([0, 1, 2]) == [(0, 2), (2, 3)]
    assert tree.cover([3, 4, 5]) == [(3, 4), (4, 6)]
    assert tree.cover(range(6)) == [(0, 6)]
    assert ReductionTree.build(3).children((0, 3)) == ((0, 2), (2, 3))
    # A contiguous range of k ESTs contributes at most about 2·log2(k) subtrees.
    big = ReductionTree.build(64)
    worst = max(len(big.cover(range(a, b))) for a in range(64) for b in range(a + 1, 65))
    assert worst <= 2 * 6


@pytest.mark.parametrize("shape", ["balanced", "fold"])
def test_adding_a_leaf_into_its_left_sibling_gives_the_same_sum(shape: Shape) -> None:
    """What the runtime does when autograd accumulates an EST's gradient into a partial sum."""
    rng = random.Random(3)
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-8, 8) for _ in range(8)]
    tree = ReductionTree.build(8, shape)
    plain: TreeAccumulator[float] = TreeAccumulator(tree, add)
    fused: TreeAccumulator[float] = TreeAccumulator(tree, add)
    fused_count = 0
    for est, value in enumerate(values):
        plain.push(est, value)
        left = fused.left_sibling(est)
        if left is None:
            fused.push(est, value)
        else:
            fused.push_sum(est, left + value)
            fused_count += 1
    assert [(n, bits(v)) for n, v in fused.nodes] == [(n, bits(v)) for n, v in plain.nodes]
    assert fused_count == (4 if shape == "balanced" else 7)
    misuse: TreeAccumulator[float] = TreeAccumulator(tree, add)
    misuse.push(0, 1.0)
    assert misuse.left_sibling(2) is None
    with pytest.raises(ValueError, match="not the right sibling"):
        misuse.push_sum(2, 1.0)


def test_bad_use_is_refused() -> None:
    tree = ReductionTree.build(4)
    acc: TreeAccumulator[float] = TreeAccumulator(tree, add)
    acc.push(2, 1.0)
    with pytest.raises(ValueError, match="ascending"):
        acc.push(1, 1.0)
    with pytest.raises(ValueError, match="out of range"):
        acc.push(4, 1.0)
    with pytest.raises(ValueError, match="covers EST 0"):
        complete(tree, {(2, 4): 1.0}, add)
    with pytest.raises(ValueError, match="at least one"):
        ReductionTree.build(0)
