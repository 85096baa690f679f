"""Deterministic sharding: which sample indices a shard holds, the shard order of an epoch,
and the shard sequence of each logical rank — pure functions of their arguments.

The shard manager serves these sequences (deterministic mode) and the runtime
computes the same ones locally when it runs without the cluster, so a job reads
the same samples either way. Randomness comes only from random.Random.random()
seeded with a string, the part of Python's random module whose output is
guaranteed stable across versions (shuffle's algorithm is not), via our own
Fisher-Yates.
"""

from __future__ import annotations

import random


def num_shards(size: int, shard_size: int) -> int:
    """Shards needed to cover `size` samples (the last one may be short)."""
    if size <= 0 or shard_size <= 0:
        raise ValueError(f"size and shard_size must be > 0 (got {size}, {shard_size})")
    return -(-size // shard_size)


def shard_range(shard_id: int, size: int, shard_size: int) -> tuple[int, int]:
    """[start, end) of a shard's sample indices."""
    if not 0 <= shard_id < num_shards(size, shard_size):
        raise ValueError(f"shard {shard_id} out of range for size {size}, shard_size {shard_size}")
    start = shard_id * shard_size
    return start, min(start + shard_size, size)


def permutation(n: int, key: str) -> list[int]:
    """A permutation of range(n) that depends only on n and key (Fisher-Yates)."""
    rng = random.Random(key)
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        order[i], order[j] = order[j], order[i]
    return order


def epoch_order(total_shards: int, seed: int, epoch: int) -> list[int]:
    """Shard ids in the order an epoch hands them out."""
    return permutation(total_shards, f"gearshift/epoch/{seed}/{epoch}")


def rank_sequence(total_shards: int, seed: int, epoch: int, num_ranks: int, rank: int) -> list[int]:
    """Shard ids that logical rank `rank` of `num_ranks` reads in `epoch`, in order.

    Ranks take the epoch order round-robin, so their sequences differ by at
    most one shard in length.
    """
    if not 0 <= rank < num_ranks:
        raise ValueError(f"rank {rank} out of range for {num_ranks} ranks")
    return epoch_order(total_shards, seed, epoch)[rank::num_ranks]


def shard_indices(
    shard_id: int, size: int, shard_size: int, seed: int, epoch: int, *, shuffle_within: bool
) -> list[int]:
    """The sample indices of a shard in reading order."""
    start, end = shard_range(shard_id, size, shard_size)
    if not shuffle_within:
        return list(range(start, end))
    order = permutation(end - start, f"gearshift/shard/{seed}/{epoch}/{shard_id}")
    return [start + i for i in order]
