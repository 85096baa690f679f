"""Iteration times of (model, plan, placement) for the scheduler: measured where the
placements tables cover the case, else Eq. 1; out-of-memory plans are infeasible.

One source for every policy the simulator compares (Rubick, its variants, and Gavel's
objectives fed from it), so their differences come from the policies, not the numbers.

- Measured: placements/<model>.csv, matched on the plan and the GPUs per node (node order
  does not matter). A measured plan is feasible on any placement of its size, whatever the
  memory estimate says (it ran).
  Its CPU count is the file's (4 per GPU under ZeRO-Offload, 1 otherwise); at another CPU
  count a ZeRO-Offload row is scaled by Eq. 1's ratio between the two (only ZeRO-Offload's
  optimizer step reads the CPUs).
- Predicted: Eq. 1 with per-model parameters. `load_perf(params="fit")` (the default) fits
  them by RMSLE on every measured run of the model (profile and placements; < 0.1 s a
  model); `params="history"` takes the artifact's history.csv. Those parameters belong to
  the artifact's form of Eq. 1 (`artifact_model`: additive k_off and k_swap), so our Eq. 1
  reads them with a 37-83% median error against the measured runs (the fit: 8-47%), and
  they are not the default.

Which plans a job may use (`Mode`): ANY (Rubick: every plan enumerate_plans gives, plus the
job's original plan shape), DP (Rubick-R, as Sia: the original TP, PP, ZeRO and GC kept,
DP and GA scaled with the GPUs), EXACT (the original plan on the original GPU count only).
The paper disables TP and PP for ViT, RoBERTa, BERT and T5 (section 7.3): so do we.

A model may also carry `Runtime` limits (a live Gearshift job, whose runtime executes only
some plans): then, whatever the mode, its plans are data parallel over its ESTs - d devices
with a = ESTs / d on each (GA in EST terms; d must divide the ESTs), GC only where the job
allows it, ZeRO-Offload (optimizer offload) only where it allows that - never TP, PP or
ZeRO-DP. A `Runtime` with `fixed_ms` stands for a job without a fitted model: only its
original plan on its requested devices, at that iteration time (rubick_n's semantics).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from gearshift.common.rubick.data import PLACEMENT_FILES, load_history, load_model
from gearshift.common.rubick.model import (
    A800,
    Config,
    Env,
    Params,
    Workload,
    fit,
    fits,
    iter_time_from_terms,
    terms,
)
from gearshift.common.rubick.plans import Plan, Resources, Zero, consolidated, enumerate_plans

# The traces' application names -> the data's model names.
ALIASES = {"llama7": "llama7b", "llama30": "llama30b"}
THREE_D = frozenset({"gpt2", "llama7b", "llama30b"})


class Mode(StrEnum):
    """Which plans a job may run (see the module docstring)."""

    ANY = "any"
    DP = "dp"
    EXACT = "exact"


def model_name(application: str) -> str:
    """The data's name for a trace's application ('llama7' -> 'llama7b')."""
    return ALIASES.get(application, application)


def _shape(placement: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted((n for n in placement if n > 0), reverse=True))


@dataclass(frozen=True)
class Runtime:
    """The plans a live job's runtime executes (see the module docstring)."""

    ests: int  # d * a == ests
    gc: bool = False  # may turn gradient checkpointing on
    offload: bool = False  # may offload optimizer states to the host (ZeRO-Offload)
    fixed_ms: float = 0.0  # > 0: no fit - the original plan only, at this iteration time
    min_devices: int = 1  # the job's bounds
    max_devices: int = 0  # 0: ests

    def __post_init__(self) -> None:
        if self.ests < 1 or self.fixed_ms < 0 or self.min_devices < 1 or self.max_devices < 0:
            raise ValueError(
                f"runtime limits need ests, min_devices >= 1, max_devices, fixed_ms >= 0: {self}"
            )

    def plans(self, original: Plan, gpus: int, devices: int) -> list[Plan]:
        """The plans on `devices` devices (`gpus`: the request, for `fixed_ms`)."""
        if self.fixed_ms > 0:
            return [original] if devices == gpus else []
        most = self.max_devices or self.ests
        if self.ests % devices or not self.min_devices <= devices <= most:
            return []
        zeros = (Zero.NONE, Zero.OFFLOAD) if self.offload else (Zero.NONE,)
        gcs = (False, True) if self.gc else (original.gc,)
        a = self.ests // devices
        return [Plan(dp=devices, ga=a, gc=gc, zero=z) for z in zeros for gc in gcs]


