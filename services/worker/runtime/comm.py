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

    def __init__(self, rank: int, world: int, *, transport: torch.device | None = None) -> None:
        """`transport`: where the backend takes tensors from (CPU for gloo, the GPU for NCCL);
        tensors elsewhere travel through copies."""
        self.rank = rank
        self.world = world
        self.transport = transport or torch.device("cpu")
        self.bytes_sent = 0

    def _staged(self, tensor: torch.Tensor) -> bool:
        return tensor.device != self.transport

    def exchange(self, sends: list[Message], recvs: list[Message]) -> None:
        """Post every send and receive at once and wait for all (peers post the mirror image)."""
        sends = [m for m in sends if m.tensor.numel()]
        recvs = [m for m in recvs if m.tensor.numel()]
        if not sends and not recvs:
            return
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        sends = [
            Message(m.peer, m.tensor.to(self.transport), m.tag) if self._staged(m.tensor) else m
            for m in sends
        ]
        moved = []
        for m in recvs:
            if self._staged(m.tensor):
                buf = torch.empty(m.tensor.shape, dtype=m.tensor.dtype, device=self.transport)
                staged.append((m.tensor, buf))
                moved.append(Message(m.peer, buf, m.tag))
            else:
                moved.append(m)
        recvs = moved
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
            buf = tensor.to(self.transport) if self._staged(tensor) else tensor
            dist.all_reduce(buf)
            if buf is not tensor:
                tensor.copy_(buf)
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

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Rank `src`'s object on every rank (membership changes only; not counted)."""
        if self.world == 1:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
