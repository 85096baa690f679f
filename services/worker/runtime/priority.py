"""Low priority for a background task's training process (DeepPool's multiplexing): CPU
scheduling, and on CUDA the priority of the stream its kernels run on.

SCHED_IDLE runs the process only when a CPU has nothing else to do, so a
foreground job on the same CPU slots keeps its speed; where the policy is not
permitted (a seccomp profile, an old kernel) nice 19 is the next best. Linux
applies both to the calling thread and to the threads it creates later, so this
runs first thing in the process (a zygote's fork included), before torch, gloo or
a reporter starts a thread. Foreground and shared tasks never call it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

NICEST = 19


def lower_priority() -> str:
    """Give this process the lowest CPU priority it may take; says which it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError) as exc:  # no SCHED_IDLE here, or not permitted
        refused = f"SCHED_IDLE not permitted: {exc}"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICEST)
        return f"nice {os.getpriority(os.PRIO_PROCESS, 0)} ({refused})"
    except OSError as exc:
        return f"normal priority ({refused}; nice {NICEST} not permitted: {exc})"


HIGH_STREAM, LOW_STREAM = -1, 0  # CUDA: lower is higher; every PyTorch takes these two


def stream_priority(background: bool) -> int:
    """The CUDA stream priority of a training process: low (the default streams') for a
    background task, high for every other (a foreground job may be lent later without a
    restart, so it takes the high one from its start)."""
    return LOW_STREAM if background else HIGH_STREAM


def device_stream(device: Any, background: bool) -> contextlib.AbstractContextManager[Any]:
    """Where a process's kernels go: on CUDA a stream of its priority (the GPU schedules
    the foreground's kernels first; a background one fills the gaps), else nowhere special.
    A background's queued work stays within one global step: each step ends with the loss
    exchange, which copies to the host and so waits for the device."""
    import torch  # noqa: PLC0415 - the priority above is set before torch loads

    if device.type != "cuda":
        return contextlib.nullcontext()
    stream = torch.cuda.Stream(device=device, priority=stream_priority(background))  # type: ignore[no-untyped-call]
    return torch.cuda.stream(stream)
