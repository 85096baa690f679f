"""Rubick's traces (the paper's workload-{base,bp,mt}.csv) and generated workloads like them.

CSV columns: name, submission_time (s), duration (s), application, num_gpus, num_cpus,
bandwidth, exec_plan, steps, is_sla (1 = guaranteed), and optionally tenant. A job's length
is `steps` iterations (the trace derived them from its duration at the measured iteration
time of its plan, at least 1). Without a tenant column, guaranteed jobs belong to tenant
"A" and the others to "B" - the paper's multi-tenant setup (Tenant-A: a 64-GPU quota, all
guaranteed; Tenant-B: no quota, best-effort).

Generated workloads (`generate_rubick_workload`): Poisson arrivals; the (GPUs, plan) mixes
per model of workload-base.csv (models uniform, as the paper draws them from Table 2);
durations from Gandiva's distribution (as the Gavel generator); steps = duration over the
plan's iteration time from the perf source; tenants drawn uniformly, a job guaranteed when
its tenant has a quota.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.common.rubick.data import plan_from_code
from gearshift.common.rubick.perf import PerfSource
from gearshift.common.rubick.plans import Plan, consolidated
from gearshift.common.rubick.request import Request
from gearshift.scheduler.sim.trace import csv_rows, gandiva_duration

COLUMNS = (
    "name",
    "submission_time",
    "duration",
    "application",
    "num_gpus",
    "num_cpus",
    "bandwidth",
    "exec_plan",
    "steps",
    "is_sla",
)
# workload-base.csv's (GPUs, plan code) choices per model.
MIXES: dict[str, tuple[tuple[int, str], ...]] = {
    "vit": ((1, "ga"), (2, "zero-dp"), (4, "zero-dp"), (8, "zero-dp")),
    "roberta": ((1, "ga"), (2, "ga"), (2, "zero-dp"), (4, "zero-dp"), (8, "zero-dp")),
    "bert": ((1, "ga"), (2, "ga"), (2, "zero-dp"), (4, "zero-dp"), (8, "zero-dp")),
    "t5": ((1, "ga"), (2, "zero-dp"), (4, "ga"), (4, "zero-dp"), (8, "zero-dp")),
    "gpt2": ((2, "ga"), (4, "ga"), (5, "151"), (8, "zero-dp")),
    "llama7": ((8, "zero-offload"), (16, "182"), (32, "244")),
    "llama30": ((24, "641"), (40, "524"), (48, "344")),
}
CPUS_PER_GPU = 8  # what the paper's traces request


@dataclass(frozen=True)
class RubickJob:
    """One trace job."""

    name: str
    arrival_time: float
    duration: float
    application: str
    gpus: int
    cpus: int
    plan_code: str
    plan: Plan
    steps: int
    guaranteed: bool
    tenant: str
    bandwidth: float = 0.0

    def request(self) -> Request:
        return Request(
            self.application, self.plan, self.gpus, max(1, self.cpus // self.gpus), self.guaranteed
        )

    def row(self) -> dict[str, str]:
        return {
            "name": self.name,
            "submission_time": f"{self.arrival_time:g}",
            "duration": f"{self.duration:g}",
            "application": self.application,
            "num_gpus": str(self.gpus),
            "num_cpus": str(self.cpus),
            "bandwidth": f"{self.bandwidth:g}",
            "exec_plan": self.plan_code,
            "steps": str(self.steps),
            "is_sla": "1" if self.guaranteed else "0",
            "tenant": self.tenant,
        }


def _number(where: str, column: str, text: str, kind: type[float] | type[int]) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise ValidationError(f"{where} column {column}", f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValidationError(f"{where} column {column}", f"must be >= 0 (got {text})")
    return value


def read_rubick_trace(path: str | Path, perf: PerfSource | None = None) -> list[RubickJob]:
    """Read a Rubick trace; ValidationError names the file, line and column of a bad value.
    With `perf`, applications it has no data for are refused too."""
    source = Path(path)
    reader = csv_rows(source, COLUMNS, "trace")
    jobs: list[RubickJob] = []
    for row in reader:
        where = f"{source}:{reader.line_num}"
        if None in row or any(row[c] is None for c in COLUMNS):
            raise ValidationError(where, f"expected {len(reader.fieldnames or [])} columns")
        gpus = int(_number(where, "num_gpus", row["num_gpus"], int))
        if gpus < 1:
            raise ValidationError(f"{where} column num_gpus", "must be >= 1")
        app = row["application"].strip()
        if perf is not None and not perf.has(app):
            raise ValidationError(f"{where} column application", f"unknown model {app!r}")
        try:
            plan = plan_from_code(row["exec_plan"].strip(), gpus)
        except ValueError as exc:
            raise ValidationError(f"{where} column exec_plan", str(exc)) from None
        sla = row["is_sla"].strip()
        if sla not in ("0", "1"):
            raise ValidationError(f"{where} column is_sla", f"must be 0 or 1 (got {sla!r})")
        steps = int(_number(where, "steps", row["steps"], int))
        if steps < 1:
            raise ValidationError(f"{where} column steps", "must be >= 1")
        tenant = (row.get("tenant") or "").strip() or ("A" if sla == "1" else "B")
        jobs.append(
            RubickJob(
                name=row["name"],
                arrival_time=_number(where, "submission_time", row["submission_time"], float),
                duration=_number(where, "duration", row["duration"], float),
                application=app,
                gpus=gpus,
                cpus=max(gpus, int(_number(where, "num_cpus", row["num_cpus"], int))),
                plan_code=row["exec_plan"].strip(),
                plan=plan,
                steps=steps,
                guaranteed=sla == "1",
                tenant=tenant,
                bandwidth=_number(where, "bandwidth", row["bandwidth"], float),
            )
        )
    if not jobs:
        raise ValidationError(str(source), "the trace has no jobs")
    for before, after in itertools.pairwise(jobs):
        if after.arrival_time < before.arrival_time:
            raise ValidationError(str(source), f"{after.name}: submission times must not decrease")
    return jobs


def write_rubick_trace(jobs: Sequence[RubickJob], path: str | Path) -> None:
    with Path(path).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*COLUMNS, "tenant"])
        writer.writeheader()
        writer.writerows(job.row() for job in jobs)


def parse_tenants(text: str, field: str = "--tenants") -> dict[str, int]:
    """ "A=64,B=0" -> {"A": 64, "B": 0}: each tenant's GPU quota."""
    out: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, quota = item.partition("=")
        if not sep or not name.strip() or not quota.strip().isdigit():
            raise ValidationError(field, f"{item!r} is not TENANT=GPU_QUOTA")
        out[name.strip()] = int(quota)
    if not out:
        raise ValidationError(field, "names no tenant")
    return out


