"""Parameter-server training on the synthetic click example, CPU only; every figure
measured in this run.

1. Throughput: samples/s of a Wide&Deep PS job (2 PS) with 1, 2 and 4 workers, each on a
   fresh checkpoint folder, and the ratio against 1 worker. Samples/s counts from the
   first step's start to the last step's end (process start-up excluded).
2. PS scale-out: a job on 2 PS x 2 workers grows to 3, then 4 PS; each scale-out's time
   is the old phase's drain + checkpoint (last step -> every process exited, shards
   written) plus the new phase's start (processes, re-partition from the checkpoint,
   RPC set-up -> first step). Target: under 5 s.

PS jobs are asynchronous: the figures vary from run to run (and with what else the
machine runs).

    .venv/bin/python bench/ps.py [--steps 300] [--vocab 50000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from gearshift.worker.ps.data import ClickConfig
from gearshift.worker.ps.launch import Phase, run_phase
from gearshift.worker.ps.model import ModelConfig

TIMEOUT_S = 600.0
TARGET_SCALE_OUT_S = 5.0


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="global batches per run")
    ap.add_argument("--vocab", type=int, default=ClickConfig.vocab, help="ids per field")
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
    if args.json:
        print(
            json.dumps(
                {
                    "samples_per_s": rates,
                    "scaling": {w: r / rates[1] for w, r in rates.items()},
                    "scale_out_s": [s for _, _, s in outs],
                }
            )
        )


if __name__ == "__main__":
    main()
