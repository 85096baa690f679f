"""Low CPU priority for a background task's training process (DeepPool's multiplexing).

SCHED_IDLE runs the process only when a CPU has nothing else to do, so a
foreground job on the same CPU slots keeps its speed; where the policy is not
permitted (a seccomp profile, an old kernel) nice 19 is the next best. Linux
applies both to the calling thread and to the threads it creates later, so this
runs first thing in the process (a zygote's fork included), before torch, gloo or
a reporter starts a thread. Foreground and shared tasks never call it.
"""

from __future__ import annotations

import os

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
