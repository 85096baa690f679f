"""An EST's context — the only per-EST state besides its gradient — and switching it in and out.

A context is the EST's RNG state, its data position and the RNG states of its
logical loader workers (EasyScale's R(i, j)). Parameters, optimizer state and
buffers are shared by all ESTs of a process, so a switch at a mini-batch
boundary moves only a few kilobytes of RNG state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gearshift.worker.runtime.data import DataPosition
from gearshift.worker.runtime.rng import (
    RngState,
    capture,
    derive_seed,
    from_plain,
    install_numpy_generator,
    numpy_generator,
    restore,
    seeded,
    to_plain,
)


@dataclass
class EstContext:
    est: int
    rng: RngState
    position: DataPosition
    loader_rng: list[RngState]


def fresh_context(est: int, seed: int, loader_workers: int, *, cuda: bool = False) -> EstContext:
    """EST `est`'s context at step 0.

    Like a PyTorch DataLoader, the loader workers' base seed is drawn from the
    EST's own torch generator (inside its context), and worker j is seeded with
    base + j.
    """
    rng = seeded(derive_seed("est", seed, est), cuda=cuda)
    gen = torch.Generator()
    gen.set_state(rng.torch_cpu)
    base = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
    rng.torch_cpu = gen.get_state()
    loader_rng = [seeded(derive_seed("loader", base, j)) for j in range(loader_workers)]
    return EstContext(est, rng, DataPosition(), loader_rng)


class HasRng(Protocol):
    rng: RngState


@dataclass
class RngSlot:
    """An RNG state shared by the whole job (optimizer and scheduler steps run inside it)."""

    rng: RngState


class Switcher:
    """Runs code inside an RNG state: restore on entry, capture on exit.

    `enabled=False` lets every EST draw from the process's one stream — only to
    show that per-EST contexts are what keeps placements bitwise equal.
    `threads` pins the intra-op thread count inside every context (D2).
    """

    def __init__(self, *, enabled: bool = True, cuda: bool = False, threads: int | None = None):
        self.enabled = enabled
        self.cuda = cuda
        self.threads = threads

    @contextmanager
    def inside(self, holder: HasRng) -> Iterator[None]:
        if self.threads is not None and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if not self.enabled:
            yield
            return
        outer_numpy = numpy_generator()
        restore(holder.rng)
        try:
            yield
        finally:
            holder.rng = capture(cuda=self.cuda)
            # Draws outside the context must not advance the context's NumPy generator.
            install_numpy_generator(outer_numpy)


def context_to_plain(ctx: EstContext) -> dict[str, Any]:
    return {
        "est": ctx.est,
        "rng": to_plain(ctx.rng),
        "position": {"epoch": ctx.position.epoch, "offset": ctx.position.offset},
        "loader_rng": [to_plain(state) for state in ctx.loader_rng],
    }


def context_from_plain(data: dict[str, Any]) -> EstContext:
    pos = data["position"]
    return EstContext(
        est=int(data["est"]),
        rng=from_plain(data["rng"]),
        position=DataPosition(int(pos["epoch"]), int(pos["offset"])),
        loader_rng=[from_plain(state) for state in data["loader_rng"]],
    )
