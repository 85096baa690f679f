"""The CPU cores and host memory each training process gets on its worker (StartTask).

By default a worker's cores and memory are shared equally among its devices (one
process per device); a plan's `cpus_per_device` overrides the core count. A worker
with more devices than cores (CPU slots on a small machine) gets no core limit by
default rather than a start its worker would refuse; an explicit count is sent as is.

A job whose process ran out of memory restarts with twice the memory (DLRover's
relaunch), each time again, up to the worker's whole memory (`memory_factor`).
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