def generate_rubick_workload(
    perf: PerfSource,
    num_jobs: int,
    jobs_per_hour: float,
    *,
    tenants: Mapping[str, int],
    seed: int = 0,
    gpus_per_node: int = 8,
) -> list[RubickJob]:
    """A seeded workload of the traces' kind (see the module docstring)."""
    if num_jobs < 1:
        raise ValidationError("--generate", "must be >= 1")
    if jobs_per_hour <= 0:
        raise ValidationError("--jobs-per-hour", "must be > 0")
    rng = random.Random(seed)
    names = sorted(tenants)
    now = 0.0
    jobs = []
    for i in range(num_jobs):
        app = rng.choice(sorted(MIXES))
        gpus, code = rng.choice(MIXES[app])
        plan = plan_from_code(code, gpus)
        ms = perf.iter_ms(app, plan, consolidated(gpus, gpus_per_node), CPUS_PER_GPU)
        duration = gandiva_duration(rng)
        tenant = rng.choice(names)
        jobs.append(
            RubickJob(
                name=f"{app}-{i}",
                arrival_time=round(now, 3),
                duration=round(duration, 3),
                application=app,
                gpus=gpus,
                cpus=gpus * CPUS_PER_GPU,
                plan_code=code,
                plan=plan,
                steps=max(1, math.ceil(duration * 1e3 / ms)) if ms else 1,
                guaranteed=tenants[tenant] > 0,
                tenant=tenant,
            )
        )
        now += -math.log(1.0 - rng.random()) * 3600.0 / jobs_per_hour
    return jobs
