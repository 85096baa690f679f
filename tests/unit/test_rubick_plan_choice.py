"""Rubick's plan choice beside another objective (profile.executionPlans: rubick), as plain
functions over the Rubick artifact's models (../shared/data/rubick: the profiled workloads
and the paper's fitted Eq. 1 parameters, history.csv) and as the stage the round calls."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gearshift.common.rubick.data import load_history, load_model
from gearshift.common.rubick.model import A800
from gearshift.common.rubick.plans import Plan, Zero
from gearshift.scheduler.plugins.rubick.fits import FitBook, Fitted, JobFacts, model_perf
from gearshift.scheduler.plugins.rubick.plan_choice import (
    RubickPlans,
    fastest_plan,
    plan_for,
    plan_note,
    shape_of,
)
from gearshift.scheduler.state.records import WorkerRecord
from gearshift.scheduler.types import Device, Target
from gearshift.v1 import common_pb2

C = common_pb2


def fitted(root: Path, model: str) -> Fitted:
    """The artifact's workload of `model` with the paper's fitted parameters, on A800s."""
    data = load_model(root, model)
    return Fitted(f"model {model}", data.workload, load_history(root)[model], A800, 20, True)


def facts(
    ests: int, *, gc: bool = False, offload: bool = False, plan: C.ExecutionPlan | None = None
) -> JobFacts:
    return JobFacts("j", "", ests, 1, ests, gc, offload, plan or C.ExecutionPlan())


def on(devices: int, ests: int, kind: str = "a800", workers: int = 1) -> list[tuple[Device, int]]:
    """`devices` devices spread over `workers` workers, `ests` ESTs on each."""
    return [(Device(f"w{i % workers}", i, kind), ests) for i in range(devices)]


def test_a_job_allowing_gc_on_a_memory_tight_device_gets_gc(rubick_data: Path) -> None:
    """ViT (82 M parameters, 512 samples a step): on 4 devices with one EST each its
    activations need 21.8 GB a device without GC, 4.2 GB with it."""
    vit, job = fitted(rubick_data, "vit"), facts(4, gc=True)
    tight = model_perf(job, vit, 16.0, gpus=True)  # 16 GB devices (V100-16GB)
    roomy = model_perf(job, vit, 80.0, gpus=True)  # A800s
    assert plan_for(tight, job, on(4, 1), kept=False, min_gain=0.05) == Plan(dp=4, gc=True)
    # Roomy devices: GC only recomputes; the model prefers it off (the job's own plan).
    choice = fastest_plan(roomy, job, (4,), 1, gpus=True)
    assert choice is not None and choice.plan == Plan(dp=4)
    assert plan_for(roomy, job, on(4, 1), kept=False, min_gain=0.05) is None
    # 16 ESTs on the same 4 tight devices: 4 GA steps each, 6.4 GB without GC - it fits.
    job16 = facts(16, gc=True)
    tight16 = model_perf(job16, vit, 16.0, gpus=True)
    assert plan_for(tight16, job16, on(4, 4), kept=False, min_gain=0.05) is None


def test_a_job_allowing_nothing_keeps_its_plan(rubick_data: Path) -> None:
    vit, job = fitted(rubick_data, "vit"), facts(4)
    tight = model_perf(job, vit, 16.0, gpus=True)
    assert plan_for(tight, job, on(4, 1), kept=False, min_gain=0.05) is None
    # Offload is a GPU plan: a job allowing only offload, on CPU slots, keeps its plan too.
    cpu_job = facts(4, offload=True)
    cpu = model_perf(cpu_job, vit, 16.0, gpus=False)
    assert plan_for(cpu, cpu_job, on(4, 1, "cpu"), kept=False, min_gain=0.05) is None


def test_the_fastest_plan_that_fits_is_chosen(rubick_data: Path) -> None:
    """LLaMA-7B on 4 A800s (80 GB): plain DP needs 139 GB a device, GC 106 GB, ZeRO-Offload
    49 GB, both 16 GB; offload alone is the fastest that fits (8.9 s against 9.6 s)."""
    llama = fitted(rubick_data, "llama7b")
    both = facts(4, gc=True, offload=True)
    best = fastest_plan(model_perf(both, llama, 80.0, gpus=True), both, (4,), 1, gpus=True)
    assert best is not None and best.plan == Plan(dp=4, zero=Zero.OFFLOAD)
    # (8813.4 since load_history reads k_off, k_swap, k_const by name; 8852.7 before)
    assert best.iter_ms == pytest.approx(8813.4, abs=0.1)
    # GC alone fits nowhere: nothing to choose, the job keeps its plan.
    gc_only = facts(4, gc=True)
    assert fastest_plan(model_perf(gc_only, llama, 80.0, True), gc_only, (4,), 1, gpus=True) is None
    # RoBERTa fits either way: offload is slower (536 ms against 344), so it is not chosen.
    roberta, job = fitted(rubick_data, "roberta"), facts(4, offload=True)
    best = fastest_plan(model_perf(job, roberta, 80.0, gpus=True), job, (4,), 1, gpus=True)
    assert best is not None and best.plan == Plan(dp=4)


def test_a_kept_job_restarts_only_for_a_gain(rubick_data: Path) -> None:
    """Running with GC on 4 roomy A800s: GC off is 21% faster (47.9 ms against 57.9), worth
    a restart at min_gain 0.05, not at 0.5; a job moving anyway takes it."""
    vit = fitted(rubick_data, "vit")
    job = facts(4, gc=True, plan=C.ExecutionPlan(gradient_checkpointing=True))
    roomy = model_perf(job, vit, 80.0, gpus=True)
    assert plan_for(roomy, job, on(4, 1), kept=True, min_gain=0.05) == Plan(dp=4)
    assert plan_for(roomy, job, on(4, 1), kept=True, min_gain=0.5) is None
    assert plan_for(roomy, job, on(4, 1), kept=False, min_gain=0.5) == Plan(dp=4)
    # Without GC on tight devices the model says it cannot run; it does, so it stays.
    off = facts(4, gc=True)
    tight = model_perf(off, vit, 16.0, gpus=True)
    assert plan_for(tight, off, on(4, 1), kept=True, min_gain=0.05) is None


def test_the_shape_is_devices_per_worker_and_the_most_ests() -> None:
    uneven = [(Device("a", 0, "v100"), 3), (Device("b", 0, "v100"), 2), (Device("b", 1, "v100"), 2)]
    assert shape_of(uneven) == ((2, 1), 3)


def test_the_stage_sets_plans_only_for_jobs_that_allow_them(rubick_data: Path) -> None:
    vit = fitted(rubick_data, "vit")
    fits = {"g": vit, "n": vit}
    stage = RubickPlans(FitBook(fits.get))
    jobs = [
        JobFacts("g", "", 4, 1, 4, True, False, C.ExecutionPlan()),
        JobFacts("n", "", 4, 1, 4, False, False, C.ExecutionPlan()),
        JobFacts("u", "", 4, 1, 4, True, False, C.ExecutionPlan()),  # no fit yet
    ]
    group = C.DeviceGroup(accelerator_type="v100", count=12, memory_bytes=16 * 10**9)
    worker = WorkerRecord("w0", "127.0.0.1:1", "h", [group], True, 0.0, 0.0)
    stage.fits.refresh(jobs, [worker], 0.0)
    desired = {
        j: [(Device("w0", 4 * i + k, "v100"), 1) for k in range(4)] for i, j in enumerate("gnu")
    }
    targets = {j: Target(j, (("v100", 4),), {"v100": (1,) * 4}) for j in "gnu"}
    out = stage.choose(targets, desired, {})
    assert out["g"].plan == Plan(dp=4, gc=True)  # 16 GB devices: GC
    assert out["n"] == targets["n"] and out["u"] == targets["u"]
    # Kept where it runs with GC on, the same plan: nothing changes.
    running = dataclasses.replace(jobs[0], plan=C.ExecutionPlan(gradient_checkpointing=True))
    stage.fits.refresh([running, *jobs[1:]], [worker], 1.0)
    assert stage.choose(targets, desired, desired)["g"].plan is None
    # Notes for the jobs it keeps; profiling for those without a fit of their own.
    notes = stage.new_notes(["g", "u", "x"])
    assert notes == {"g": plan_note(vit), "u": plan_note(None)}
    assert stage.wants_profile("u") and not stage.wants_profile("g")
    assert not stage.wants_profile("x")  # a job the stage does not know
    assert not RubickPlans(stage.fits, profile=False).wants_profile("u")


def test_memory_is_that_of_the_workers_a_job_was_placed_on(rubick_data: Path) -> None:
    """A 16 GB worker beside an 80 GB one: ViT on the 16 GB one needs GC, on the 80 GB one
    it does not (the smallest device of the whole cluster is not the job's)."""
    vit = fitted(rubick_data, "vit")
    stage = RubickPlans(FitBook({"s": vit, "b": vit}.get))
    jobs = [JobFacts(j, "", 4, 1, 4, True, False, C.ExecutionPlan()) for j in "sb"]
    workers = [
        WorkerRecord(
            name,
            "127.0.0.1:1",
            "h",
            [C.DeviceGroup(accelerator_type="v100", count=4, memory_bytes=gb * 10**9)],
            True,
            0.0,
            0.0,
        )
        for name, gb in (("small", 16), ("big", 80))
    ]
    stage.fits.refresh(jobs, workers, 0.0)
    assert stage.fits.memory_of(["big"]) == 80.0 and stage.fits.memory_of(["gone"]) == 16.0
    desired = {
        j: [(Device(w, k, "v100"), 1) for k in range(4)] for j, w in (("s", "small"), ("b", "big"))
    }
    targets = {j: Target(j, (("v100", 4),), {"v100": (1,) * 4}) for j in desired}
    out = stage.choose(targets, desired, {})
    assert out["s"].plan == Plan(dp=4, gc=True) and out["b"].plan is None
