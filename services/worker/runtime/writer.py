"""Checkpoints off the critical path: a host-memory snapshot now, the file from a thread.

As DLRover's flash checkpoint: at the step boundary the training state is copied into
host memory (`host_copy`: every tensor cloned to the CPU, so the next optimizer step
cannot change what is written) and a background thread writes that copy with
`checkpoint.save` (temporary name, fsync, atomic rename). Training pauses only for the
copy. One write is in flight at a time: a snapshot taken while the previous write still
runs waits for it, so files land in step order and at most one snapshot is held besides
the live state. A process that stops waits for the write before it exits (`wait`); one
killed mid-write leaves the temporary file, which readers never look at, and the
previous checkpoint stays the latest.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from pathlib import Path
from typing import Any

import torch

from gearshift.worker.runtime import checkpoint


def host_copy(state: Any, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """A copy of a nested state (dicts, lists, tuples, tensors, scalars) whose tensors are
    fresh CPU tensors with the same bytes; a tensor met twice is copied once (tied weights)."""
    memo = {} if memo is None else memo
    if isinstance(state, torch.Tensor):
        found = memo.get(id(state))
        if found is None:
            found = memo[id(state)] = state.detach().to("cpu", copy=True)
        return found
    if isinstance(state, dict):
        return {key: host_copy(value, memo) for key, value in state.items()}
    if isinstance(state, list):
        return [host_copy(value, memo) for value in state]
    if isinstance(state, tuple):
        return tuple(host_copy(value, memo) for value in state)
    return state


class CheckpointWriter:
    """Writes snapshots in a background thread, one at a time, in the order given.

    The thread is started at the first write and then waits for the next one: starting a
    thread per write would cost the step a GIL hand-over (about 5 ms, the interpreter's
    switch interval) while the new thread begins pickling.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queued: tuple[Path, int, dict[str, Any], int] | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.written: list[Path] = []  # files made durable, oldest first
        _LIVE.add(self)

    def submit(self, directory: Path, step: int, snapshot: dict[str, Any], keep: int) -> Path:
        """Start writing `snapshot` (already a host copy) as the checkpoint of `step`; returns
        the path it will have. Waits first for the previous write; raises its error if any."""
        self.wait()
        with self._cond:
            self._queued = (directory, step, snapshot, keep)
            self._busy = True
            if self._thread is None:
                # A daemon thread, so that an idle writer never holds the process; `wait` at
                # the end of a run, and at exit (below), lets a write in flight finish.
                self._thread = threading.Thread(
                    target=self._loop, name="checkpoint-writer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        return directory / checkpoint.file_name(step)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._queued is None:
                    self._cond.wait()
                directory, step, snapshot, keep = self._queued
                self._queued = None
            error: BaseException | None = None
            try:
                self.written.append(checkpoint.save(directory, step, snapshot, keep))
            except BaseException as exc:  # handed to the training thread at its next call
                error = exc
            del snapshot  # the host copy is not held while idle
            with self._cond:
                self._busy = False
                self._error = error
                self._cond.notify_all()

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy

    def wait(self) -> None:
        """Return once no write is in flight; a failed write's error is raised here."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            error, self._error = self._error, None
        if error is not None:
            raise error


_LIVE: weakref.WeakSet[CheckpointWriter] = weakref.WeakSet()


@atexit.register
def _finish_writes() -> None:
    """A process that exits without waiting (an error path) still finishes a write in
    flight; its error, if any, is only logged then, as nothing is left to raise it to."""
    for writer in list(_LIVE):
        try:
            writer.wait()
        except Exception:
            logging.getLogger("gearshift.worker.runtime").exception("checkpoint write failed")
