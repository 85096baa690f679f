"""Which PS owns an embedding row, and re-partitioning rows to a new PS count.

Row `gid` lives on PS `gid % n` at local index `gid // n`. Shards are dense
tensors, so a checkpointed shard needs no id list: its row ids follow from
(shard index, PS count). Plain functions over tensors; no RPC, no files.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def shard_rows(total: int, shard: int, n: int) -> int:
    """How many of `total` rows PS `shard` of `n` holds."""
    if n < 1 or not 0 <= shard < n:
        raise ValueError(f"shard {shard} of {n} PS is not a valid shard")
    return (total - shard + n - 1) // n


def shard_ids(total: int, shard: int, n: int) -> torch.Tensor:
    """The global row ids PS `shard` of `n` holds, in local order."""
    return (
        torch.arange(shard, total, n, dtype=torch.int64)
        if shard < total
        else torch.empty(0, dtype=torch.int64)
    )


def split_by_owner(ids: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each PS: (positions in `ids`, local row indices on that PS)."""
    owner = ids % n
    out = []
    for shard in range(n):
        pos = torch.nonzero(owner == shard, as_tuple=True)[0]
        out.append((pos, ids[pos] // n))
    return out


def repartition(old: Sequence[torch.Tensor], total: int, shard: int, n: int) -> torch.Tensor:
    """PS `shard` of `n`'s rows, gathered from the shards of an old partition.

    `old[k]` is old shard k of `len(old)` (rows in local order, any trailing
    shape: values or optimizer state alike). Every row keeps its bytes.
    """
    n_old = len(old)
    if n_old < 1:
        raise ValueError("repartition needs at least one old shard")
    for k, part in enumerate(old):
        if part.shape[0] != shard_rows(total, k, n_old):
            raise ValueError(
                f"old shard {k} of {n_old} has {part.shape[0]} rows, "
                f"expected {shard_rows(total, k, n_old)}"
            )
    ids = shard_ids(total, shard, n)
    out = torch.empty((ids.numel(), *old[0].shape[1:]), dtype=old[0].dtype)
    for k, (pos, local) in enumerate(split_by_owner(ids, n_old)):
        out[pos] = old[k][local]
    return out


def assemble(shards: Sequence[torch.Tensor], total: int) -> torch.Tensor:
    """The whole table from the shards of one partition (for evaluation and tests)."""
    return repartition(shards, total, 0, 1)
