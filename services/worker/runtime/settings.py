"""What a run needs besides the job: EST count, batch size, steps, seeds, levels, placement.

Plain data and their checks, free of torch, shared by the launcher, the
per-process entry and (later) the worker daemon. A bad value raises
ValidationError naming the flag.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime.tree import Shape


class Determinism(enum.StrEnum):
    """EasyScale's levels (section 3.3); each includes the ones before it.

    D0: fixed seeds, deterministic kernels, no autotuning, per-EST RNG contexts;
        gradients are summed per process, then all-reduced (bits depend on the
        placement). D1: D0 + the canonical reduction tree, so any placement gives
        the same bits (default). D2: D1 + kernel choices fixed across device
        types: a fixed intra-op thread count on CPU whatever the process was
        given, no TF32 or reduced-precision reductions on GPU.
    """

    D0 = "D0"
    D1 = "D1"
    D2 = "D2"


@dataclass(frozen=True)
class RunSettings:
    """A job's run parameters; those marked *fixed* may not change across a restart."""

    num_ests: int  # fixed: N, the logical data-parallel world size
    global_batch_size: int  # fixed: B, B/N samples per EST per step
    total_steps: int  # global steps to reach (a restart continues to this count)
    seed: int = 0  # fixed: model init, EST RNGs, data order
    shard_size: int = 32  # fixed: samples per data shard
    loader_workers: int = 2  # fixed: logical loader workers per EST (augmentation RNGs)
    loader_procs: int = 0  # physical loader processes of this process (0: in-process)
    determinism: Determinism = Determinism.D1
    d2_threads: int = 1  # fixed under D2: intra-op threads every EST runs with
    checkpoint_every: int = 0  # checkpoint every K global steps (0: only at the end or on stop)
    keep_checkpoints: int = 2
    log_every: int = 10
    # fixed: the canonical summation order ("fold" only to show that the order matters)
    tree_shape: Shape = "balanced"
    est_rng_contexts: bool = True  # False only to show the per-EST contexts matter
    # The execution plan (Rubick), free to change between checkpoints; ESTs per process
    # and --threads are the plan's other dimensions.
    gradient_checkpointing: bool = False  # recompute activations in backward (recompute.py)
    offload_optimizer: bool = False  # on GPU: optimizer state and step on the host (offload.py)

    @property
    def per_est_batch(self) -> int:
        return self.global_batch_size // self.num_ests

    def validate(self) -> None:
        _positive(self.num_ests, "--ests")
        _positive(self.global_batch_size, "--batch-size")
        if self.global_batch_size % self.num_ests:
            raise ValidationError(
                "--batch-size",
                f"{self.global_batch_size} is not a multiple of the {self.num_ests} ESTs",
            )
        _positive(self.total_steps, "--steps")
        _positive(self.shard_size, "--shard-size")
        _positive(self.loader_workers, "--loader-workers")
        _positive(self.d2_threads, "--d2-threads")
        _positive(self.keep_checkpoints, "--keep-checkpoints")
        _positive(self.log_every, "--log-every")
        for value, flag in (
            (self.seed, "--seed"),
            (self.loader_procs, "--loader-procs"),
            (self.checkpoint_every, "--checkpoint-every"),
        ):
            if value < 0:
                raise ValidationError(flag, f"must be >= 0 (got {value})")
        if self.tree_shape not in ("balanced", "fold"):
            raise ValidationError("--tree", f"{self.tree_shape!r} is not balanced or fold")


def _positive(value: int, flag: str) -> None:
    if value < 1:
        raise ValidationError(flag, f"must be >= 1 (got {value})")


def even_mapping(num_ests: int, procs: int) -> tuple[int, ...]:
    """ESTs per process, as even as possible, the larger shares first."""
    check_procs(num_ests, procs)
    base, extra = divmod(num_ests, procs)
    return tuple(base + (1 if p < extra else 0) for p in range(procs))


def check_procs(num_ests: int, procs: int) -> None:
    _positive(num_ests, "--ests")
    if not 1 <= procs <= num_ests:
        raise ValidationError(
            "--procs", f"must be between 1 and the {num_ests} ESTs (got {procs}): 1 <= P <= N"
        )


def parse_mapping(text: str, num_ests: int, procs: int | None = None) -> tuple[int, ...]:
    """`2,1,1` -> ESTs per process; must have `procs` entries (if given) summing to N."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValidationError(
            "--mapping", f"{text!r} is not a comma-separated list of EST counts (e.g. 2,1,1)"
        ) from None
    if procs is not None and len(counts) != procs:
        raise ValidationError(
            "--mapping", f"{text!r} has {len(counts)} entries but --procs is {procs}"
        )
    if any(count < 1 for count in counts):
        raise ValidationError("--mapping", f"{text!r}: every process must run at least one EST")
    if sum(counts) != num_ests:
        raise ValidationError(
            "--mapping", f"{text!r} sums to {sum(counts)}, not to the {num_ests} ESTs (--ests)"
        )
    return counts


def placement(counts: Sequence[int]) -> list[list[int]]:
    """EST ids of each process: contiguous ranges in process order (2,1,1 -> [0,1],[2],[3])."""
    result: list[list[int]] = []
    start = 0
    for count in counts:
        result.append(list(range(start, start + count)))
        start += count
    return result
