"""SHA-256 of a training state and a byte-exact comparison of two states.

Bytes, not values: `torch.equal` calls -0.0 equal to 0.0 and NaN unequal to
itself, and bitwise determinism is about bytes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any

import torch


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) of a nested state: dicts (sorted keys), lists, tuples, tensors, scalars."""
    if isinstance(obj, dict):
        for key in sorted(obj, key=str):
            yield from leaves(obj[key], f"{path}/{key}")
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            yield from leaves(item, f"{path}/{i}")
    else:
        yield path, obj


def _leaf_bytes(leaf: Any) -> bytes:
    if isinstance(leaf, torch.Tensor):
        return f"{leaf.dtype}{tuple(leaf.shape)}".encode() + tensor_bytes(leaf)
    if isinstance(leaf, float):
        return b"f" + struct.pack("<d", leaf)
    return repr(leaf).encode()


def state_digest(state: Any) -> str:
    """Hex SHA-256 over every leaf's path and bytes."""
    digest = hashlib.sha256()
    for path, leaf in leaves(state):
        digest.update(path.encode() + b"\0" + _leaf_bytes(leaf) + b"\0")
    return digest.hexdigest()


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What the final digest covers: parameters, buffers, and optimizer state."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def differences(a: Any, b: Any, limit: int = 10) -> list[str]:
    """Paths where two states differ in structure or bytes (at most `limit`)."""
    left, right = dict(leaves(a)), dict(leaves(b))
    out = [f"{p}: only in first" for p in left.keys() - right.keys()]
    out += [f"{p}: only in second" for p in right.keys() - left.keys()]
    for path in sorted(left.keys() & right.keys()):
        if _leaf_bytes(left[path]) != _leaf_bytes(right[path]):
            out.append(f"{path}: bytes differ")
        if len(out) >= limit:
            break
    return out[:limit]
