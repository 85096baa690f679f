"""Summing the ESTs' gradients of a global step (each already scaled by 1/N: the mean).

`CanonicalReducer` (D1, D2) adds in the fixed tree order of `tree.py`, whatever
the placement, and sends about as many bytes as an all-reduce: each process
adds its own ESTs' subtrees locally, sends every other process that process's
chunk of those partial sums (a reduce-scatter), the chunk owner finishes the
tree, and the finished chunks are exchanged (an all-gather). With contiguous
EST ranges a process holds at most about 2·log2(k) subtrees for k ESTs, so it
sends roughly (subtrees + 1)·(P-1)/P gradients per step — 2·(P-1)/P with one
EST per process, like a ring all-reduce.

`LocalSumReducer` (D0) sums a process's ESTs, then uses the backend's
all-reduce: repeatable on a fixed placement only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from gearshift.worker.runtime.comm import Comm, Message
from gearshift.worker.runtime.gradients import GradLayout, Grads, add_
from gearshift.worker.runtime.tree import Node, ReductionTree, TreeAccumulator, complete

TAG_SCATTER = 1
TAG_GATHER = 2


class Reducer(Protocol):
    def begin_step(self) -> None: ...

    def accumulate_into(self, est: int) -> Grads | None:
        """Gradients EST `est`'s backward may add itself into in place, if any."""

    def add(self, est: int, grads: Grads, *, summed: bool = False) -> None:
        """EST `est`'s gradient (ESTs come in ascending order); `summed`: it was added
        into `accumulate_into(est)` already."""

    def finish(self, sends: list[Message], recvs: list[Message]) -> Grads:
        """The sum over all ESTs; `sends`/`recvs` ride along with the first exchange."""


def _flat_add(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    return left.add_(right)


class CanonicalReducer:
    def __init__(
        self,
        layout: GradLayout,
        tree: ReductionTree,
        placement: Sequence[Sequence[int]],
        comm: Comm,
    ) -> None:
        self.layout = layout
        self.tree = tree
        self.comm = comm
        self.rank = comm.rank
        self.procs = len(placement)
        self.covers = [tree.cover(ests) for ests in placement]
        self.bounds = layout.chunks(self.procs)
        self._acc: TreeAccumulator[Grads] = TreeAccumulator(tree, add_)

    def begin_step(self) -> None:
        self._acc = TreeAccumulator(self.tree, add_)

    def accumulate_into(self, est: int) -> Grads | None:
        return self._acc.left_sibling(est)

    def add(self, est: int, grads: Grads, *, summed: bool = False) -> None:
        if summed:
            self._acc.push_sum(est, grads)
        else:
            self._acc.push(est, grads)

    def finish(self, sends: list[Message], recvs: list[Message]) -> Grads:
        nodes = self._acc.nodes
        self._acc = TreeAccumulator(self.tree, add_)
        if [node for node, _ in nodes] != self.covers[self.rank]:
            raise RuntimeError(
                f"rank {self.rank} holds subtrees {[n for n, _ in nodes]}, "
                f"expected {self.covers[self.rank]}"
            )
        if self.procs == 1:
            self.comm.exchange(sends, recvs)
            [(_, root)] = nodes
            return root
        start, end = self.bounds[self.rank]
        # Reduce-scatter: my subtrees' slice of every other chunk goes to its owner.
        scatter_sends = list(sends)
        for peer, (a, b) in enumerate(self.bounds):
            if peer != self.rank:
                payload = torch.cat([self.layout.pack(grads, a, b) for _, grads in nodes])
                scatter_sends.append(Message(peer, payload, TAG_SCATTER))
        width = end - start
        incoming: dict[int, torch.Tensor] = {}
        scatter_recvs = list(recvs)
        for peer in range(self.procs):
            if peer != self.rank:
                incoming[peer] = torch.empty(
                    len(self.covers[peer]) * width,
                    dtype=self.layout.dtype,
                    device=self.layout.device,
                )
                scatter_recvs.append(Message(peer, incoming[peer], TAG_SCATTER))
        self.comm.exchange(scatter_sends, scatter_recvs)
        parts: dict[Node, torch.Tensor] = {
            node: self.layout.pack(grads, start, end) for node, grads in nodes
        }
        for peer, buffer in incoming.items():
            for i, node in enumerate(self.covers[peer]):
                parts[node] = buffer[i * width : (i + 1) * width]
        mine = complete(self.tree, parts, _flat_add)
        # All-gather of the finished chunks, straight into one flat gradient.
        flat = torch.empty(self.layout.total, dtype=self.layout.dtype, device=self.layout.device)
        flat[start:end].copy_(mine)
        gather_sends = [
            Message(peer, mine, TAG_GATHER) for peer in range(self.procs) if peer != self.rank
        ]
        gather_recvs = [
            Message(peer, flat[a:b], TAG_GATHER)
            for peer, (a, b) in enumerate(self.bounds)
            if peer != self.rank
        ]
        self.comm.exchange(gather_sends, gather_recvs)
        return self.layout.views(flat)


class LocalSumReducer:
    """D0: a process's ESTs in a left fold, then the backend's all-reduce."""

    def __init__(self, layout: GradLayout, comm: Comm) -> None:
        self.layout = layout
        self.comm = comm
        self._sum: Grads | None = None

    def begin_step(self) -> None:
        self._sum = None

    def accumulate_into(self, est: int) -> Grads | None:
        return self._sum

    def add(self, est: int, grads: Grads, *, summed: bool = False) -> None:
        if summed or self._sum is None:
            self._sum = grads
        else:
            add_(self._sum, grads)

    def finish(self, sends: list[Message], recvs: list[Message]) -> Grads:
        if self._sum is None:
            raise RuntimeError("no EST gradient this step")
        self.comm.exchange(sends, recvs)
        total, self._sum = self._sum, None
        if self.comm.world == 1:
            return total
        flat = self.layout.pack(total, 0, self.layout.total)
        self.comm.all_reduce_sum(flat)
        return self.layout.views(flat)
