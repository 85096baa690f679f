"""Rubick's performance model in the Brain: workloads and profiled runs as plain data (what
the storage keeps), the fit over runs at one or several global batches, predictions,
sensitivity curves and minRes (the algorithms: gearshift.common.rubick), and profiled runs
derived from a job's own runtime samples.

What runtime samples can say (ReportSamples: steps/s, samples/s, accelerator type, device
count, ESTs per device): Gearshift's runtime trains data-parallel only, without TP, PP,
ZeRO or gradient checkpointing, and its N ESTs time-share the devices. A sample whose ESTs
are spread evenly (k on each of d devices, d*k = N) is therefore Rubick's DP plan d with
GA k: every device runs k mini-batches of the global batch / N before one all-reduce. Its
global batch is samples/s over steps/s, its iteration time 1 / steps/s (the median of a
configuration's samples). The samples do not say how the devices sit on nodes (the caller
gives GPUs per node) nor the CPU cores per device (1 is recorded: only ZeRO-Offload reads
it). Uneven spreads, samples without an EST mapping and other accelerator types are
skipped. They never show ZeRO-Offload, so k_opt_off, k_off and k_swap rest on profiled runs.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from gearshift.brain.records import RubickRunRow, Sample
from gearshift.common.rubick.model import (
    Config,
    Env,
    Fit,
    ForwardSample,
    Terms,
    Workload,
    concat_terms,
    fit_terms,
    terms,
)
from gearshift.common.rubick.plans import Plan, Resources, Zero, consolidated

SOURCE_PROFILE = "profile"
SOURCE_SAMPLES = "samples"


@dataclass(frozen=True)
class Run:
    """A profiled configuration: a plan on resources, its iteration time (ms) and its global
    batch (0: the workload's)."""

    plan: Plan
    resources: Resources
    iteration_ms: float
    global_batch: int = 0

    @property
    def config(self) -> Config:
        return Config(self.plan, self.resources)


def digest(data: dict[str, Any]) -> str:
    """SHA-256 of plain data, key order ignored."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    data = asdict(plan)
    data["zero"] = plan.zero.value
    return data


def plan_from_dict(data: dict[str, Any]) -> Plan:
    return Plan(**{**data, "zero": Zero(data["zero"])})


def config_to_dict(run: Run) -> dict[str, Any]:
    """A run's configuration (what names it), without its measurement."""
    return {
        "plan": plan_to_dict(run.plan),
        "placement": list(run.resources.placement),
        "cpus_per_gpu": run.resources.cpus_per_gpu,
        "global_batch": run.global_batch,
    }


def run_row(run: Run, source: str = SOURCE_PROFILE) -> RubickRunRow:
    config = config_to_dict(run)
    return RubickRunRow(digest(config), config, run.iteration_ms, source)


def run_from_row(row: RubickRunRow) -> Run:
    c = row.config
    resources = Resources(tuple(c["placement"]), int(c["cpus_per_gpu"]))
    return Run(plan_from_dict(c["plan"]), resources, row.iteration_ms, int(c["global_batch"]))


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    return {
        "name": workload.name,
        "params_m": workload.params_m,
        "global_batch": workload.global_batch,
        "seq_hid_layers": workload.seq_hid_layers,
        "layers": workload.layers,
        "forward": [[s.work, s.ms] for s in workload.forward],
    }


def workload_from_dict(data: dict[str, Any]) -> Workload:
    return Workload(
        name=str(data["name"]),
        params_m=float(data["params_m"]),
        global_batch=int(data["global_batch"]),
        seq_hid_layers=float(data["seq_hid_layers"]),
        layers=int(data["layers"]),
        forward=tuple(ForwardSample(float(w), float(ms)) for w, ms in data["forward"]),
    )


def env_to_dict(env: Env) -> dict[str, float]:
    return {f.name: float(getattr(env, f.name)) for f in fields(Env)}


def env_from_dict(data: dict[str, float]) -> Env:
    return Env(**{f.name: float(data[f.name]) for f in fields(Env) if f.name in data})


def run_terms(workload: Workload, runs: Sequence[Run], env: Env) -> Terms:
    """Eq. 1's parameter-free terms of each run, in order; a run at another global batch is
    priced with the workload at that batch (its forward time from the same profile)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        groups[run.global_batch or workload.global_batch].append(i)
    parts, order = [], []
    for batch, idx in groups.items():
        w = workload if batch == workload.global_batch else replace(workload, global_batch=batch)
        parts.append(terms(w, [runs[i].config for i in idx], env))
        order += idx
    tm = concat_terms(parts)
    back = np.argsort(np.array(order))
    return Terms(*(getattr(tm, f.name)[back] for f in fields(Terms)))


def fit_runs(workload: Workload, runs: Sequence[Run], env: Env) -> Fit:
    """Eq. 1's 7 parameters by RMSLE over the runs (gearshift.common.rubick.model.fit)."""
    return fit_terms(run_terms(workload, runs, env), [r.iteration_ms for r in runs])


def offload_runs(runs: Sequence[Run]) -> int:
    return sum(r.plan.zero is Zero.OFFLOAD for r in runs)


def runs_from_samples(
    samples: Sequence[Sample], *, num_ests: int, accelerator_type: str, gpus_per_node: int
) -> list[Run]:
    """Runs from a job's runtime samples (see the module docstring): one per (devices, ESTs
    per device, global batch), the median iteration time of its samples."""
    groups: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for s in samples:
        ests = s.ests_per_device
        if s.accelerator_type != accelerator_type or s.steps_per_second <= 0 or not ests:
            continue
        d, k = len(ests), ests[0]
        if s.device_count != d or any(e != k for e in ests) or d * k != num_ests:
            continue
        batch = round(s.samples_per_second / s.steps_per_second) if s.samples_per_second else 0
        if batch and batch % num_ests:
            continue  # not a whole mini-batch per EST: a sample of a partial step
        groups[(d, k, batch)].append(1e3 / s.steps_per_second)
    return [
        Run(
            Plan(dp=d, ga=k),
            Resources(consolidated(d, gpus_per_node), 1),
            statistics.median(times),
            batch,
        )
        for (d, k, batch), times in sorted(groups.items())
    ]
