"""An elastic PS job against a fixed small plan given the same wall time.

The elastic side trains phase after phase on one checkpoint folder (as `run.py
--phases` does), and its wall time counts everything: process start-up, the drain and
checkpoint of each phase, the re-partition at each scale change. The fixed side then
trains one phase on its own folder, told to hand out no batch after that same wall time
from its launch (`run_phase(stop_after_s=...)`); its own drain and checkpoint come on
top, so the fixed side gets slightly more wall time, never less. Both are scored by the
held-out AUC of their last checkpoint.

For the comparison to mean "more batches trained = better model", the training set must
not repeat within the batches trained (`ClickConfig.train_blocks` above both sides'
batches; a repeat would overfit the small synthetic set), and the workers must be bound
by something extra workers overlap: `read_ms`, the stand-in for reading each batch from
remote storage (on a machine with few cores, compute alone does not scale with workers).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gearshift.worker.ps.checkpoint import evaluate
from gearshift.worker.ps.data import ClickConfig
from gearshift.worker.ps.launch import Phase, PhaseResult, run_phase
from gearshift.worker.ps.model import ModelConfig


@dataclass(frozen=True)
class Side:
    """One side of the comparison, measured."""

    plan: str  # e.g. "2x2:400,3x4:1200,2x2:400" or "1x1 for 21.3 s"
    batches: int  # global batches trained
    wall_s: float  # launch of the first phase -> last phase checkpointed
    auc: float  # held-out AUC of the last checkpoint


@dataclass(frozen=True)
class Comparison:
    elastic: Side
    fixed: Side

    @property
    def auc_gain(self) -> float:
        return self.elastic.auc - self.fixed.auc


def _describe(phases: Sequence[Phase]) -> str:
    return ",".join(f"{p.ps}x{p.workers}:{p.steps}" for p in phases)


def compare(
    elastic_root: Path,
    fixed_root: Path,
    phases: Sequence[Phase],
    data: ClickConfig,
    model: ModelConfig,
    *,
    read_ms: float,
    fixed_ps: int = 1,
    fixed_workers: int = 1,
    eval_blocks: int = 40,
    timeout_s: float = 300.0,
) -> Comparison:
    """Run the elastic phases, then the fixed plan for the elastic side's wall time."""
    if not phases:
        raise ValueError("compare needs at least one elastic phase")
    for root in (elastic_root, fixed_root):
        if (root / "manifest.json").exists():
            raise ValueError(f"{root} already holds a checkpoint; compare needs fresh folders")
    planned = sum(p.steps for p in phases)
    # No batch may repeat on either side (module doc); the fixed side's bound is its stop.
    if planned > data.train_blocks:
        raise ValueError(
            f"the elastic phases train {planned} batches but the training set has "
            f"{data.train_blocks} (train_blocks): batches would repeat"
        )
    started = time.monotonic()
    results: list[PhaseResult] = [
        run_phase(elastic_root, p, data, model, timeout_s=timeout_s, read_ms=read_ms)
        for p in phases
    ]
    wall = time.monotonic() - started
    auc = evaluate(elastic_root, eval_blocks)
    elastic = Side(_describe(phases), results[-1].end_batch, wall, auc)
    started = time.monotonic()
    res = run_phase(
        fixed_root,
        Phase(fixed_ps, fixed_workers, data.train_blocks),
        data,
        model,
        timeout_s=timeout_s,
        read_ms=read_ms,
        stop_after_s=wall,
    )
    fixed_wall = time.monotonic() - started
    if not res.stopped:
        raise RuntimeError(
            f"the fixed plan trained the whole training set ({data.train_blocks} batches) "
            f"within {wall:.1f} s: make train_blocks larger"
        )
    fixed = Side(
        f"{fixed_ps}x{fixed_workers} for {wall:.1f} s",
        res.end_batch,
        fixed_wall,
        evaluate(fixed_root, eval_blocks),
    )
    return Comparison(elastic, fixed)
