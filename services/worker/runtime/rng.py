"""Random-number state of the global generators an EST (or a loader worker) draws from.

The states of torch's CPU (and current CUDA) generator, Python's `random` and
NumPy's legacy global generator are captured and restored as a unit, so code
that draws randomness (dropout, augmentation) sees the stream of the logical
worker it runs for, whichever process runs it. States convert to plain tensors
and numbers for checkpoints loadable with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class RngState:
    torch_cpu: torch.Tensor
    python: tuple[Any, ...]
    numpy: tuple[Any, ...]
    torch_cuda: torch.Tensor | None = None


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from a path of values (e.g. ("est", job_seed, 3)); stable across runs."""
    text = "gearshift/" + "/".join(str(part) for part in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def seeded(seed: int, *, cuda: bool = False) -> RngState:
    """The state all generators would have after seeding with `seed`; globals are untouched."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    words = np.array([(seed >> (32 * i)) & 0xFFFFFFFF for i in range(2)], dtype=np.uint32)
    cuda_state = None
    if cuda:
        cuda_gen = torch.Generator(device="cuda")
        cuda_gen.manual_seed(seed)
        cuda_state = cuda_gen.get_state()
    return RngState(
        torch_cpu=gen.get_state(),
        python=random.Random(seed).getstate(),
        numpy=np.random.RandomState(words).get_state(legacy=True),  # type: ignore[arg-type]
        torch_cuda=cuda_state,
    )


def capture(*, cuda: bool = False) -> RngState:
    """The global generators' current state."""
    return RngState(
        torch_cpu=torch.get_rng_state(),
        python=random.getstate(),
        numpy=np.random.get_state(legacy=True),  # type: ignore[arg-type]
        torch_cuda=torch.cuda.get_rng_state() if cuda else None,
    )


def restore(state: RngState) -> None:
    """Make the global generators continue from `state`."""
    torch.set_rng_state(state.torch_cpu)
    random.setstate(state.python)
    np.random.set_state(state.numpy)
    if state.torch_cuda is not None:
        torch.cuda.set_rng_state(state.torch_cuda)


def to_plain(state: RngState) -> dict[str, Any]:
    """Tensors, ints, floats and strings only (safe for weights_only loading)."""
    version, words, gauss = state.python
    kind, keys, pos, has_gauss, cached = state.numpy
    return {
        "torch_cpu": state.torch_cpu.clone(),
        "torch_cuda": None if state.torch_cuda is None else state.torch_cuda.clone(),
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.int64)},
        "python_gauss": gauss,
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }


def from_plain(data: dict[str, Any]) -> RngState:
    py = data["python"]
    npy = data["numpy"]
    return RngState(
        torch_cpu=data["torch_cpu"],
        torch_cuda=data["torch_cuda"],
        python=(py["version"], tuple(int(w) for w in py["words"].tolist()), data["python_gauss"]),
        numpy=(
            npy["kind"],
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached"],
        ),
    )
