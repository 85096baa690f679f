"""Module buffers (BatchNorm running statistics) with DDP's semantics: EST 0's win.

Under DDP with broadcast_buffers, every rank's forward starts from rank 0's
buffers. Here every EST's forward of a step starts from the step's buffers,
and after the step all processes take the buffers EST 0's forward left.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gearshift.worker.runtime.comm import Message

TAG_BUFFERS = 3


class BufferKeeper:
    def __init__(self, model: torch.nn.Module, holder_of_first: int, rank: int, procs: int) -> None:
        self.buffers = [b for b in model.buffers() if b.numel()]
        self.holder = holder_of_first
        self.rank = rank
        self.procs = procs
        self._start: list[torch.Tensor] = []
        self._first: list[torch.Tensor] = []
        self._ran = 0
        self._inbox: list[tuple[list[int], torch.Tensor]] = []

    def begin_step(self) -> None:
        self._ran = 0
        if self.buffers:
            self._start = [b.detach().clone() for b in self.buffers]

    def before_est(self) -> None:
        """Every EST's forward starts from the buffers the step started with."""
        if self._ran and self.buffers:
            self._restore(self._start)
        self._ran += 1

    def after_est(self, est: int) -> None:
        if est == 0 and self.buffers:
            self._first = [b.detach().clone() for b in self.buffers]

    def _restore(self, values: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.buffers, list(values))

    def _groups(self) -> list[list[int]]:
        """Buffer indices grouped by dtype, so each group travels as one flat message."""
        groups: dict[torch.dtype, list[int]] = {}
        for i, b in enumerate(self.buffers):
            groups.setdefault(b.dtype, []).append(i)
        return list(groups.values())

    def messages(self) -> tuple[list[Message], list[Message]]:
        """EST 0's buffers, sent by their holder to every other process."""
        self._inbox = []
        if not self.buffers or self.procs == 1:
            return [], []
        if self.rank == self.holder:
            sends = []
            for g, group in enumerate(self._groups()):
                flat = torch.cat([self._first[i].reshape(-1) for i in group])
                sends += [
                    Message(peer, flat, TAG_BUFFERS + 16 * g)
                    for peer in range(self.procs)
                    if peer != self.rank
                ]
            return sends, []
        recvs = []
        for g, group in enumerate(self._groups()):
            size = sum(self.buffers[i].numel() for i in group)
            flat = torch.empty(
                size, dtype=self.buffers[group[0]].dtype, device=self.buffers[group[0]].device
            )
            self._inbox.append((group, flat))
            recvs.append(Message(self.holder, flat, TAG_BUFFERS + 16 * g))
        return [], recvs

    def end_step(self) -> None:
        """After the exchange: everyone keeps EST 0's buffers."""
        if not self.buffers:
            return
        if self._inbox:
            first: list[torch.Tensor] = list(self.buffers)
            for group, flat in self._inbox:
                offset = 0
                for i in group:
                    numel = self.buffers[i].numel()
                    first[i] = flat[offset : offset + numel].view_as(self.buffers[i])
                    offset += numel
            self._first = first
            self._inbox = []
        self._restore(self._first)
