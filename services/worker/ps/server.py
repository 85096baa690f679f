"""A parameter-server process: one shard of embedding rows (PS 0 also the dense net).

The PS serves `torch.distributed.rpc` calls from the workers, each on an RPC
thread: `lookup` (rows of a batch), `push` (sparse Adagrad on the rows a batch
touched), and on PS 0 `begin` (claim the next global batch + the dense
parameters) and `push_dense`. Updates apply as they arrive, whichever worker
sends them: asynchronous, so not bitwise reproducible.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from gearshift.worker.ps.model import DenseNet, ModelConfig

EPS = 1e-10


@dataclass
class ShardStats:
    lookups: int = 0
    rows_served: int = 0
    updates: int = 0  # pushes applied (each one acknowledged to a worker)
    busy_s: float = 0.0  # time spent inside lookup / push (how hot this PS is)


class Shard:
    """Rows of one PS and their Adagrad accumulators, behind a lock."""

    def __init__(self, rows: torch.Tensor, accum: torch.Tensor, lr: float) -> None:
        if rows.shape != accum.shape:
            raise ValueError(
                f"rows {tuple(rows.shape)} and accumulators {tuple(accum.shape)} differ"
            )
        self.rows, self.accum, self.lr = rows, accum, lr
        self.stats = ShardStats()
        self._lock = threading.Lock()

    def lookup(self, local: torch.Tensor) -> torch.Tensor:
        with self._lock:
            t0 = time.perf_counter()
            out = self.rows[local].clone()
            self.stats.lookups += 1
            self.stats.rows_served += int(local.numel())
            self.stats.busy_s += time.perf_counter() - t0
            return out

    def push(self, local: torch.Tensor, grads: torch.Tensor) -> None:
        """Adagrad on the given rows; `local` holds no duplicates (workers send unique ids)."""
        with self._lock:
            t0 = time.perf_counter()
            acc = self.accum[local] + grads * grads
            self.accum[local] = acc
            self.rows[local] -= self.lr * grads / (acc.sqrt() + EPS)
            self.stats.updates += 1
            self.stats.busy_s += time.perf_counter() - t0


class DenseServer:
    """The dense net, its optimizer, and the global batch counter (PS 0 only)."""

    def __init__(self, net: DenseNet, cfg: ModelConfig, next_batch: int, end_batch: int) -> None:
        self.net = net
        self.opt = torch.optim.Adagrad(net.parameters(), lr=cfg.lr)
        self.next_batch, self.end_batch = next_batch, end_batch
        self.updates = 0
        self._lock = threading.Lock()

    def begin(self) -> tuple[int, list[torch.Tensor]]:
        """Claim the next global batch (-1 once the phase's batches are all claimed)."""
        with self._lock:
            if self.next_batch >= self.end_batch:
                return -1, []
            number = self.next_batch
            self.next_batch += 1
            return number, [p.detach().clone() for p in self.net.parameters()]

    def stop(self) -> None:
        """Hand out no more batches (a stop request): the phase ends at the ones claimed."""
        with self._lock:
            self.end_batch = min(self.end_batch, self.next_batch)

    def counter(self) -> tuple[int, int]:
        """(next batch, end batch) as of now."""
        with self._lock:
            return self.next_batch, self.end_batch

    def push(self, grads: list[torch.Tensor]) -> None:
        with self._lock:
            for p, g in zip(self.net.parameters(), grads, strict=True):
                p.grad = g
            self.opt.step()
            self.updates += 1


# The process's own shard; RPC handlers are module functions that reach it.
_shard: Shard | None = None
_dense: DenseServer | None = None


def serve(shard: Shard, dense: DenseServer | None) -> None:
    global _shard, _dense
    _shard, _dense = shard, dense


def _need_shard() -> Shard:
    if _shard is None:
        raise RuntimeError("this process serves no PS shard")
    return _shard


def _need_dense() -> DenseServer:
    if _dense is None:
        raise RuntimeError("this PS holds no dense net (only PS 0 does)")
    return _dense


def rpc_lookup(local: torch.Tensor) -> torch.Tensor:
    return _need_shard().lookup(local)


def rpc_push(local: torch.Tensor, grads: torch.Tensor) -> None:
    _need_shard().push(local, grads)


def rpc_begin() -> tuple[int, list[torch.Tensor]]:
    return _need_dense().begin()


def rpc_push_dense(grads: list[torch.Tensor]) -> None:
    _need_dense().push(grads)
