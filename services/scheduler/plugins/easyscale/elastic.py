"""Elastic EST jobs (EasyScale sections 3.3-3.4): how many devices of which types each job gets.

A job has N ESTs (its logical data-parallel workers) and elastic bounds
[min_devices, max_devices]. Any device count within the bounds works, of one or
several accelerator types: the EST-to-device split comes from EasyScale's Eq. 1
planner (gearshift.common.estplan; the service asks the Brain's PlanEsts, which
runs the same function). A change is applied by the job checkpointing and
restarting on the new mapping (the service drives StopTask(checkpoint) then
StartTask(resume)); the simulator charges `rescale_seconds` for it.

Two inter-job policies share one interface (`ElasticPolicy.allocate`):

- `EasyScale` (the paper's greedy inter-job scheduler): every job first gets its
  minimum in arrival order (rigid jobs, min = max, get all N devices of one type
  or wait); then each job's intra-job scheduler proposes scale-outs - adding m
  devices of one type, m = 1.. (homogeneous increments), with the predicted
  speedup - and the inter-job scheduler keeps granting the proposal with the
  highest speedup per device (ties: more devices) until devices or proposals
  run out. `heterogeneous=False` restricts a job to one type (EasyScale_homo).
- `YarnCs` (the baseline, Apache YARN's capacity scheduler as in Philly): FIFO
  gang scheduling - a job waits until N devices of one type are free, takes the
  fastest such type, and keeps them until it completes; no job passes the head
  of the queue.

Throughput model. capability[t] is one EST's mini-batches per second on one
device of type t (Gavel's single-device throughput of the job type). Eq. 1 gives
N / f_overload mini-batches/s for a split; `efficiency(d)` scales it for the
communication of d devices (from Gavel's measured multi-GPU throughputs), so N
ESTs on N devices of one type run exactly as fast as Gavel's rigid job; a job's
`slowdown` divides it for the kernels its determinism level forces (EasyScale's
D2 costs ~2.36x on CNNs, ~1x on transformers).

Determinism decides where a job may run: D0/D1 hold bits only on one kind of
device, so such a job uses one type per placement and, once placed, only that
type (`types` is then the locked type alone); a D2 job (`mixing`) may span types
in one placement. `configurations` lists what a job may run on - the device
counts per type within its bounds that some use of its ESTs makes faster than
any smaller configuration - with their rates: the rows every heterogeneity-aware
objective allocates over (gearshift.scheduler.plugins.gavel.policies.configs).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gearshift.common.estplan import DeviceOffer, scale_out_proposals
from gearshift.scheduler.round.ests import Devices, ElasticJob, rate
from gearshift.scheduler.round.restart_cost import Reallocated, RestartCost, work_gain


@dataclass(frozen=True)
class Left:
    """What a running job's move would cost it: the steps it has left and its restart."""

    steps_remaining: float
    restart_seconds: float
    resize_seconds: float | None = None  # a grow that keeps its devices, in place (None: restart)


class ElasticPolicy(abc.ABC):
    """Devices per type for every job, given the capacity and the current assignment."""

    name: str = "elastic"

    @abc.abstractmethod
    def allocate(
        self,
        jobs: Sequence[ElasticJob],
        capacity: Mapping[str, int],
        current: Mapping[str, Mapping[str, int]],
        left: Mapping[str, Left] | None = None,
    ) -> dict[str, Devices]:
        """jobs are in arrival order; the result omits jobs that get nothing. `left`: the
        running jobs' remaining steps and restart seconds (restart-aware policies)."""


def _take(free: dict[str, int], devices: Mapping[str, int]) -> None:
    for t, n in devices.items():
        free[t] -= n


def _start(job: ElasticJob, free: Mapping[str, int], heterogeneous: bool) -> Devices | None:
    """The job's minimum: the fastest placement with min_devices devices (all N of one type
    for a rigid job), or None when it does not fit."""
    need = max(job.min_devices, 1)
    options: list[Devices] = [{t: need} for t in job.types() if free.get(t, 0) >= need]
    if heterogeneous and not job.rigid and not options:
        mixed: Devices = {}
        left = need
        for t in sorted(job.types(), key=lambda t: -job.capability[t]):
            take = min(left, free.get(t, 0))
            if take > 0:
                mixed[t] = take
                left -= take
        if left == 0:
            options.append(mixed)
    if not options:
        return None
    return max(options, key=lambda d: (rate(job, d), -len(d)))


@dataclass(frozen=True)
class Proposal:
    """Add `devices` of one type to a job; `gain` is the speedup per added device."""

    job_id: str
    worker_type: str
    devices: int
    speedup: float

    @property
    def gain(self) -> float:
        return (self.speedup - 1.0) / self.devices


