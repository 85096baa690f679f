"""Point-to-point messages between a job's processes (torch.distributed), counting bytes sent.

Every tensor exchange of a step goes through `exchange`, so the bytes a process
passes to gloo/NCCL are measured, not estimated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Message:
    peer: int
    tensor: torch.Tensor
    tag: int


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class Comm:
    """This process's view of the job's process group (world 1: no group, nothing sent)."""

    def __init__(self, rank: int, world: int, *, stage_on_cpu: bool = False) -> None:
        """`stage_on_cpu`: device tensors travel through host copies (gloo with CUDA tensors)."""
        self.rank = rank
        self.world = world
        self.stage_on_cpu = stage_on_cpu
        self.bytes_sent = 0

    def exchange(self, sends: list[Message], recvs: list[Message]) -> None:
        """Post every send and receive at once and wait for all (peers post the mirror image)."""
        sends = [m for m in sends if m.tensor.numel()]
        recvs = [m for m in recvs if m.tensor.numel()]
        if not sends and not recvs:
            return
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        if self.stage_on_cpu:
            sends = [Message(m.peer, m.tensor.cpu(), m.tag) for m in sends]
            host = []
            for m in recvs:
                buf = torch.empty(m.tensor.shape, dtype=m.tensor.dtype)
                staged.append((m.tensor, buf))
                host.append(Message(m.peer, buf, m.tag))
            recvs = host
        ops = [dist.P2POp(dist.isend, m.tensor, m.peer, tag=m.tag) for m in sends]
        ops += [dist.P2POp(dist.irecv, m.tensor, m.peer, tag=m.tag) for m in recvs]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        for target, buf in staged:
            target.copy_(buf)
        self.bytes_sent += sum(nbytes(m.tensor) for m in sends)

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """The backend's own all-reduce (D0); counted as the tensor passed in."""
        if self.world > 1:
            dist.all_reduce(tensor)
            self.bytes_sent += nbytes(tensor)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's object on every rank (start-up checks only; not counted)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def gather_to_first(self, obj: Any) -> list[Any] | None:
        """Rank 0 gets every rank's object (checkpoints only; not counted)."""
        if self.world == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
