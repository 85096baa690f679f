"""A worker's loop: claim a global batch, pull its rows, compute, push gradients.

Workers never wait for each other: each one claims the next global batch number
from PS 0 (so the data a batch holds depends on its number only, and a resumed
job continues from the checkpointed number), pulls the current rows and dense
parameters, and pushes its gradients; the PSs apply them as they arrive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.distributed import rpc
from torch.nn import functional

from gearshift.worker.ps import server
from gearshift.worker.ps.data import ClickData
from gearshift.worker.ps.feed import Feed
from gearshift.worker.ps.model import DenseNet, ModelConfig
from gearshift.worker.ps.sharding import split_by_owner


def ps_name(shard: int) -> str:
    return f"ps{shard}"


def worker_name(index: int) -> str:
    return f"worker{index}"


@dataclass
class WorkerStats:
    steps: int = 0
    samples: int = 0
    updates_acked: int = 0  # pushes (sparse per PS + dense) whose acknowledgement arrived
    first_step_at: float = 0.0  # wall clock (time.time) when the first step began
    last_step_at: float = 0.0  # wall clock when the last step's pushes were acknowledged
    loss_sum: float = 0.0
    batches: list[int] = field(default_factory=list)  # global batch numbers this worker trained


def train(
    data: ClickData, model_cfg: ModelConfig, num_ps: int, feed: Feed, read_ms: float = 0.0
) -> WorkerStats:
    """Run steps until PS 0 has no batch left for this phase (or the feed has no data).

    `read_ms`: a sleep per batch standing in for fetching it from remote storage (the
    synthetic batches are generated in place, in well under a millisecond of I/O);
    DLRover's PS workers are bound by that read, which extra workers overlap.
    """
    cfg = data.cfg
    net = DenseNet(model_cfg, cfg.fields, cfg.dense, cfg.seed)
    params = list(net.parameters())
    stats = WorkerStats()
    while True:
        started = time.time()
        number, values = rpc.rpc_sync(ps_name(0), server.rpc_begin)
        if number < 0:
            return stats
        if stats.steps == 0:
            stats.first_step_at = started
        with torch.no_grad():
            for p, v in zip(params, values, strict=True):
                p.copy_(v)
        batch = feed.next_batch(number)
        if batch is None:
            return stats
        if read_ms:
            time.sleep(read_ms / 1000.0)  # the stand-in remote read, not a synchronisation
        ids = torch.from_numpy(batch.ids)
        uniq, inverse = torch.unique(ids, return_inverse=True)
        parts = split_by_owner(uniq, num_ps)
        pulls = [
            rpc.rpc_async(ps_name(k), server.rpc_lookup, args=(local,))
            for k, (_, local) in enumerate(parts)
        ]
        rows = torch.empty((uniq.numel(), model_cfg.width))
        for (pos, _), fut in zip(parts, pulls, strict=True):
            rows[pos] = fut.wait()
        rows.requires_grad_(True)
        logits = net(rows[inverse], torch.from_numpy(batch.dense))
        loss = functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels))
        net.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        assert rows.grad is not None
        grads = rows.grad
        pushes = [
            rpc.rpc_async(ps_name(k), server.rpc_push, args=(local, grads[pos]))
            for k, (pos, local) in enumerate(parts)
            if local.numel()
        ]
        dense_grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        pushes.append(rpc.rpc_async(ps_name(0), server.rpc_push_dense, args=(dense_grads,)))
        for fut in pushes:
            fut.wait()
        stats.updates_acked += len(pushes)
        stats.steps += 1
        stats.batches.append(number)
        stats.samples += cfg.batch
        stats.loss_sum += float(loss.detach())
        stats.last_step_at = time.time()