def proposals(
    job: ElasticJob,
    held: Mapping[str, int],
    free: Mapping[str, int],
    *,
    heterogeneous: bool,
    top_k: int = 3,
) -> list[Proposal]:
    """The intra-job scheduler's scale-out proposals (EasyScale Role-2), by speedup."""
    count = sum(held.values())
    room = min(job.max_devices, job.num_ests) - count
    if job.rigid or room <= 0 or count == 0:
        return []
    heterogeneous = heterogeneous and job.mixing
    # Every type the job can use is offered (0 available where it may not grow), so the
    # planner knows the speed of the devices it already holds.
    offers = [
        DeviceOffer(
            t,
            min(free.get(t, 0), room) if heterogeneous or held.get(t, 0) > 0 else 0,
            job.capability[t],
        )
        for t in job.types()
    ]
    base = rate(job, held)
    out: list[Proposal] = []
    for candidate in scale_out_proposals(job.num_ests, held, offers, top_k=len(offers) * room):
        grown = dict(held)
        grown[candidate.accelerator_type] = (
            grown.get(candidate.accelerator_type, 0) + candidate.additional_devices
        )
        speedup = rate(job, grown) / base if base > 0 else 0.0
        if speedup > 1.0 + 1e-9:
            out.append(
                Proposal(
                    job.job_id, candidate.accelerator_type, candidate.additional_devices, speedup
                )
            )
    out.sort(key=lambda p: (-p.speedup, p.devices, p.worker_type))
    return out[:top_k]


class EasyScale(ElasticPolicy):
    """EasyScale's greedy inter-job scheduler; see the module docstring."""

    name = "easyscale"

    def __init__(
        self, *, heterogeneous: bool = True, top_k: int = 3, restart: RestartCost | None = None
    ) -> None:
        self.heterogeneous = heterogeneous
        self.top_k = top_k
        # None: the paper's allocator, re-planned from scratch at every event. Set: it starts
        # from the current placement (a running job's minimum is taken from its own devices
        # and it gets them back when they are left), and a running job on its devices takes
        # a scale-out only when the speedup over its capped remaining time pays the restart.
        self.restart = restart
        if not heterogeneous:
            self.name = "easyscale_homo"

    def allocate(
        self,
        jobs: Sequence[ElasticJob],
        capacity: Mapping[str, int],
        current: Mapping[str, Mapping[str, int]],
        left: Mapping[str, Left] | None = None,
    ) -> dict[str, Devices]:
        if self.restart is None:
            return self._plan(jobs, capacity, {}, left, give_back=False)
        kept = self._plan(jobs, capacity, current, left, give_back=True)
        greedy = self._plan(jobs, capacity, current, left, give_back=False)
        if greedy == kept or self._gain(jobs, current, left, kept, greedy) <= 0:
            return kept
        return greedy

    def _gain(
        self,
        jobs: Sequence[ElasticJob],
        current: Mapping[str, Mapping[str, int]],
        left: Mapping[str, Left] | None,
        kept: Mapping[str, Devices],
        greedy: Mapping[str, Devices],
    ) -> float:
        """Device-seconds of work the greedy's use of the running jobs' devices gains over
        handing them back (restart_cost.work_gain, each job over its own capped horizon):
        positive when the jobs it grows gain more than the shrunk ones lose, restarts
        included."""
        assert self.restart is not None
        total = 0.0
        for job in jobs:
            before, after = kept.get(job.job_id, {}), greedy.get(job.job_id, {})
            if before == after:
                continue
            held = dict(current.get(job.job_id) or {})
            facts = (left or {}).get(job.job_id, Left(math.inf, 0.0))
            now_rate = _rate(job, held) or max(_rate(job, before), _rate(job, after))
            change = Reallocated(
                unit=max(job.capability.values(), default=1.0),
                steps_remaining=facts.steps_remaining,
                restart_seconds=facts.restart_seconds,
                rate_without=_rate(job, before),
                restarts_without=bool(held) and bool(before) and before != held,
                rate_with=_rate(job, after),
                restarts_with=bool(held) and bool(after) and after != held,
            )
            total += work_gain([change], self.restart.horizon(facts.steps_remaining, now_rate))
        return total

    def _plan(
        self,
        jobs: Sequence[ElasticJob],
        capacity: Mapping[str, int],
        keep: Mapping[str, Mapping[str, int]],
        left: Mapping[str, Left] | None,
        *,
        give_back: bool,
    ) -> dict[str, Devices]:
        """One greedy plan: minimums in arrival order (a running job's from its own devices
        unless the move pays), with `give_back` the running jobs' other devices back
        when left, then the scale-outs by speedup per device."""
        free = dict(capacity)
        out: dict[str, Devices] = {}
        for job in jobs:  # arrival order: everyone's minimum first
            mixing = self.heterogeneous and job.mixing
            start = _start(job, free, mixing)
            held = keep.get(job.job_id)
            if held:  # from its own devices (a shrink), unless the move pays
                own = _start(job, {t: min(n, free.get(t, 0)) for t, n in held.items()}, mixing)
                if own is not None and (
                    start is None or not self._pays(job, own, rate(job, start), left)
                ):
                    start = own
            if start is not None:
                out[job.job_id] = start
                _take(free, start)
        for job_id, devices in out.items():  # running jobs back on all of theirs when left
            held = keep.get(job_id) if give_back else None
            if held and devices != held and all(held.get(t, 0) >= n for t, n in devices.items()):
                extra = {t: n - devices.get(t, 0) for t, n in held.items()}
                if all(free.get(t, 0) >= n for t, n in extra.items()):
                    _take(free, extra)
                    out[job_id] = dict(held)
        by_id = {job.job_id: job for job in jobs}
        while any(n > 0 for n in free.values()):
            pending: list[Proposal] = []
            for job_id, held in out.items():
                offered = proposals(
                    by_id[job_id],
                    held,
                    free,
                    heterogeneous=self.heterogeneous,
                    top_k=self.top_k,
                )
                if self.restart is not None and held == keep.get(job_id):
                    base = rate(by_id[job_id], held)
                    offered = [
                        p
                        for p in offered
                        if self._pays(by_id[job_id], held, base * p.speedup, left)
                    ]
                pending.extend(offered)
            if not pending:
                break
            best = max(pending, key=lambda p: (p.gain, p.devices, -_order(jobs, p.job_id)))
            held = out[best.job_id]
            held[best.worker_type] = held.get(best.worker_type, 0) + best.devices
            free[best.worker_type] -= best.devices
        return out

    def _pays(
        self,
        job: ElasticJob,
        held: Mapping[str, int],
        new_rate: float,
        left: Mapping[str, Left] | None,
    ) -> bool:
        """Whether a running job on `held` should restart to run at `new_rate`."""
        facts = (left or {}).get(job.job_id)
        if facts is None or self.restart is None:
            return True
        cost = facts.restart_seconds
        if held and facts.resize_seconds is not None:  # it grows where it runs: in place
            cost = facts.resize_seconds
        return self.restart.move_pays(rate(job, held), new_rate, facts.steps_remaining, cost)


