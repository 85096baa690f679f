"""Checkpoint files, written atomically: a crash mid-write never hides the last good one.

A checkpoint is `ckpt-<step>.pt` in the checkpoint directory. It is written to a
temporary name, flushed to disk, then renamed (atomic on POSIX) and the
directory synced; readers only look at final names, so a half-written file is
never read. The newest `keep` checkpoints are kept.

Every checkpoint written is also recorded in `checkpoints.log` in the same folder, so a
resume that finds no checkpoint can tell a job that never checkpointed (it starts at
step 0, and says so) from one whose checkpoints are gone (an error naming the path:
never a silent restart from scratch).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

_FINAL = re.compile(r"^ckpt-(\d{8,})\.pt$")
RECORD = "checkpoints.log"


def file_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


def checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _FINAL.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest(directory: Path) -> Path | None:
    found = checkpoints(directory)
    return found[-1][1] if found else None


def recorded(directory: Path) -> tuple[int, Path] | None:
    """(step, path) of the last checkpoint ever written here, whether or not it is still there."""
    try:
        lines = (directory / RECORD).read_text().split()
    except FileNotFoundError:
        return None
    if len(lines) < 2 or not lines[-2].isdigit():
        return None
    return int(lines[-2]), directory / lines[-1]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def as_tensors(state: Any) -> Any:
    """The state with its NumPy arrays as tensors: RNG states travel as arrays (rng.to_plain)
    and are written as tensors, which weights_only loading accepts."""
    if isinstance(state, np.ndarray):
        return torch.from_numpy(state.copy())
    if isinstance(state, dict):
        items = {key: as_tensors(value) for key, value in state.items()}
        # A dict without arrays is kept as it is (a state dict's class and metadata).
        return state if all(items[key] is value for key, value in state.items()) else items
    if isinstance(state, (list, tuple)):
        values = [as_tensors(value) for value in state]
        if all(new is old for new, old in zip(values, state, strict=True)):
            return state
        return values if isinstance(state, list) else tuple(values)
    return state


def save(directory: Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write the checkpoint of `step` (its arrays as tensors); returns its path once it is
    durable."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".ckpt-*.tmp-*"):
        stale.unlink(missing_ok=True)
    final = directory / file_name(step)
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    try:
        with tmp.open("wb") as out:
            torch.save(as_tensors(payload), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(directory)
    with (directory / RECORD).open("a") as record:
        record.write(f"{step} {final.name}\n")
        record.flush()
        os.fsync(record.fileno())
    for _, old in checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def discard(path: Path, written: os.stat_result) -> bool:
    """Remove a checkpoint this process wrote (`written`: its stat right after `save`) that
    must never be resumed from: its writer learnt, once it was on disk, that a newer
    placement of the job had taken over. A file of the same step written since by that
    placement is another file (another inode) and is left alone. True when removed."""
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    if (now.st_dev, now.st_ino) != (written.st_dev, written.st_ino):
        return False
    path.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return True


def load(path: Path) -> dict[str, Any]:
    """A checkpoint's payload (tensors, numbers, strings only: no code runs on load)."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != 1:
        raise ValueError(f"{path} is not a Gearshift checkpoint (format 1)")
    return data
