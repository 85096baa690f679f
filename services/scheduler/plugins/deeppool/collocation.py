"""The collocate stage's plugin: DeepPool's multiplexing of a foreground job's devices.

A job whose burst-parallel plan leaves its devices idle for part of each
iteration (`JobSnapshot.idle_fraction`: one minus the plan's device-seconds over
its peak devices times its iteration time, from the Brain's PlanBurstParallel
over the job's layer profile) lends one of its devices to a background job: a
best-effort, one-device job the allocator left without devices. The worker runs
the background job at the lowest priority and pauses it at a global-step
boundary whenever the foreground's step time rises above the bound
(gearshift.worker.collocation), so the foreground keeps its speed; a foreground
measured slower than the bound with a background beside it lends no more.

Plain functions of the snapshot and the allocator's targets: the daemon and the
simulator share them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from gearshift.scheduler.types import JobSnapshot, Snapshot, Target

DEFAULT_MIN_IDLE = 0.1
DEFAULT_MAX_SLOWDOWN = 0.2


@dataclass(frozen=True)
class Multiplexing:
    """Pairs each waiting background job with the foreground that idles most (one each).

    `min_idle`: the least idle share for a job to lend a device; `max_slowdown`: a job
    measured slower than this with a background beside it lends no more.
    """

    min_idle: float = DEFAULT_MIN_IDLE
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN

    def lends(self, job: JobSnapshot) -> bool:
        return job.idle_fraction >= self.min_idle and job.collocated_slowdown <= self.max_slowdown

    def collocate(self, snapshot: Snapshot, targets: Mapping[str, Target]) -> dict[str, Target]:
        out = dict(targets)
        jobs = {job.job_id: job for job in snapshot.jobs}
        lenders = sorted(
            (
                t
                for t in targets.values()
                if not t.partners and t.job_id in jobs and self.lends(jobs[t.job_id])
            ),
            key=lambda t: (-jobs[t.job_id].idle_fraction, t.job_id),
        )
        for guest in snapshot.jobs:  # arrival order
            if not guest.background or guest.job_id in targets or not lenders:
                continue
            for lender in lenders:
                kinds = [k for k, _ in lender.devices if k in guest.types]
                if not kinds:
                    continue
                lenders.remove(lender)
                out[lender.job_id] = dataclasses.replace(
                    lender, partners=(guest.job_id,), role="foreground"
                )
                out[guest.job_id] = Target(
                    guest.job_id,
                    ((kinds[0], 1),),
                    {kinds[0]: (guest.num_ests,)},
                    (lender.job_id,),
                    "background",
                )
                break
        return out
