"""The CPU cores and host memory each training process gets on its worker (StartTask).

By default a worker's cores and memory are shared equally among its devices (one
process per device); a plan's `cpus_per_device` overrides the core count. A resource
plan (DLRover, gearshift.scheduler.plugins.dlrover.resource_plans) sets cores and memory too, within
that share for cores (more would be refused by the worker when its devices are busy)
and within the worker's memory. A worker
with more devices than cores (CPU slots on a small machine) gets no core limit by
default rather than a start its worker would refuse; an explicit count is sent as is.

A job whose process ran out of memory restarts with twice the memory (DLRover's
relaunch), each time again, up to the worker's whole memory (`memory_factor`); one
that ran out of memory with the whole memory of the largest worker cannot fit and
fails (`cannot_fit`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gearshift.v1 import common_pb2


def process_resources(
    worker_cores: int,
    worker_memory: int,
    devices: Sequence[common_pb2.DeviceGroup],
    cpus_per_device: int = 0,
    memory_factor: int = 1,
    *,
    plan_cores: int = 0,
    plan_memory: int = 0,
) -> tuple[int, int]:
    """(cores, memory bytes) of each process on a worker; 0 means no limit (unknown).
    `plan_cores` / `plan_memory` (0: none) are the job's resource plan's."""
    count = max(sum(g.count for g in devices), 1)
    share = worker_cores // count
    if cpus_per_device > 0:
        cores = cpus_per_device
    elif plan_cores > 0 and share > 0:
        cores = min(plan_cores, share)
    else:
        cores = share
    base = plan_memory if plan_memory > 0 else worker_memory // count
    memory = base * max(memory_factor, 1)
    if worker_memory > 0:
        memory = min(memory, worker_memory)
    return max(cores, 0), max(memory, 0)


def launcher_cores(total_cores: float, slot_cores: int) -> int:
    """Cores a parameter-server job's one process (its launcher) holds on its worker: its
    plan's total, whole, at most its slot's (0: the slot is unknown, no limit)."""
    return max(min(math.ceil(total_cores - 1e-9), slot_cores), 1) if slot_cores > 0 else 0


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