@dataclass(frozen=True)
class ModelPerf:
    """One model: its workload, Eq. 1's parameters and its measured iteration times (ms)
    keyed by (plan, GPUs per node in decreasing order), with the CPUs per GPU measured."""

    workload: Workload
    params: Params
    measured: Mapping[tuple[Plan, tuple[int, ...]], tuple[float, int]]
    runtime: Runtime | None = None  # a live job's limits (see the module docstring)
    env: Env | None = None  # its own cluster (a live job's); None: the source's

    @functools.cached_property
    def ran(self) -> frozenset[Plan]:
        """Plans measured on some placement: they fit, whatever the memory estimate says."""
        return frozenset(plan for plan, _ in self.measured)


@dataclass(frozen=True)
class Choice:
    """A plan and its iteration time (ms) on some placement."""

    plan: Plan
    iter_ms: float

    @property
    def rate(self) -> float:
        """Iterations per second (the global batch never changes with the plan)."""
        return 1e3 / self.iter_ms


class PerfSource:
    """Iteration times and best plans per (model, placement, CPUs), cached."""

    def __init__(self, models: Mapping[str, ModelPerf], env: Env = A800) -> None:
        self.models = dict(models)
        self.env = env
        self.best = functools.lru_cache(maxsize=None)(self._best)
        self.curve = functools.lru_cache(maxsize=None)(self._curve)

    def has(self, application: str) -> bool:
        return model_name(application) in self.models

    def _model(self, application: str) -> ModelPerf:
        name = model_name(application)
        if name not in self.models:
            raise KeyError(f"no performance data for model {application!r}")
        return self.models[name]

    def _predict(self, m: ModelPerf, plans: Sequence[Plan], res: Resources) -> list[float]:
        if not plans:
            return []
        cfgs = [Config(p, res) for p in plans]
        env = m.env or self.env
        return [float(x) for x in iter_time_from_terms(m.params, terms(m.workload, cfgs, env))]

    def iter_ms(
        self, application: str, plan: Plan, placement: Sequence[int], cpus_per_gpu: int
    ) -> float | None:
        """One iteration's ms, or None when the plan cannot run there (OOM, wrong size)."""
        shape = _shape(placement)
        if plan.gpus != sum(shape):
            return None
        return self._times(application, (plan,), shape, cpus_per_gpu)[0]

    def _times(
        self, application: str, plans: Sequence[Plan], shape: tuple[int, ...], cpus: int
    ) -> list[float | None]:
        m = self._model(application)
        if m.runtime is not None and m.runtime.fixed_ms > 0:
            return [m.runtime.fixed_ms] * len(plans)  # no fit: the request's speed
        res = Resources(shape, max(1, cpus))
        out: list[float | None] = [None] * len(plans)
        todo = []
        for i, plan in enumerate(plans):
            hit = m.measured.get((plan, shape))
            if hit is not None:
                ms, at = hit
                if plan.zero is Zero.OFFLOAD and at != res.cpus_per_gpu:
                    now = self._predict(m, [plan], res)[0]
                    then = self._predict(m, [plan], Resources(shape, at))[0]
                    ms *= now / then
                out[i] = ms
            elif plan in m.ran or fits(m.workload, plan, m.env or self.env):
                todo.append(i)
        for i, ms in zip(todo, self._predict(m, [plans[i] for i in todo], res), strict=True):
            out[i] = ms
        return out

    def candidates(
        self, application: str, original: Plan, gpus: int, shape: tuple[int, ...], mode: Mode
    ) -> list[Plan]:
        """The plans a job of `mode` may run on `shape` (its original plan shape included)."""
        g = sum(shape)
        if mode is Mode.EXACT:
            return [original] if g == gpus else []
        m = self._model(application)
        if m.runtime is not None:
            live = m.runtime.plans(original, gpus, g)
            if mode is Mode.DP:
                live = [p for p in live if (p.gc, p.zero) == (original.gc, original.zero)]
            return live
        name = model_name(application)
        plans = set(
            enumerate_plans(
                m.workload.global_batch,
                m.workload.layers,
                Resources(shape),
                allow_3d=name in THREE_D,
            )
        )
        side = original.tp * original.pp
        if g % side == 0:  # the original shape with DP scaled (PP micro-batches kept)
            plans.add(
                Plan(
                    dp=g // side,
                    tp=original.tp,
                    pp=original.pp,
                    ga=original.ga,
                    gc=original.gc,
                    zero=original.zero,
                    micro_batches=original.micro_batches,
                )
            )
        if mode is Mode.DP:
            plans = {
                p
                for p in plans
                if (p.tp, p.pp, p.zero, p.gc)
                == (original.tp, original.pp, original.zero, original.gc)
            }
        return sorted(plans, key=lambda p: p.label)

    def _best(
        self,
        application: str,
        original: Plan,
        gpus: int,
        shape: tuple[int, ...],
        *,
        cpus_per_gpu: int,
        mode: Mode,
    ) -> Choice | None:
        plans = self.candidates(application, original, gpus, shape, mode)
        best: Choice | None = None
        for plan, ms in zip(
            plans, self._times(application, plans, shape, cpus_per_gpu), strict=True
        ):
            if ms is not None and ms > 0 and (best is None or ms < best.iter_ms):
                best = Choice(plan, ms)
        return best

    def _curve(
        self,
        application: str,
        original: Plan,
        gpus: int,
        *,
        cpus_per_gpu: int,
        mode: Mode,
        max_gpus: int,
        gpus_per_node: int,
    ) -> tuple[float, ...]:
        """Best iterations/s on 0..max_gpus GPUs placed consolidated (0: none runs)."""
        out = [0.0]
        for g in range(1, max_gpus + 1):
            shape = consolidated(g, gpus_per_node)
            c = self.best(application, original, gpus, shape, cpus_per_gpu=cpus_per_gpu, mode=mode)
            out.append(c.rate if c else 0.0)
        return tuple(out)


def fitted_params(root: Path, model: str) -> Params:
    """Eq. 1's parameters fitted by RMSLE on every measured run of `model`."""
    data = load_model(root, model)
    runs = [*data.profiled, *data.placements]
    return fit(data.workload, [r.config for r in runs], [r.iter_ms for r in runs], starts=4).params


@functools.lru_cache(maxsize=4)
def load_perf(root: Path, params: str = "fit") -> PerfSource:
    """The source over every model with a profile and a placements file (see the module
    docstring for `params`: 'fit' or 'history')."""
    if params not in ("fit", "history"):
        raise ValueError(f"params must be 'fit' or 'history', got {params!r}")
    history = load_history(root) if params == "history" else {}
    models: dict[str, ModelPerf] = {}
    for name in PLACEMENT_FILES:
        data = load_model(root, name)
        measured: dict[tuple[Plan, tuple[int, ...]], tuple[float, int]] = {}
        for run in data.placements:
            key = (run.config.plan, _shape(run.config.resources.placement))
            measured[key] = (run.iter_ms, run.config.resources.cpus_per_gpu)
        p = history[name] if params == "history" else fitted_params(root, name)
        models[name] = ModelPerf(data.workload, p, measured)
    return PerfSource(models)
