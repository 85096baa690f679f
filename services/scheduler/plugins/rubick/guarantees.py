"""Guaranteed jobs within their tenant's quota, around any allocate plugin (Rubick
section 5's service classes for every policy).

Each round, before the policy runs, guaranteed jobs are admitted against their tenant's
quota: those already running first (a job admitted once keeps its share while it runs),
then by arrival. A job is admitted on one accelerator type it may use, for the devices it
asks for (its `max_devices`, with its own plan: its requested performance), when both its
tenant's quota and the devices not yet reserved cover that. Admitted jobs get exactly
those devices; the policy shares what is left among every other job - best-effort ones,
and guaranteed ones their quota does not cover, which are served as best-effort. So a
best-effort job is shrunk or preempted (through the normal checkpoint/restart path) when
a guaranteed job needs its devices.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gearshift.scheduler.plugins.rubick.rubick_policy import RubickAdmission
from gearshift.scheduler.plugins.rubick.tenants import Quotas
from gearshift.scheduler.round.ests import elastic_job, split_ests
from gearshift.scheduler.round.why import TENANT_GUARANTEE
from gearshift.scheduler.types import Allocator, JobSnapshot, Reason, Snapshot, Target

log = logging.getLogger("gearshift.scheduler")


@dataclass(frozen=True)
class Admission:
    """A guaranteed job's reserved devices: `devices` of `accelerator_type` (and, under a
    rubick policy, what Algorithm 1 admitted it with)."""

    accelerator_type: str
    devices: int
    rubick: RubickAdmission | None = None  # under a rubick policy: plan, speed, victims


def admit(snapshot: Snapshot, quotas: Quotas) -> dict[str, Admission]:
    """The guaranteed jobs the quotas cover this round, and what each gets."""
    free = dict(snapshot.capacity)
    used: dict[str, dict[str, int]] = {}
    out: dict[str, Admission] = {}
    jobs = [j for j in snapshot.jobs if j.guaranteed and quotas.of(j.entity)]
    jobs.sort(key=lambda j: (not j.current, j.arrival_time, j.job_id))
    for job in jobs:
        quota, tenant_used = quotas.of(job.entity), used.setdefault(job.entity, {})
        held = dict(job.current)
        # its current type first (no move), then the type with most quota left
        for kind in sorted(
            job.types, key=lambda t: (-held.get(t, 0), -(quota.get(t, 0) - tenant_used.get(t, 0)))
        ):
            need = job.max_devices
            if tenant_used.get(kind, 0) + need <= quota.get(kind, 0) and free.get(kind, 0) >= need:
                out[job.job_id] = Admission(kind, need)
                tenant_used[kind] = tenant_used.get(kind, 0) + need
                free[kind] -= need
                break
    return out


def _without(snapshot: Snapshot, admitted: dict[str, Admission]) -> Snapshot:
    """The snapshot the policy sees: the admitted jobs and their devices taken out."""
    take: dict[str, int] = {}
    for a in admitted.values():
        take[a.accelerator_type] = take.get(a.accelerator_type, 0) + a.devices
    devices = []
    for device in reversed(snapshot.devices):  # which ones does not matter: place decides
        if take.get(device.worker_type, 0) > 0:
            take[device.worker_type] -= 1
            continue
        devices.append(device)
    devices.reverse()
    return dataclasses.replace(
        snapshot,
        devices=tuple(devices),
        jobs=tuple(j for j in snapshot.jobs if j.job_id not in admitted),
        ran=tuple(r for r in snapshot.ran if r.job_id not in admitted),
    )


def guarantee_reasons(
    snapshot: Snapshot,
    targets: Mapping[str, Target],
    admitted: Mapping[str, Admission],
    quotas: Quotas,
) -> dict[str, Reason]:
    """The jobs left without devices because guaranteed jobs hold them: for each, the tenant
    whose admitted jobs reserve the most devices of the types it accepts, with that tenant's
    use against its quota."""
    if not admitted:
        return {}
    tenant_of = {j.job_id: j.entity for j in snapshot.jobs}
    reserved: dict[str, Counter[str]] = {}  # tenant -> devices its admitted jobs hold, by type
    for job_id, a in admitted.items():
        reserved.setdefault(tenant_of.get(job_id, ""), Counter())[a.accelerator_type] += a.devices
    free = Counter(snapshot.capacity)
    for target in targets.values():
        for kind, count in target.devices:
            free[kind] -= count
    out: dict[str, Reason] = {}
    for job in snapshot.jobs:
        if job.job_id in targets:
            continue
        room = (
            sum(free[k] for k in job.types)
            if job.mixing
            else max((free[k] for k in job.types), default=0)
        )
        if room >= job.min_devices:
            continue
        held = {t: sum(c[k] for k in job.types) for t, c in reserved.items()}
        tenant = max(sorted(held), key=lambda t: held[t])
        if held[tenant] <= 0:
            continue
        quota = quotas.of(tenant)
        use = ", ".join(
            f"{k}: {n} of {quota.get(k, 0)}" for k, n in sorted(reserved[tenant].items())
        )
        out[job.job_id] = Reason(
            TENANT_GUARANTEE,
            f"waiting behind tenant {tenant}'s guarantee ({use} devices of its quota in use)",
            {"tenant": tenant, "usage": use},
            tenant,
        )
    return out


def _target(job: JobSnapshot, admission: Admission) -> Target:
    config = ((admission.accelerator_type, admission.devices),)
    return Target(job.job_id, config, split_ests(elastic_job(job), config))


@dataclass
class Guarantees:
    """The allocate stage with guaranteed jobs admitted first; `quotas` is read every round
    (a reloaded tenants file takes effect at the next round). `admitted` is the last
    round's admission, for display."""

    inner: Allocator
    quotas: Callable[[], Quotas]
    admitted: dict[str, Admission] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def replans_on_events(self) -> bool:
        return self.inner.replans_on_events

    def priorities(self) -> Mapping[str, float]:
        """The inner allocator's priorities, if it ranks (round/hooks.Ranks)."""
        ranks = getattr(self.inner, "priorities", None)
        return ranks() if callable(ranks) else {}

    def reasons(self, snapshot: Snapshot, targets: Mapping[str, Target]) -> dict[str, Reason]:
        """The jobs that wait behind a tenant's guarantee (round/hooks.Explains)."""
        return guarantee_reasons(snapshot, targets, self.admitted, self.quotas())

    # KeepsDecisionState (round/hooks.py): the quotas go to a decision process, the
    # admissions come back (the tenants view and the reasons read them here).
    def shipment(self) -> Quotas:
        return self.quotas()

    def take(self, shipment: object) -> None:
        assert isinstance(shipment, Quotas)
        self.quotas = lambda: shipment

    def outcome(self) -> dict[str, Admission]:
        return dict(self.admitted)

    def told(self, outcome: object) -> None:
        assert isinstance(outcome, dict)
        self.admitted = outcome

    def allocate(self, snapshot: Snapshot) -> dict[str, Target]:
        admitted = admit(snapshot, self.quotas())
        for job_id in admitted.keys() - self.admitted.keys():
            a = admitted[job_id]
            log.info(
                "guaranteed job admitted within its tenant's quota",
                extra={"job_id": job_id, "devices": f"{a.accelerator_type}x{a.devices}"},
            )
        self.admitted = admitted
        if not admitted:
            return self.inner.allocate(snapshot)
        out = self.inner.allocate(_without(snapshot, admitted))
        for job_id, admission in admitted.items():
            out[job_id] = _target(snapshot.job(job_id), admission)
        return out
