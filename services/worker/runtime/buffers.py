"""Module buffers (BatchNorm running statistics) with DDP's semantics: EST 0's win.

Under DDP with broadcast_buffers, every rank's forward starts from rank 0's
buffers. Here every EST's forward of a step starts from the step's buffers,
and after the step all processes take the buffers EST 0's forward left.

The step's and EST 0's buffers are kept in tensors of their own, allocated once and
copied into with one fused copy per dtype: a clone per buffer launched about 120 small
device copies a step on a ResNet-18 (60 buffers), most of one EST's 1.10x overhead
against a plain loop on an H200 (bench/est_overhead.py; a torch.profiler run on an H100:
184 host-issued copies a step against the plain loop's 6).
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
        self._by_dtype = self._groups()
        self._start = [torch.empty_like(b) for b in self.buffers]  # the step's, before any EST
        self._est0 = [torch.empty_like(b) for b in self.buffers]  # EST 0's, when it ran here
        self._first: list[torch.Tensor] = self._est0  # EST 0's, here or received
        self._ran = 0
        self._inbox: list[tuple[list[int], torch.Tensor]] = []

    def begin_step(self) -> None:
        self._ran = 0
        if self.buffers:
            self._copy(self._start, self.buffers)

    def before_est(self) -> None:
        """Every EST's forward starts from the buffers the step started with."""
        if self._ran and self.buffers:
            self._restore(self._start)
        self._ran += 1

    def after_est(self, est: int) -> None:
        if est == 0 and self.buffers:
            self._copy(self._est0, self.buffers)
            self._first = self._est0

    def _restore(self, values: Sequence[torch.Tensor]) -> None:
        self._copy(self.buffers, values)

    def _copy(self, into: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        """into[i] = values[i] for every buffer: exact copies, one fused copy per dtype (a
        list of mixed dtypes falls back to a copy per tensor)."""
        with torch.no_grad():
            for group in self._by_dtype:
                torch._foreach_copy_([into[i] for i in group], [values[i] for i in group])

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
            for g, group in enumerate(self._by_dtype):
                flat = torch.cat([self._first[i].reshape(-1) for i in group])
                sends += [
                    Message(peer, flat, TAG_BUFFERS + 16 * g)
                    for peer in range(self.procs)
                    if peer != self.rank
                ]
            return sends, []
        recvs = []
        for g, group in enumerate(self._by_dtype):
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
