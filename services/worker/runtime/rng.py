"""Random-number state of the global generators an EST (or a loader worker) draws from.

The states of torch's CPU (and current CUDA) generator and Python's `random` are
copied in and out; NumPy's global generator is swapped as an object
(`set_bit_generator`, O(1) instead of copying its 2.5 KB state
through Python). A swap drops the legacy API's cached second Gaussian, so an EST
never carries one across a switch — in every placement alike, since switches
happen only at mini-batch boundaries. States convert to plain tensors and
numbers for checkpoints loadable with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.random.mtrand import get_bit_generator, set_bit_generator


@dataclass
class RngState:
    torch_cpu: torch.Tensor
    python: tuple[Any, ...]
    numpy: np.random.MT19937  # live: draws advance it while it is installed
    torch_cuda: torch.Tensor | None = None


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from a path of values (e.g. ("est", job_seed, 3)); stable across runs."""
    text = "gearshift/" + "/".join(str(part) for part in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def seeded(seed: int, *, cuda: bool = False) -> RngState:
    """Fresh generators seeded from `seed`; the globals are untouched."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    cuda_state = None
    if cuda:
        cuda_gen = torch.Generator(device="cuda")
        cuda_gen.manual_seed(seed)
        cuda_state = cuda_gen.get_state()
    return RngState(
        torch_cpu=gen.get_state(),
        python=random.Random(seed).getstate(),
        numpy=np.random.MT19937(seed),
        torch_cuda=cuda_state,
    )


def numpy_generator() -> np.random.MT19937:
    """The bit generator behind NumPy's global functions (np.random.normal, ...)."""
    bit_generator = get_bit_generator()
    if not isinstance(bit_generator, np.random.MT19937):
        raise TypeError(f"NumPy's global bit generator is {type(bit_generator).__name__}")
    return bit_generator


def install_numpy_generator(bit_generator: np.random.MT19937) -> None:
    set_bit_generator(bit_generator)


def capture(*, cuda: bool = False) -> RngState:
    """The global generators' state now (NumPy's generator by reference)."""
    return RngState(
        torch_cpu=torch.get_rng_state(),
        python=random.getstate(),
        numpy=numpy_generator(),
        torch_cuda=torch.cuda.get_rng_state() if cuda else None,
    )


def snapshot(*, cuda: bool = False) -> RngState:
    """Like `capture`, with a copy of NumPy's generator: later draws do not change it."""
    state = capture(cuda=cuda)
    state.numpy = copy.deepcopy(state.numpy)
    return state


def restore(state: RngState) -> None:
    """Make the global generators continue from `state` (NumPy's: install its generator)."""
    torch.set_rng_state(state.torch_cpu)
    random.setstate(state.python)
    install_numpy_generator(state.numpy)
    if state.torch_cuda is not None:
        torch.cuda.set_rng_state(state.torch_cuda)


_MT_WORDS = ctypes.c_uint32 * 625  # NumPy's mt19937_state: uint32_t key[624]; int pos


def _mt_raw(bit_generator: np.random.MT19937) -> tuple[np.ndarray, int]:
    """The key and position read straight from the generator's C state, through NumPy's
    public ctypes interface: a microsecond, where the `state` property copies the key word by
    word (30 us, once per EST and loader worker on every checkpoint's critical path)."""
    words = np.ctypeslib.as_array(_MT_WORDS.from_address(bit_generator.ctypes.state_address))
    return words[:624].copy(), int(words[624:].view(np.int32)[0])


def _mt_property(bit_generator: np.random.MT19937) -> tuple[np.ndarray, int]:
    state = bit_generator.state["state"]
    return state["key"], int(state["pos"])


def _raw_read_holds() -> bool:
    """The C layout `_mt_raw` reads is NumPy's, not a promise: it is checked once against the
    property on a generator part-way through its key, and the property used if they differ."""
    probe = np.random.MT19937(20261129)
    probe.random_raw(1001)
    key, pos = _mt_raw(probe)
    expected_key, expected_pos = _mt_property(probe)
    return pos == expected_pos and bool((key == expected_key).all())


numpy_key_and_pos = _mt_raw if _raw_read_holds() else _mt_property


def to_plain(state: RngState) -> dict[str, Any]:
    """NumPy arrays, ints, floats and strings: arrays pickle in C (to the checkpoint writer, to
    peers), and `checkpoint.save` writes them as tensors (safe for weights_only loading). The
    torch states are views: a state's tensors are never changed in place, and every consumer
    (the snapshot, a pickle, `checkpoint.as_tensors`) copies them."""
    version, words, gauss = state.python
    key, pos = numpy_key_and_pos(state.numpy)
    return {
        "torch_cpu": state.torch_cpu.numpy(),
        "torch_cuda": None if state.torch_cuda is None else state.torch_cuda.numpy(),
        # Through NumPy: a third of torch.tensor's time on 625 ints, the same int64 bytes
        # (it is on the path of every checkpoint, once per EST and loader worker).
        "python": {"version": version, "words": np.fromiter(words, np.int64, len(words))},
        "python_gauss": gauss,
        "numpy": {"key": key.astype(np.int64), "pos": pos},
    }


def from_plain(data: dict[str, Any]) -> RngState:
    """The state back from `to_plain`'s arrays or a checkpoint's tensors."""
    py = data["python"]
    bit_generator = np.random.MT19937()
    bit_generator.state = {
        "bit_generator": "MT19937",
        "state": {
            "key": np.asarray(data["numpy"]["key"]).astype(np.uint32),
            "pos": int(data["numpy"]["pos"]),
        },
    }
    return RngState(
        torch_cpu=torch.as_tensor(data["torch_cpu"]),
        torch_cuda=None if data["torch_cuda"] is None else torch.as_tensor(data["torch_cuda"]),
        python=(py["version"], tuple(np.asarray(py["words"]).tolist()), data["python_gauss"]),
        numpy=bit_generator,
    )
