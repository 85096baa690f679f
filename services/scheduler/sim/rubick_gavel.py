"""Gavel's policies on Rubick's traces: a Gavel-style throughput table and workload built
from the same iteration times as Rubick's simulator (gearshift.common.rubick.perf), so the
baselines and Rubick differ by policy, not by numbers.

- One job type per (model, original plan, requested GPUs): "<application>/<plan code>/<GPUs>".
- Rigid (e.g. `max_min_fairness_perf`): the type's throughput at its requested GPUs is its
  original plan's iterations/s on them, placed on the fewest nodes, at its requested CPUs.
- Elastic (e.g. elastic `las`): per device count d below the request, the best plan that
  keeps the original TP, PP, ZeRO and GC with DP (and GA) scaled - Rubick-R's and Sia's
  way to resize - on d GPUs on the fewest nodes. Device counts no such plan runs on get a
  negligible rate (1e-9 it/s), so the elastic policies never pick them.
- Work: the trace's `steps` (iterations), arrival times as in the trace. Gavel's simulator
  has no nodes: a job's speed does not depend on where its devices are, and Gavel's rigid
  rounds charge no restart unless told to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gearshift.common.gavel import JobKey, ThroughputTable
from gearshift.common.rubick.perf import Mode, PerfSource
from gearshift.common.rubick.plans import consolidated
from gearshift.scheduler.plugins.allocators import make_allocator
from gearshift.scheduler.plugins.rubick.guarantees import Guarantees
from gearshift.scheduler.plugins.rubick.tenants import Quotas
from gearshift.scheduler.sim.rubick_sim import GPU_TYPE, RubickRun
from gearshift.scheduler.sim.rubick_trace import RubickJob
from gearshift.scheduler.sim.simulator import simulate_pipeline
from gearshift.scheduler.sim.trace import TraceJob
from gearshift.scheduler.types import Allocator

INFEASIBLE = 1e-9  # it/s at a device count no plan of the job runs on


def job_type(job: RubickJob) -> str:
    return f"{job.application}/{job.plan_code}/{job.gpus}"


def gavel_table(
    jobs: Sequence[RubickJob], perf: PerfSource, *, gpus_per_node: int = 8
) -> ThroughputTable:
    """Iterations/s per (job type, device count) on one A800 type (see the module docstring)."""
    rates: dict[JobKey, float] = {}
    for job in jobs:
        name = job_type(job)
        if JobKey(name, job.gpus) in rates:
            continue
        req = job.request()
        ms = perf.iter_ms(
            job.application, job.plan, consolidated(job.gpus, gpus_per_node), req.cpus_per_gpu
        )
        rates[JobKey(name, job.gpus)] = 1e3 / ms if ms else job.steps / max(job.duration, 1e-9)
        for d in range(1, job.gpus):
            best = perf.best(
                job.application,
                job.plan,
                job.gpus,
                consolidated(d, gpus_per_node),
                cpus_per_gpu=req.cpus_per_gpu,
                mode=Mode.DP,
            )
            rates[JobKey(name, d)] = best.rate if best is not None else INFEASIBLE
    return ThroughputTable({GPU_TYPE: rates}, {GPU_TYPE: {}})


def gavel_workload(jobs: Sequence[RubickJob]) -> list[TraceJob]:
    """The trace's jobs as Gavel jobs (type, iterations, GPUs, arrival, tenant)."""
    return [
        TraceJob(
            job_type=job_type(job),
            total_steps=job.steps,
            scale_factor=job.gpus,
            arrival_time=job.arrival_time,
            entity=job.tenant,
            guaranteed=job.guaranteed,
        )
        for job in jobs
    ]


def run_gavel(
    jobs: Sequence[RubickJob],
    perf: PerfSource,
    name: str,
    *,
    elastic: bool,
    nodes: int = 8,
    gpus_per_node: int = 8,
    rescale_seconds: float = 78.0,
    round_seconds: float = 360.0,
    quotas: Mapping[str, int] | None = None,
) -> RubickRun:
    """Gavel's policy `name` (rigid, or elastic over EST jobs) on a Rubick trace, as a
    RubickRun (no guarantee ratios: Gavel's policies give none). With `quotas` (GPUs per
    tenant), guaranteed jobs within them are admitted before the policy runs
    (gearshift.scheduler.plugins.rubick.guarantees), as the daemon does with --tenants-file."""
    alloc: Allocator = make_allocator(name, elastic=elastic, round_seconds=round_seconds)
    quotas = quotas if any(job.guaranteed for job in jobs) else None
    if quotas:
        limits = Quotas({tenant: {GPU_TYPE: gpus} for tenant, gpus in quotas.items()})
        alloc = Guarantees(alloc, lambda: limits)
    result = simulate_pipeline(
        gavel_workload(jobs),
        {GPU_TYPE: nodes * gpus_per_node},
        gavel_table(jobs, perf, gpus_per_node=gpus_per_node),
        alloc,
        round_seconds=round_seconds,
        rescale_seconds=rescale_seconds if alloc.replans_on_events else 0.0,
        elastic=elastic,
        name=(f"{name} (elastic)" if elastic else name) + (" +quotas" if quotas else ""),
    )
    return RubickRun(result, {str(i): job.guaranteed for i, job in enumerate(jobs)}, {})
