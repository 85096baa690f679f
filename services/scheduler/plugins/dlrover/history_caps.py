"""When a history plan's device cap gives way: a plain function over plain data.

A best-effort job's initial plan from history (DLRover; resource_plans.py) starts it
on the devices similar finished jobs ended on. That is a guess about a model, not a
limit the user set, and a wrong guess is dear: a job started on 1 device because an
unrelated job once ran on 1 would keep 3 devices idle for its whole life if the cap
held until its first ADJUST (which a short job never reaches, and `--plan-interval 0`
never asks). So the cap holds for the job's start, and the first round that finds the
job running, devices it could use idle and no job waiting for them lifts it for good: the
allocator then decides the job's devices, up to its spec's max_devices, as it does
for every job after its first ADJUST. While a waiting job could use an idle device the
cap stands: the devices the guess leaves free are the waiting jobs' first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gearshift.scheduler.round.hooks import CapView


def idle_usable(idle: Mapping[str, int], types: frozenset[str]) -> int:
    """The idle devices of the types a job may use (every type when it names none)."""
    return sum(n for kind, n in idle.items() if not types or kind in types)


def caps_to_lift(jobs: Sequence[CapView], idle: Mapping[str, int]) -> list[str]:
    """The jobs whose history cap is lifted now (`idle`: free devices by type; `jobs`: the
    capped ones and those waiting, at least): the running, capped jobs that could grow
    onto idle devices, when no waiting job could use any idle device."""
    if any(j.held == 0 and idle_usable(idle, j.types) > 0 for j in jobs):
        return []
    return [
        j.job_id
        for j in jobs
        if j.cap > 0 and 0 < j.held < j.most and idle_usable(idle, j.types) > 0
    ]
