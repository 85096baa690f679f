"""The GPUs a task's training processes see and take (`--accelerator cuda`).

Every process of a task sees all the task's GPUs on this worker (CUDA_VISIBLE_DEVICES:
their indices, ascending) and takes its own by its position there (TrainingProcess's
`local_device`, the runner's `--local-device`), as processes started by torchrun see the
node's GPUs and take their local rank's. A process shown only its own GPU would still
train, but NCCL then cannot use CUDA IPC between the processes of one machine
(NVIDIA/nccl#129).

The backend (TrainingTask's `backend`, see `TaskPlan.training_task`) comes from the whole
placement, which every worker of the job is given alike, so all the job's processes pick
the same one: NCCL when no two processes share a GPU (a GPU is a worker id and a device
index), which the scheduler's one process per device always gives; gloo otherwise. On CPU
nothing is added: gloo, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

VISIBLE_VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class GpuView:
    """What one local rank is shown and told."""

    visible: str  # CUDA_VISIBLE_DEVICES
    local_device: int  # --local-device: its GPU's position in `visible`


def task_gpus(device_of: Mapping[int, int]) -> dict[int, GpuView]:
    """Local rank -> its view, from local rank -> device index on this worker."""
    indices = sorted(set(device_of.values()))
    visible = ",".join(str(index) for index in indices)
    return {rank: GpuView(visible, indices.index(device)) for rank, device in device_of.items()}
