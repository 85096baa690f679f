"""Checkpoints off the critical path: a snapshot in shared memory now, the file from a process.

As DLRover's flash checkpoint: at the step boundary the training state is copied into a
shared-memory arena (`layout`, then `fill`: every tensor's bytes, so the next optimizer step
cannot change what is written) and a writer process rebuilds it (`unpack`) and writes it with
`checkpoint.save` (temporary name, fsync, atomic rename). Training pauses only for the copy.

A process, not a thread: a thread writing beside the training loop shares its interpreter,
and on the 2-core CI host that held the loop 2-3 ms after every snapshot (longer than the
snapshot itself), however short the switch interval. The writer is forked from the training
process, so it needs no imports and no start-up of its own, and it dies with it
(PR_SET_PDEATHSIG): a trainer killed mid-write never has a checkpoint land after it is gone.

One write is in flight at a time: a snapshot taken while the previous write still runs waits
for it, so files land in step order and the arena holds one snapshot. A process that stops
waits for the write before it exits (`wait`). A writer killed mid-write leaves the temporary
file, which readers never look at; the previous checkpoint stays the latest, the training
process hears of it at its next `wait`, and the next write starts a new writer.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import mmap
import multiprocessing
import multiprocessing.util  # its exit handler (which kills daemons) must run after ours
import os
import pickle
import signal
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gearshift.worker.runtime import checkpoint


class Slot:
    """Where one tensor's bytes are in the arena. Not a tuple: `map_nested` rebuilds tuples."""

    __slots__ = ("dtype", "nbytes", "offset", "shape")

    def __init__(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]):
        self.offset, self.nbytes, self.dtype, self.shape = offset, nbytes, dtype, shape

    def __reduce__(self) -> tuple[type[Slot], tuple[int, int, torch.dtype, tuple[int, ...]]]:
        return (Slot, (self.offset, self.nbytes, self.dtype, self.shape))


_ATOMS = frozenset({int, float, str, bool, bytes, type(None)})


