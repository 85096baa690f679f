"""Run a PS job locally.

    python -m gearshift.worker.ps.run --ps 2 --workers 2 --steps 300 --checkpoint-dir D

`--phases 2x2:300,3x4:300,2x2:300` trains phase after phase (PS x workers : global
batches), checkpointing and re-partitioning between them; a checkpoint dir that
already holds a checkpoint is resumed. Prints samples/s and held-out AUC per phase.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from gearshift.worker.ps.checkpoint import evaluate
from gearshift.worker.ps.data import ClickConfig
from gearshift.worker.ps.feed import ShardSource
from gearshift.worker.ps.launch import Phase, PhaseResult, run_phase
from gearshift.worker.ps.model import ModelConfig


def parse_phases(text: str) -> list[Phase]:
    """'2x2:300,3x4:300' -> [Phase(2, 2, 300), Phase(3, 4, 300)]."""
    phases = []
    for item in text.split(","):
        try:
            counts, steps = item.strip().split(":")
            ps, workers = counts.split("x")
            phases.append(Phase(int(ps), int(workers), int(steps)))
        except ValueError as exc:
            raise ValueError(f"--phases item {item!r} is not PSxWORKERS:STEPS ({exc})") from None
    return phases


def run(
    root: Path,
    phases: Sequence[Phase],
    data: ClickConfig,
    model: ModelConfig,
    *,
    eval_blocks: int = 40,
    timeout_s: float = 300.0,
    shards: ShardSource | None = None,
) -> list[PhaseResult]:
    """Every phase in turn on one checkpoint folder, with the held-out AUC after each."""
    results = []
    for phase in phases:
        res = run_phase(root, phase, data, model, timeout_s=timeout_s, shards=shards)
        res = replace(res, auc=evaluate(root, eval_blocks) if eval_blocks else None)
        results.append(res)
    return results


def describe(res: PhaseResult) -> str:
    auc = f"{res.auc:.4f}" if res.auc is not None else "-"
    return (
        f"phase {res.generation}: {res.ps} PS x {res.workers} workers, "
        f"batches {res.first_batch}->{res.end_batch}, {res.samples_per_s:.0f} samples/s, "
        f"held-out AUC {auc}, start {res.start_s:.2f} s, stop+checkpoint {res.stop_s:.2f} s, "
        f"updates acked {res.updates_acked} applied {res.updates_applied}"
        + (f", shards covered {res.shards_covered}" if res.shards_covered else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gearshift.worker.ps.run", description=__doc__)
    ap.add_argument("--ps", type=int, default=2, help="PS processes (without --phases)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (without --phases)")
    ap.add_argument(
        "--steps", type=int, default=300, help="global batches to train (without --phases)"
    )
    ap.add_argument(
        "--phases", help="PSxWORKERS:STEPS,... trained in turn, e.g. 2x2:300,3x4:300,2x2:300"
    )
    ap.add_argument(
        "--checkpoint-dir",
        type=Path,
        help="resumed when it holds a checkpoint (default: a temp dir)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fields", type=int, default=ClickConfig.fields)
    ap.add_argument("--vocab", type=int, default=ClickConfig.vocab, help="ids per field")
    ap.add_argument("--batch", type=int, default=ClickConfig.batch)
    ap.add_argument(
        "--train-blocks", type=int, default=ClickConfig.train_blocks, help="training set / batch"
    )
    ap.add_argument("--dim", type=int, default=ModelConfig.dim)
    ap.add_argument("--lr", type=float, default=ModelConfig.lr)
    ap.add_argument(
        "--eval-blocks", type=int, default=40, help="held-out batches for the AUC (0: none)"
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a phase may take")
    ap.add_argument(
        "--shard-manager",
        metavar="ADDRESS",
        help="read dynamic shards (one per training batch) from this shard manager "
        "(at-least-once); default: batches by the global counter on PS 0",
    )
    ap.add_argument(
        "--dataset-id", help="the shard manager's dataset (default: one per checkpoint dir)"
    )
    ap.add_argument("--epochs", type=int, default=100, help="epochs of the shard-manager dataset")
    ap.add_argument("--token", help="bearer token for the shard manager (GEARSHIFT_TOKEN)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per phase")
    args = ap.parse_args(argv)
    try:
        phases = (
            parse_phases(args.phases) if args.phases else [Phase(args.ps, args.workers, args.steps)]
        )
        data = ClickConfig(
            seed=args.seed,
            fields=args.fields,
            vocab=args.vocab,
            batch=args.batch,
            train_blocks=args.train_blocks,
        )
        model = ModelConfig(dim=args.dim, lr=args.lr)
    except ValueError as exc:
        ap.error(str(exc))
    torch.set_num_threads(1)  # the launcher only evaluates; its children fork from it
    root = args.checkpoint_dir or Path(tempfile.mkdtemp(prefix="gearshift-ps-"))
    shards = None
    if args.shard_manager:
        dataset_id = (
            args.dataset_id or f"ps-{hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]}"
        )
        token = args.token or os.environ.get("GEARSHIFT_TOKEN")
        shards = ShardSource(args.shard_manager, dataset_id, token, args.epochs)
    try:
        for res in run(
            root,
            phases,
            data,
            model,
            eval_blocks=args.eval_blocks,
            timeout_s=args.timeout,
            shards=shards,
        ):
            print(json.dumps(asdict(res)) if args.json else describe(res), flush=True)
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"checkpoint: {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
