"""Parameter-server mode, the pure parts: click data, row ownership, re-partitioning."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from gearshift.worker.ps.data import ClickConfig, ClickData
from gearshift.worker.ps.launch import Phase
from gearshift.worker.ps.model import ModelConfig, init_rows
from gearshift.worker.ps.run import parse_phases
from gearshift.worker.ps.sharding import (
    assemble,
    repartition,
    shard_ids,
    shard_rows,
    split_by_owner,
)

SMALL = ClickConfig(seed=3, fields=4, vocab=1000, dense=2, batch=64, train_blocks=10)


def test_blocks_are_a_function_of_seed_and_number() -> None:
    a, b = ClickData(SMALL), ClickData(SMALL)
    for k in (0, 7):
        x, y = a.block(k), b.block(k)
        assert np.array_equal(x.ids, y.ids) and np.array_equal(x.labels, y.labels)
    assert not np.array_equal(a.block(0).ids, a.block(1).ids)
    assert not np.array_equal(a.block(0).ids, ClickData(replace(SMALL, seed=4)).block(0).ids)


def test_ids_are_skewed_and_within_their_field() -> None:
    data = ClickData(ClickConfig(seed=0, fields=3, vocab=5000, batch=4096, train_blocks=1))
    ids = data.block(0).ids
    for f in range(3):
        assert ((ids[:, f] >= f * 5000) & (ids[:, f] < (f + 1) * 5000)).all()
    _, counts = np.unique(ids[:, 0], return_counts=True)
    top = np.sort(counts)[::-1]
    assert top[:10].sum() > 0.3 * ids.shape[0]  # Zipf-like: a few ids take a large share


def test_an_epoch_visits_every_block_once_and_epochs_differ() -> None:
    data = ClickData(SMALL)
    first = [data.train_batch(n)[1].ids.tobytes() for n in range(10)]
    second = [data.train_batch(n)[1].ids.tobytes() for n in range(10, 20)]
    every = {data.block(k).ids.tobytes() for k in range(10)}
    assert set(first) == every == set(second)
    assert first != second
    assert data.train_batch(13)[0] == 1


def test_heldout_differs_from_training() -> None:
    data = ClickData(SMALL)
    held = data.heldout(2)
    assert held.ids.shape == (128, 4)
    assert not any(np.array_equal(held.ids[:64], data.block(k).ids) for k in range(10))


@pytest.mark.parametrize(("total", "old", "new"), [(100, 2, 3), (101, 3, 2), (7, 2, 5), (50, 1, 4)])
def test_repartition_keeps_every_row(total: int, old: int, new: int) -> None:
    table = torch.randn(total, 3)
    shards = [table[shard_ids(total, k, old)] for k in range(old)]
    moved = [repartition(shards, total, k, new) for k in range(new)]
    assert [m.shape[0] for m in moved] == [shard_rows(total, k, new) for k in range(new)]
    assert sum(m.shape[0] for m in moved) == total
    back = assemble(moved, total)
    assert back.numpy().tobytes() == table.numpy().tobytes()


def test_split_by_owner_routes_ids_to_their_ps() -> None:
    ids = torch.tensor([0, 5, 6, 11, 3])
    parts = split_by_owner(ids, 3)
    for shard, (pos, local) in enumerate(parts):
        assert (ids[pos] % 3 == shard).all()
        assert torch.equal(local * 3 + shard, ids[pos])


def test_initial_rows_do_not_depend_on_the_ps_count() -> None:
    cfg = ModelConfig(dim=4)
    one = init_rows(30, 0, 1, cfg, seed=1)
    two = assemble([init_rows(30, k, 2, cfg, seed=1) for k in range(2)], 30)
    assert one.numpy().tobytes() == two.numpy().tobytes()
    assert one.shape == (30, 5) and 0 < float(one.std()) < 0.05


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="old shard 1 of 2"):
        repartition([torch.zeros(5, 2), torch.zeros(3, 2)], 10, 0, 3)
    with pytest.raises(ValueError, match="vocab"):
        ClickConfig(vocab=0)
    with pytest.raises(ValueError, match="train block 10"):
        ClickData(SMALL).block(10)
    with pytest.raises(ValueError, match="worker"):
        Phase(ps=1, workers=0, steps=1)
    with pytest.raises(ValueError, match="'2x:5'"):
        parse_phases("2x2:5,2x:5")
    assert parse_phases("2x2:300, 3x4:0") == [Phase(2, 2, 300), Phase(3, 4, 0)]
