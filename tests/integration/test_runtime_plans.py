"""Execution plans (Rubick) that change between checkpoints leave a job's bits alone.

The plan's dimensions the runtime executes: ESTs per process (the placement, i.e.
gradient accumulation in EST terms), gradient checkpointing, intra-op threads per
process. A job run in segments, each on another plan and resumed from the previous
segment's checkpoint, must end with the bytes of the same job on one fixed plan:
parameters, buffers, optimizer and LR state, every EST's context, every EST's loss at
every step, and the digest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gearshift.worker.runtime.digest import differences
from tests.integration.test_runtime_elastic import CNN, LM, Run, launch

GC = "--gradient-checkpointing"


def assert_same(reference: Run, other: Run) -> None:
    """Every byte of the final checkpoint but the plan it records, every loss, the digest."""
    ref, out = reference.final(), other.final()
    assert ref.pop("plan") != out.pop("plan")
    assert differences(ref, out) == []
    assert other.losses() == reference.losses()
    assert other.digest() == reference.digest()


def test_cnn_plan_changes_under_d2_end_with_the_fixed_plans_bits(tmp_path: Path) -> None:
    """GC on -> off, ESTs per process 1 -> 2, threads 1 -> 2, then back, under D2."""
    d2 = ("--determinism", "D2", "--d2-threads", "1")
    fixed = launch(tmp_path / "fixed", CNN, 2, 2, 45, *d2, "--threads", "1")
    staged = tmp_path / "staged"
    first = launch(staged, CNN, 2, 2, 15, *d2, "--threads", "1", GC)
    assert first.final()["plan"] == {
        "ests_per_process": [1, 1],
        "gradient_checkpointing": True,
        "offload_optimizer": False,
    }
    second = launch(staged, CNN, 2, 1, 30, *d2, "--threads", "2", "--resume")
    assert second.final()["plan"]["ests_per_process"] == [2]
    assert second.final()["plan"]["gradient_checkpointing"] is False
    final = launch(staged, CNN, 2, 2, 45, *d2, "--threads", "2,1", "--resume", GC)
    assert_same(fixed, final)


def test_language_model_gc_and_ests_per_process_change_under_d1(tmp_path: Path) -> None:
    """Dropout inside the recomputed transformer, Adam; one thread throughout (D1 pins it)."""
    fixed = launch(tmp_path / "fixed", LM, 2, 2, 30)
    staged = tmp_path / "staged"
    launch(staged, LM, 2, 1, 10, GC)
    launch(staged, LM, 2, 2, 20, "--resume")
    assert_same(fixed, launch(staged, LM, 2, 1, 30, "--resume", GC))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_offload_keeps_its_bits_through_rescales_and_resumes_either_way(tmp_path: Path) -> None:
    """Offload moves the optimizer's arithmetic to the CPU, so an offloaded job is compared
    with itself: offloaded throughout on 1 process vs 1 -> 2 processes sharing the GPU. A
    checkpoint taken without offload resumes with it."""
    off = ("--device", "cuda", "--offload-optimizer")
    fixed = launch(tmp_path / "fixed", CNN, 2, 1, 20, *off)
    staged = tmp_path / "staged"
    launch(staged, CNN, 2, 1, 10, *off)
    assert_same(fixed, launch(staged, CNN, 2, 2, 20, *off, "--resume"))
    mixed = tmp_path / "mixed"
    launch(mixed, CNN, 2, 1, 10, "--device", "cuda")
    final = launch(mixed, CNN, 2, 1, 20, *off, "--resume").final()
    assert final["step"] == 20
    assert final["plan"]["offload_optimizer"] is True
