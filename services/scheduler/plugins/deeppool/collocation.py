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
    """Pairs each waiting background job with the foreground that idles most (one each); a
    background job already beside a lender that still lends keeps it.

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
        guests = [
            g
            for g in snapshot.jobs
            if g.background and g.job_id not in targets  # arrival order
        ]
        # A guest beside a lender that still lends stays there: another lender runs it no
        # faster (it takes what the foreground leaves), so a move would only cost a restart.
        for guest in guests:
            lender = next((t for t in lenders if t.job_id in guest.partners), None)
            if lender is not None and guest.current:
                kind = guest.current[0][0]
                if any(k == kind for k, _ in lender.devices):
                    self._pair(out, lenders, lender, guest, kind)
        for guest in guests:
            if guest.job_id in out:
                continue
            for lender in lenders:
                kinds = [k for k, _ in lender.devices if k in guest.types]
                if kinds:
                    self._pair(out, lenders, lender, guest, kinds[0])
                    break
        return out

    @staticmethod
    def _pair(
        out: dict[str, Target], lenders: list[Target], lender: Target, guest: JobSnapshot, kind: str
    ) -> None:
        lenders.remove(lender)
        out[lender.job_id] = dataclasses.replace(
            lender, partners=(guest.job_id,), role="foreground"
        )
        out[guest.job_id] = Target(
            guest.job_id,
            ((kind, 1),),
            {kind: (guest.num_ests,)},
            (lender.job_id,),
            "background",
        )
