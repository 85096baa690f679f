"""The CPU cores and host memory each training process gets on its worker (StartTask).

By default a worker's cores and memory are shared equally among its devices (one
process per device); a plan's `cpus_per_device` overrides the core count. A worker
with more devices than cores (CPU slots on a small machine) gets no core limit by
default rather than a start its worker would refuse; an explicit count is sent as is.

A job whose process ran out of memory restarts with twice the memory (DLRover's
relaunch), each time again, up to the worker's whole memory (`memory_factor`); one
that ran out of memory with the whole memory of the largest worker cannot fit and
fails (`cannot_fit`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gearshift.v1 import common_pb2


def process_resources(
    worker_cores: int,
    worker_memory: int,
    devices: Sequence[common_pb2.DeviceGroup],
    cpus_per_device: int = 0,
    memory_factor: int = 1,
) -> tuple[int, int]:
    """(cores, memory bytes) of each process on a worker; 0 means no limit (unknown)."""
    count = max(sum(g.count for g in devices), 1)
    cores = cpus_per_device if cpus_per_device > 0 else worker_cores // count
    memory = min(worker_memory // count * max(memory_factor, 1), worker_memory)
    return max(cores, 0), max(memory, 0)


def cannot_fit(memory_had: int, worker_memories: Sequence[int]) -> bool:
    """Whether a process that ran out of memory with `memory_had` bytes can get no more:
    it had the whole memory of the largest (live) worker. Unknown memory (0) never
    decides it."""
    most = max(worker_memories, default=0)
    return memory_had > 0 and most > 0 and memory_had >= most


def memory_text(n: int) -> str:
    """`480 MiB`-style bytes, for event messages."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"
