"""Shared loader processes build exactly the batches each EST's logical loader workers would."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from gearshift.worker.runtime.context import EstContext, fresh_context
from gearshift.worker.runtime.data import LocalShards
from gearshift.worker.runtime.digest import tensor_bytes
from gearshift.worker.runtime.loader import BatchLoader
from gearshift.worker.runtime.rng import restore, snapshot


@pytest.fixture(autouse=True)
def keep_global_rng() -> Iterator[None]:
    state = snapshot()
    yield
    restore(state)


class Augmented:
    """Every sample draws from torch, NumPy and Python's random."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        noise = torch.rand(3) + float(np.random.normal()) + random.random()
        return noise + index, index


class Failing(Augmented):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raise KeyError(f"sample {index} is broken")


def contexts(ests: list[int]) -> list[EstContext]:
    return [fresh_context(est, seed=3, loader_workers=2) for est in ests]


def batches(procs: int, steps: int, ests: list[int]) -> tuple[list[bytes], list[EstContext]]:
    ctxs = contexts(ests)
    source = LocalShards(size=200, shard_size=8, seed=3, num_ranks=4)
    loader = BatchLoader(
        Augmented(), default_collate, source, ctxs, per_est_batch=5, start_step=0, procs=procs
    )
    out = []
    try:
        for _ in range(steps):
            for ctx in ctxs:
                x, y = loader.next(ctx.est)
                out.append(tensor_bytes(x) + tensor_bytes(y))
    finally:
        loader.close()
    return out, ctxs


def plain(ctxs: list[EstContext]) -> list[Any]:
    return [
        (
            c.position,
            [s.torch_cpu.numpy().tobytes() for s in c.loader_rng],
            [s.numpy.state["state"]["key"].tobytes() for s in c.loader_rng],
            [s.numpy.state["state"]["pos"] for s in c.loader_rng],
            c.rng.python,
        )
        for c in ctxs
    ]


@pytest.mark.parametrize("procs", [1, 3])
def test_physical_loader_processes_change_no_bit(procs: int) -> None:
    # 2 ESTs x 2 logical workers = 4 logical workers served by 1 or 3 processes.
    expected, expected_ctxs = batches(0, 6, [1, 3])
    got, ctxs = batches(procs, 6, [1, 3])
    assert got == expected
    assert plain(ctxs) == plain(expected_ctxs)
    assert len(set(got)) == len(got)


def test_only_consumed_batches_are_committed() -> None:
    ctxs = contexts([0, 1])
    source = LocalShards(size=200, shard_size=8, seed=3, num_ranks=4)
    loader = BatchLoader(
        Augmented(), default_collate, source, ctxs, per_est_batch=5, start_step=0, procs=2
    )
    try:
        for ctx in ctxs:
            loader.next(ctx.est)
        loader.next(0)  # the pool has built further ahead by now
        _, reference = batches(0, 1, [0, 1])
        assert plain(ctxs)[1] == plain(reference)[1]
        with pytest.raises(RuntimeError, match="asked for EST 0's batch but EST 1 is next"):
            loader.next(0)
    finally:
        loader.close()


def test_the_same_est_resumes_from_its_committed_state() -> None:
    whole, _ = batches(0, 4, [2])
    first, ctxs = batches(0, 2, [2])
    source = LocalShards(size=200, shard_size=8, seed=3, num_ranks=4)
    loader = BatchLoader(
        Augmented(), default_collate, source, ctxs, per_est_batch=5, start_step=2, procs=1
    )
    try:
        rest = [b"".join(map(tensor_bytes, loader.next(2))) for _ in range(2)]
    finally:
        loader.close()
    assert first + rest == whole


def test_a_failing_dataset_is_reported_with_its_error() -> None:
    ctxs = contexts([0])
    source = LocalShards(size=200, shard_size=8, seed=3, num_ranks=4)
    loader = BatchLoader(
        Failing(), default_collate, source, ctxs, per_est_batch=5, start_step=0, procs=1
    )
    try:
        with pytest.raises(RuntimeError, match="KeyError: 'sample"):
            loader.next(0)
    finally:
        loader.close()
