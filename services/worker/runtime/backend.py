"""Which GPU a training process takes and which torch.distributed backend its job uses.

NCCL moves tensors from GPU to GPU, but needs a GPU of its own for every rank (two ranks
on one GPU fail at NCCL's start); gloo works everywhere, GPU tensors travelling through
host copies. So: gloo on CPU; on CUDA, NCCL when no two processes of the job share a GPU,
gloo when some do. Every process of a job must pick the same backend, so the choice looks
at the whole placement, never at one process alone.

Torch-free: the worker daemon decides for the processes it starts before they exist.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from gearshift.common.errors import ValidationError

BACKENDS = ("auto", "nccl", "gloo")


def choose_backend(device: str, gpus: Sequence[Hashable]) -> str:
    """The backend of a job whose process r uses GPU `gpus[r]` (anything that names one
    physical GPU, e.g. (worker id, device index)); `device` is cpu or cuda."""
    if device != "cuda":
        return "gloo"
    return "nccl" if len(set(gpus)) == len(gpus) else "gloo"


def one_machine_gpus(procs: int, visible: int) -> list[int]:
    """The local launcher's layout (every process on this machine): rank r takes visible GPU
    r mod the number visible, so P processes share the GPUs round-robin."""
    return [rank % visible for rank in range(procs)]


@dataclass(frozen=True)
class DeviceChoice:
    """Where one process trains and how it talks to its peers."""

    gpu: int | None  # index among the visible GPUs (CUDA_VISIBLE_DEVICES); None on CPU
    backend: str  # gloo or nccl
    on_gpu_transport: bool  # the backend takes tensors from the GPU (NCCL), not host memory


def choose_device(
    device: str,
    rank: int,
    procs: int,
    visible: int,
    *,
    local_device: int | None = None,
    backend: str = "auto",
) -> DeviceChoice:
    """This process's device and its job's backend; ValidationError names the flag at fault.

    Without --local-device (the launcher, or a process started by hand) every process is
    taken to run on this machine with `one_machine_gpus`, and `auto` follows from that.
    A process told its GPU (--local-device, as the worker daemon does) cannot know where
    its peers run, so it must be told the backend too.
    """
    if backend not in BACKENDS:
        raise ValidationError("--backend", f"{backend!r} is not one of {', '.join(BACKENDS)}")
    if device == "cpu":
        if local_device is not None:
            raise ValidationError("--local-device", "is only for --device cuda")
        if backend == "nccl":
            raise ValidationError("--backend", "nccl needs --device cuda")
        return DeviceChoice(None, "gloo", False)
    if device != "cuda":
        raise ValidationError("--device", f"{device!r} is not cpu or cuda")
    if visible < 1:
        raise ValidationError("--device", "cuda was asked for but no GPU is visible")
    if local_device is None:
        gpus = one_machine_gpus(procs, visible)
        gpu = gpus[rank]
        chosen = choose_backend(device, gpus) if backend == "auto" else backend
        if chosen == "nccl" and choose_backend(device, gpus) != "nccl":
            raise ValidationError(
                "--backend",
                f"nccl needs a GPU per process: {procs} processes share {visible} visible GPU(s)",
            )
    else:
        if not 0 <= local_device < visible:
            raise ValidationError(
                "--local-device",
                f"{local_device} is not a visible GPU (0..{visible - 1}, CUDA_VISIBLE_DEVICES)",
            )
        if backend == "auto":
            raise ValidationError(
                "--backend",
                "give nccl or gloo with --local-device: the peers' GPUs are not known here",
            )
        gpu, chosen = local_device, backend
    return DeviceChoice(gpu, chosen, chosen == "nccl")
