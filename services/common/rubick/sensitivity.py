"""Rubick's resource-sensitivity curves, their slopes, and minRes (section 5.2).

A curve gives, per amount of one resource (GPUs of the type the model was fitted on, or CPU
cores per GPU) with the other fixed, the best predicted throughput over the feasible plans
(enumerate_plans, minus those that do not fit in GPU memory). As in Fig. 6 it "only
considers the maximum throughput achievable within the given range": an amount at which no
plan runs, or runs worse, keeps the best of the smaller amounts, so a curve never falls.
The slope at an amount is the throughput gained by the next unit.

minRes of a guaranteed job: the fewest resources, each dimension at most the request, with
which some plan matches the original plan on the requested resources. GPUs are the scarce
dimension, so we minimise them first, then CPU cores per GPU. GPUs are placed consolidated
(fewest nodes); the scheduler may place them otherwise.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gearshift.common.rubick.model import A800, Config, Env, Params, Workload, fits, throughput
from gearshift.common.rubick.plans import Plan, Resources, consolidated, enumerate_plans


@dataclass(frozen=True)
class Choice:
    """A plan on resources and its predicted throughput (samples/s)."""

    plan: Plan
    resources: Resources
    throughput: float


@dataclass(frozen=True)
class Point:
    """One amount on a curve: the best throughput up to it, and the choice that gives it."""

    amount: int
    throughput: float
    choice: Choice | None


def best_plan(
    workload: Workload,
    params: Params,
    resources: Resources,
    env: Env = A800,
    *,
    allow_3d: bool = True,
) -> Choice | None:
    """The fastest plan that fits in memory on exactly these resources (None: none fits)."""
    best: Choice | None = None
    for plan in enumerate_plans(
        workload.global_batch, workload.layers, resources, allow_3d=allow_3d
    ):
        if not fits(workload, plan, env):
            continue
        x = throughput(params, workload, Config(plan, resources), env)
        if best is None or x > best.throughput:
            best = Choice(plan, resources, x)
    return best


def _envelope(amounts: list[int], choices: list[Choice | None]) -> list[Point]:
    points: list[Point] = []
    best: Choice | None = None
    for amount, c in zip(amounts, choices, strict=True):
        if c is not None and (best is None or c.throughput > best.throughput):
            best = c
        points.append(Point(amount, best.throughput if best else 0.0, best))
    return points


def gpu_curve(
    workload: Workload,
    params: Params,
    max_gpus: int,
    *,
    cpus_per_gpu: int,
    gpus_per_node: int,
    env: Env = A800,
    allow_3d: bool = True,
) -> list[Point]:
    """Best throughput with 1..max_gpus GPUs (consolidated) at `cpus_per_gpu` cores each."""
    amounts = list(range(1, max_gpus + 1))
    choices = [
        best_plan(
            workload,
            params,
            Resources(consolidated(g, gpus_per_node), cpus_per_gpu),
            env,
            allow_3d=allow_3d,
        )
        for g in amounts
    ]
    return _envelope(amounts, choices)


def cpu_curve(
    workload: Workload,
    params: Params,
    placement: tuple[int, ...],
    max_cpus_per_gpu: int,
    *,
    env: Env = A800,
    allow_3d: bool = True,
) -> list[Point]:
    """Best throughput on `placement` with 1..max_cpus_per_gpu CPU cores per GPU."""
    amounts = list(range(1, max_cpus_per_gpu + 1))
    choices = [
        best_plan(workload, params, Resources(placement, c), env, allow_3d=allow_3d)
        for c in amounts
    ]
    return _envelope(amounts, choices)


def slopes(curve: list[Point]) -> list[float]:
    """Throughput gained per unit from each amount to the next (0 after the last)."""
    out = [
        (b.throughput - a.throughput) / (b.amount - a.amount) for a, b in itertools.pairwise(curve)
    ]
    return [*out, 0.0]


@dataclass(frozen=True)
class MinRes:
    """The least resources matching the original performance; `found` False: the original."""

    gpus: int
    cpus_per_gpu: int
    choice: Choice
    target: float
    found: bool


def min_res(
    workload: Workload,
    params: Params,
    original: Config,
    *,
    gpus_per_node: int,
    env: Env = A800,
    allow_3d: bool = True,
) -> MinRes:
    """minRes of a guaranteed job whose user asked for `original` (plan and resources).

    If the original plan does not fit in memory, or no smaller amount matches it, the
    original resources and plan stand (the paper's fallback)."""
    req = original.resources
    target = throughput(params, workload, original, env)
    fallback = MinRes(
        req.gpus, req.cpus_per_gpu, Choice(original.plan, req, target), target, found=False
    )
    if not fits(workload, original.plan, env):
        return fallback
    for g in range(1, req.gpus + 1):
        placement = req.placement if g == req.gpus else consolidated(g, gpus_per_node)
        top = best_plan(
            workload, params, Resources(placement, req.cpus_per_gpu), env, allow_3d=allow_3d
        )
        if top is None or top.throughput < target * (1 - 1e-9):
            continue
        for c in range(1, req.cpus_per_gpu + 1):
            ch = best_plan(workload, params, Resources(placement, c), env, allow_3d=allow_3d)
            if ch is not None and ch.throughput >= target * (1 - 1e-9):
                return MinRes(g, c, ch, target, found=True)
    return fallback