def layout(state: Any) -> tuple[Any, list[torch.Tensor | np.ndarray], int]:
    """The state with its tensors and NumPy arrays replaced by slots, the sources in arena
    order, and the arena size. A tensor met twice takes one slot (tied weights stay tied).
    Arrays (the RNG states, rng.to_plain) come back as the tensors they are written as: through
    the pipe they would fill it (200 KB on the digits CNN) and wait for the writer to read."""
    memo: dict[int, Slot] = {}
    sources: list[torch.Tensor | np.ndarray] = []
    end = 0

    def walk(value: Any) -> Any:  # on the step's pause: atoms are not even a call
        nonlocal end
        kind = type(value)
        if kind in _ATOMS:
            return value
        if isinstance(value, dict):  # an OrderedDict state dict too, kept as a dict
            return {k: v if type(v) in _ATOMS else walk(v) for k, v in value.items()}
        if kind is np.ndarray or isinstance(value, torch.Tensor):
            slot = memo.get(id(value))
            if slot is None:
                if kind is np.ndarray:
                    slot = Slot(end, value.nbytes, _torch_dtype(value.dtype), value.shape)
                else:
                    nbytes = value.numel() * value.element_size()
                    slot = Slot(end, nbytes, value.dtype, tuple(value.shape))
                memo[id(value)] = slot
                sources.append(value)
                end += slot.nbytes
            return slot
        if isinstance(value, list):
            return [v if type(v) in _ATOMS else walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(v if type(v) in _ATOMS else walk(v) for v in value)
        return value

    return walk(state), sources, end


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    found = _DTYPES.get(dtype)
    if found is None:
        found = _DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return found


_DTYPES: dict[np.dtype[Any], torch.dtype] = {}


def fill(arena: torch.Tensor, sources: list[torch.Tensor | np.ndarray]) -> None:
    """Copy the sources' bytes one after another into the arena's start: through NumPy where
    a source has a NumPy form (a CPU tensor of a NumPy dtype), else through torch (bfloat16,
    a GPU tensor). Two operations per source: they are on the step's pause."""
    flat = arena.numpy()
    offset = 0
    for source in sources:
        try:
            array = source if isinstance(source, np.ndarray) else source.detach().numpy()
        except TypeError:
            assert isinstance(source, torch.Tensor)
            part = source.detach().reshape(-1).view(torch.uint8)
            arena[offset : offset + part.numel()].copy_(part)
            offset += part.numel()
            continue
        flat[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8)
        offset += array.nbytes


def map_nested(state: Any, leaf: Callable[[Any], Any]) -> Any:
    """The state with its dicts, lists and tuples rebuilt and every other value through
    `leaf` (an OrderedDict comes back a dict)."""
    if isinstance(state, dict):
        return {key: map_nested(value, leaf) for key, value in state.items()}
    if isinstance(state, list):
        return [map_nested(value, leaf) for value in state]
    if isinstance(state, tuple):
        return tuple(map_nested(value, leaf) for value in state)
    return leaf(state)


def unpack(skeleton: Any, arena: torch.Tensor) -> Any:
    """The state back, each slot a fresh tensor (one per slot: what was tied stays tied)."""
    memo: dict[int, torch.Tensor] = {}

    def leaf(value: Any) -> Any:
        if not isinstance(value, Slot):
            return value
        found = memo.get(value.offset)
        if found is None:
            raw = arena[value.offset : value.offset + value.nbytes].clone()  # aligned
            found = memo[value.offset] = raw.view(value.dtype).reshape(value.shape)
        return found

    return map_nested(skeleton, leaf)


def host_copy(state: Any) -> Any:
    """A copy of a nested state (dicts, lists, tuples, tensors, scalars) whose tensors are
    fresh CPU tensors with the same bytes; a tensor met twice is copied once (tied weights)."""
    memo: dict[int, torch.Tensor] = {}

    def leaf(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        found = memo.get(id(value))
        if found is None:
            found = memo[id(value)] = value.detach().to("cpu", copy=True)
        return found

    return map_nested(state, leaf)


class _Arena:
    """A memory file (memfd) shared with the writer by fork, mapped on both sides; it grows by
    truncation and each side maps it again at the size the message names."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0
        self._map: mmap.mmap | None = None
        self.bytes = torch.empty(0, dtype=torch.uint8)

    def map(self, size: int) -> torch.Tensor:
        """The file mapped at `size` bytes (the writer: the size the message names)."""
        if size != self.size or self._map is None:
            self.bytes = torch.empty(0, dtype=torch.uint8)  # drop the old view before unmapping
            if self._map is not None:
                # A view still alive somewhere: the GC unmaps it.
                with contextlib.suppress(BufferError):
                    self._map.close()
            self._map = mmap.mmap(self.fd, size)
            self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)
            self.size = size
        return self.bytes

    def reserve(self, size: int) -> torch.Tensor:
        """The training process's side: at least `size` bytes (never shrunk, never empty)."""
        if size > self.size or self._map is None:
            size = max(size, self.size, 1)
            os.ftruncate(self.fd, size)
            return self.map(size)
        return self.bytes


WRITER_NAME = "gearshift-ckpt"  # the writer's process name (`ps`, /proc/PID/comm)


def _die_with_parent(parent: int) -> None:
    """Named, and killed with its training process (Linux's prctl)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, WRITER_NAME.encode())  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux: the EOF on the pipe ends it instead
        pass
    if os.getppid() != parent:  # the parent was gone before the prctl
        os._exit(0)


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def _serve(conn: Connection, theirs: Connection, fd: int, parent: int) -> None:
    """The writer process: a message per snapshot, an answer once its file is durable; None
    (or the training process gone) ends it."""
    theirs.close()  # the training process's end, inherited by the fork
    _die_with_parent(parent)
    # A stop is the training process's to handle (it waits for this write, then closes the
    # pipe): a Ctrl-C or SIGTERM to the process group must not cut a write short. Blocked
    # across the fork (`start`), so none arrives before it is ignored.
    for sig in _STOPS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    # Background work that still needs its full share of CPU: SCHED_BATCH keeps a woken writer
    # from preempting the training process (2-3 ms after every snapshot on the busy 2-core CI
    # host), where a nice level would also starve it (a 63 MB write then stalls the next one).
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    # The intra-op thread pool did not survive the fork (OpenMP's hangs in its next parallel
    # region): every copy here runs inline.
    torch.set_num_threads(1)
    arena = _Arena(fd)
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            message = None
        if message is None:
            os._exit(0)
        directory, step, skeleton, keep, size = message
        state: Any = None
        try:
            state = unpack(skeleton, arena.map(size))
            answer: tuple[Path | None, BaseException | None] = (
                checkpoint.save(directory, step, state, keep),
                None,
            )
        except BaseException as exc:  # handed to the training process at its next wait
            answer = (None, exc)
        del state  # the snapshot's tensors are not held while idle
        try:
            conn.send(answer)
        except Exception as exc:  # an error that does not pickle: its text goes instead
            conn.send((None, RuntimeError(repr(answer[1]) or str(exc))))


class CheckpointWriter:
    """Writes snapshots from a forked process, one at a time, in the order given."""

    def __init__(self) -> None:
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._arena: _Arena | None = None
        self._in_flight: Path | None = None
        self.written: list[Path] = []  # files made durable, oldest first
        _LIVE.add(self)

    def start(self) -> None:
        """Fork the writer now, off any step's pause (else the first write forks it)."""
        if self._process is not None and self._process.is_alive():
            return
        self.close()
        fd = os.memfd_create("gearshift-checkpoint", os.MFD_CLOEXEC)
        ours, theirs = multiprocessing.Pipe()
        process = multiprocessing.get_context("fork").Process(
            target=_serve,
            args=(theirs, ours, fd, os.getpid()),
            name="checkpoint-writer",
            daemon=True,
        )
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        theirs.close()
        self._conn, self._process, self._arena = ours, process, _Arena(fd)

    def submit(self, directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
        """Snapshot `state` (the live one: its tensors are copied here) and start writing it
        as the checkpoint of `step`; returns the path it will have. Waits first for the
        previous write; raises its error if any."""
        self.wait()
        self.start()
        assert self._conn is not None and self._arena is not None
        skeleton, tensors, size = layout(state)
        fill(self._arena.reserve(size), tensors)
        # pickle.dumps, not Connection.send's ForkingPickler: a class built per message.
        message = (directory, step, skeleton, keep, self._arena.size)
        self._conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        self._in_flight = directory / checkpoint.file_name(step)
        return self._in_flight

    def wait(self) -> None:
        """Return once no write is in flight; a failed write's error is raised here."""
        if self._in_flight is None or self._conn is None:
            return
        self._in_flight = None
        try:
            path, error = self._conn.recv()
        except (EOFError, OSError):
            assert self._process is not None
            self._process.join(timeout=5)
            code = self._process.exitcode
            self.close()
            raise RuntimeError(
                f"the checkpoint writer process died mid-write (exit code {code}); "
                "the previous checkpoint is still the latest"
            ) from None
        if error is not None:
            raise error
        self.written.append(path)

    def close(self) -> None:
        """Stop the writer. Call `wait` first: a write still in flight gets 5 s to finish,
        then the writer is killed (the temporary file stays, the previous checkpoint with it)."""
        conn, process, arena = self._conn, self._process, self._arena
        self._conn = self._process = self._arena = None
        self._in_flight = None
        if conn is not None:
            with contextlib.suppress(OSError):  # the writer is gone already
                conn.send_bytes(pickle.dumps(None))
            conn.close()
        if process is not None:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        if arena is not None:
            os.close(arena.fd)


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
        writer.close()
