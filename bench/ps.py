"""Parameter-server training on the synthetic click example, CPU only; every figure
measured in this run.

1. Throughput: samples/s of a Wide&Deep PS job (2 PS) with 1, 2 and 4 workers, each on a
   fresh checkpoint folder, and the ratio against 1 worker. Samples/s counts from the
   first step's start to the last step's end (process start-up excluded).
2. PS scale-out: a job on 2 PS x 2 workers grows to 3, then 4 PS; each scale-out's time
   is the old phase's drain + checkpoint (last step -> every process exited, shards
   written) plus the new phase's start (processes, re-partition from the checkpoint,
   RPC set-up -> first step). Target: under 5 s.
3. Held-out AUC against batches trained (one 2 PS x 2 worker job, evaluated at 100, 200,
   400, 800, 1600 batches) with the default training set of 400 batches (repeats:
   overfits) and with one of 20000 (no batch repeats: more batches, higher AUC).
4. The elastic job 2x2 -> 3x4 -> 2x2 against a fixed 1 PS x 1 worker plan given the same
   wall time (gearshift.worker.ps.compare), the workers bound by a `--read-ms` per-batch
   read (a sleep standing in for fetching the batch from remote storage): batches and
   held-out AUC of each side.

PS jobs are asynchronous: the figures vary from run to run (and with what else the
machine runs).

    .venv/bin/python bench/ps.py [--steps 300] [--vocab 50000] [--read-ms 40]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import torch

from gearshift.worker.ps.checkpoint import evaluate
from gearshift.worker.ps.compare import Comparison, compare
from gearshift.worker.ps.data import ClickConfig
from gearshift.worker.ps.launch import Phase, run_phase
from gearshift.worker.ps.model import ModelConfig

TIMEOUT_S = 600.0
TARGET_SCALE_OUT_S = 5.0
CURVE_AT = (100, 200, 400, 800, 1600)
FRESH_BLOCKS = 20_000  # training set of the AUC runs: no batch repeats within them


def throughput(data: ClickConfig, model: ModelConfig, steps: int, workers: int) -> float:
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-ps-") as tmp:
        res = run_phase(Path(tmp), Phase(2, workers, steps), data, model, timeout_s=TIMEOUT_S)
    return res.samples_per_s


def scale_outs(data: ClickConfig, model: ModelConfig, steps: int) -> list[tuple[int, int, float]]:
    """(PS before, PS after, seconds) for 2 -> 3 -> 4 PS."""
    out = []
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-ps-") as tmp:
        root = Path(tmp)
        prev = run_phase(root, Phase(2, 2, steps), data, model, timeout_s=TIMEOUT_S)
        for ps in (3, 4):
            res = run_phase(root, Phase(ps, 2, steps), data, model, timeout_s=TIMEOUT_S)
            out.append((prev.ps, res.ps, prev.stop_s + res.start_s))
            prev = res
    return out


def auc_curve(data: ClickConfig, model: ModelConfig) -> list[tuple[int, float]]:
    """(batches trained, held-out AUC) of one 2x2 job, checkpointed at each CURVE_AT."""
    out = []
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-ps-") as tmp:
        root, done = Path(tmp), 0
        for batches in CURVE_AT:
            run_phase(root, Phase(2, 2, batches - done), data, model, timeout_s=TIMEOUT_S)
            done = batches
            out.append((batches, evaluate(root)))
    return out


def same_wall_time(data: ClickConfig, model: ModelConfig, read_ms: float) -> Comparison:
    phases = [Phase(2, 2, 150), Phase(3, 4, 500), Phase(2, 2, 150)]
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-ps-") as tmp:
        root = Path(tmp)
        return compare(
            root / "elastic", root / "fixed", phases, data, model,
            read_ms=read_ms, timeout_s=TIMEOUT_S,
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="global batches per run")
    ap.add_argument("--vocab", type=int, default=ClickConfig.vocab, help="ids per field")
    ap.add_argument(
        "--read-ms", type=float, default=40.0, help="per-batch read stand-in of section 4"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = ClickConfig(vocab=args.vocab)
    model = ModelConfig()
    print(
        f"Wide&Deep, {data.fields} fields x {data.vocab} ids ({data.rows} rows of {model.width}), "
        f"batch {data.batch}, {args.steps} global batches per run"
    )
    rates = {w: throughput(data, model, args.steps, w) for w in (1, 2, 4)}
    for w, rate in rates.items():
        print(f"2 PS x {w} workers: {rate:8.0f} samples/s  ({rate / rates[1]:.2f}x of 1 worker)")
    outs = scale_outs(data, model, args.steps)
    for before, after, secs in outs:
        verdict = "ok" if secs < TARGET_SCALE_OUT_S else "OVER TARGET"
        target = f"target < {TARGET_SCALE_OUT_S:.0f} s"
        print(f"scale-out {before} -> {after} PS: {secs:.2f} s ({target}, {verdict})")
    curves = {
        blocks: auc_curve(replace(data, train_blocks=blocks), model)
        for blocks in (data.train_blocks, FRESH_BLOCKS)
    }
    for blocks, curve in curves.items():
        points = ", ".join(f"{b}: {auc:.4f}" for b, auc in curve)
        print(f"held-out AUC by batches trained, training set {blocks} batches: {points}")
    cmp = same_wall_time(replace(data, train_blocks=FRESH_BLOCKS), model, args.read_ms)
    for name, side in (("elastic", cmp.elastic), ("fixed", cmp.fixed)):
        print(
            f"{name:7} {side.plan:26} {side.batches:5} batches in {side.wall_s:5.1f} s, "
            f"held-out AUC {side.auc:.4f}"
        )
    print(f"AUC gain of the elastic job in the same wall time: {cmp.auc_gain:+.4f}")
    if args.json:
        print(
            json.dumps(
                {
                    "samples_per_s": rates,
                    "scaling": {w: r / rates[1] for w, r in rates.items()},
                    "scale_out_s": [s for _, _, s in outs],
                    "auc_curve": {str(b): c for b, c in curves.items()},
                    "same_wall_time": asdict(cmp),
                }
            )
        )


if __name__ == "__main__":
    main()