def _rate(job: ElasticJob, devices: Mapping[str, int]) -> float:
    return rate(job, devices) if devices else 0.0


def _order(jobs: Sequence[ElasticJob], job_id: str) -> int:
    for i, job in enumerate(jobs):
        if job.job_id == job_id:
            return i
    return len(jobs)


class YarnCs(ElasticPolicy):
    """FIFO gang scheduling, non-preemptive; see the module docstring."""

    name = "yarn_cs"

    def allocate(
        self,
        jobs: Sequence[ElasticJob],
        capacity: Mapping[str, int],
        current: Mapping[str, Mapping[str, int]],
        left: Mapping[str, Left] | None = None,
    ) -> dict[str, Devices]:
        free = dict(capacity)
        out: dict[str, Devices] = {}
        for job in jobs:  # running jobs keep their devices
            held = current.get(job.job_id)
            if held and sum(held.values()) > 0:
                out[job.job_id] = dict(held)
                _take(free, held)
        for job in jobs:
            if job.job_id in out:
                continue
            need = max(job.max_devices, 1)
            fits = [t for t in job.types() if free.get(t, 0) >= need]
            if not fits:
                break  # FIFO: nobody passes the head of the queue
            kind = max(fits, key=lambda t: (job.capability[t] * job.scaling(need), t))
            out[job.job_id] = {kind: need}
            free[kind] -= need
        return out


def make_elastic_policy(name: str, restart: RestartCost | None = None) -> ElasticPolicy:
    """`easyscale` (heterogeneous), `easyscale_homo` or `yarn_cs`; ValueError otherwise.
    `restart`: EasyScale's allocators weigh moves with it (None: the paper's)."""
    if name in ("easyscale", "easyscale_heter"):
        return EasyScale(restart=restart)
    if name == "easyscale_homo":
        return EasyScale(heterogeneous=False, restart=restart)
    if name == "yarn_cs":
        return YarnCs()
    raise ValueError(f"unknown elastic policy {name!r}")


ELASTIC_POLICIES = ("easyscale", "easyscale_homo", "yarn_cs")
