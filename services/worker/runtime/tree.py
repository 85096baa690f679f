"""The canonical order in which N per-EST gradients are summed: a binary tree over EST ids.

Float addition is not associative, so the sum is bitwise stable only if every
configuration adds the same operands in the same grouping. The tree depends only
on N; a process adds whole subtrees made of ESTs it holds (its *cover*), and the
owner of a gradient slice finishes the tree from everyone's covers. The result
is the same bits for every number of processes and every EST mapping.

Everything here is plain Python over an abstract `add`, so it is tested with
floats and used with tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
Node = tuple[int, int]
"""A subtree: the EST ids lo..hi-1 as the half-open range (lo, hi)."""

Shape = Literal["balanced", "fold"]


def _balanced_split(lo: int, hi: int) -> int:
    """Left child = the largest power of two below the size: nodes are aligned dyadic ranges."""
    return lo + (1 << ((hi - lo - 1).bit_length() - 1))


@dataclass(frozen=True)
class ReductionTree:
    """A fixed binary tree over EST ids 0..n-1; `splits` maps each inner node to its split."""

    n: int
    splits: dict[Node, int] = field(repr=False)

    @classmethod
    def build(cls, n: int, shape: Shape = "balanced") -> ReductionTree:
        """`balanced`: aligned binary tree (the default order); `fold`: ((g0+g1)+g2)+...

        The fold exists to show that the order matters: it is another valid
        canonical order, and it gives different bits.
        """
        if n < 1:
            raise ValueError(f"a reduction tree needs at least one EST (got {n})")
        splits: dict[Node, int] = {}
        if shape == "fold":
            for hi in range(2, n + 1):
                splits[(0, hi)] = hi - 1
            return cls(n, splits)
        if shape != "balanced":
            raise ValueError(f"unknown tree shape {shape!r} (balanced or fold)")
        pending = [(0, n)]
        while pending:
            lo, hi = pending.pop()
            if hi - lo > 1:
                mid = _balanced_split(lo, hi)
                splits[(lo, hi)] = mid
                pending += [(lo, mid), (mid, hi)]
        return cls(n, splits)

    @property
    def root(self) -> Node:
        return (0, self.n)

    def children(self, node: Node) -> tuple[Node, Node]:
        mid = self.splits[node]
        return (node[0], mid), (mid, node[1])

    def parent_of(self, left: Node, right: Node) -> Node | None:
        """The node whose children are exactly (left, right), if there is one."""
        if left[1] != right[0]:
            return None
        joined = (left[0], right[1])
        return joined if self.splits.get(joined) == left[1] else None

    def cover(self, ests: Iterable[int]) -> list[Node]:
        """The maximal subtrees made only of `ests`, in EST order (what a holder contributes)."""
        acc: TreeAccumulator[None] = TreeAccumulator(self, lambda _a, _b: None)
        for est in sorted(set(ests)):
            acc.push(est, None)
        return [node for node, _ in acc.nodes]


class TreeAccumulator(Generic[T]):
    """Adds leaves pushed in ascending EST order into the largest subtrees they complete.

    Holding k contiguous ESTs, at most about log2(k)+1 partial sums are alive at
    once, and the partials left at the end are exactly `tree.cover(ests)`.
    """

    def __init__(self, tree: ReductionTree, add: Callable[[T, T], T]) -> None:
        self.tree = tree
        self._add = add
        self.nodes: list[tuple[Node, T]] = []

    def _check(self, est: int) -> None:
        if not 0 <= est < self.tree.n:
            raise ValueError(f"EST {est} out of range for {self.tree.n} ESTs")
        if self.nodes and self.nodes[-1][0][1] > est:
            raise ValueError(f"ESTs must be pushed in ascending order ({est} after {self.nodes})")

    def push(self, est: int, value: T) -> None:
        self._check(est)
        self.nodes.append(((est, est + 1), value))
        self._settle()

    def left_sibling(self, est: int) -> T | None:
        """The partial sum that leaf `est` is added to first, when it is on top of the stack.

        The caller may add the leaf into it in place (as autograd accumulates into
        .grad) and hand the result to `push_sum`: the same sum, computed while the
        leaf is still hot in cache.
        """
        if self.nodes and self.tree.parent_of(self.nodes[-1][0], (est, est + 1)) is not None:
            return self.nodes[-1][1]
        return None

    def push_sum(self, est: int, value: T) -> None:
        """Push `left_sibling(est) + leaf est`, already computed by the caller."""
        self._check(est)
        left, _ = self.nodes[-1]
        parent = self.tree.parent_of(left, (est, est + 1))
        if parent is None:
            raise ValueError(f"EST {est} is not the right sibling of {left}")
        self.nodes[-1] = (parent, value)
        self._settle()

    def _settle(self) -> None:
        while len(self.nodes) >= 2:
            (left, lvalue), (right, rvalue) = self.nodes[-2], self.nodes[-1]
            parent = self.tree.parent_of(left, right)
            if parent is None:
                break
            self.nodes[-2:] = [(parent, self._add(lvalue, rvalue))]


def complete(tree: ReductionTree, parts: dict[Node, T], add: Callable[[T, T], T]) -> T:
    """The root's value, from partial sums that together cover every EST exactly once."""

    def value(node: Node) -> T:
        if node in parts:
            return parts[node]
        if node not in tree.splits:
            raise ValueError(f"no partial sum covers EST {node[0]}")
        left, right = tree.children(node)
        return add(value(left), value(right))

    return value(tree.root)


def check_partition(n: int, placement: Sequence[Sequence[int]]) -> None:
    """Every EST 0..n-1 is held by exactly one process."""
    held = sorted(est for ests in placement for est in ests)
    if held != list(range(n)):
        raise ValueError(f"placement {placement} does not hold each of the {n} ESTs exactly once")
