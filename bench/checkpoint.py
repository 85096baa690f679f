"""How long a checkpoint stops training: snapshot-and-write against a synchronous write, on
the digits CNN (4 ESTs, one CPU process, D1), both measured in this run.

1. One checkpoint at a step boundary, --repeats times each way, alternating: the pause is
   the time `Trainer.save_checkpoint` holds the loop. Synchronous: state dicts, torch.save,
   fsync, rename, record. Snapshot-and-write: the state copied into shared memory and the
   write handed to the writer process; the write's own time (until durable) is given beside it.
   Each snapshot is taken with no write in flight. Target: the snapshot's median pause at
   most a fifth of the synchronous one's.
2. A run of --steps steps checkpointing every --every steps, each way: the loop's summed
   checkpoint pauses (a snapshot also waits for a previous write still in flight), the
   run's wall time, and the final digests, which must be equal.
3. The same for a larger state (--big-steps steps of an MLP with Adam, 512 x 2048 x 2048 x 10,
   a 63 MB checkpoint every 5 steps, 2 ESTs), where the write itself is long: its pauses
   and wall time each way.

    .venv/bin/python bench/checkpoint.py [--repeats 20] [--steps 100] [--every 10]
                                         [--big-steps 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gearshift.worker.runtime import determinism
from gearshift.worker.runtime.job import load_job
from gearshift.worker.runtime.process import seed_globals
from gearshift.worker.runtime.settings import Determinism, RunSettings, placement
from gearshift.worker.runtime.trainer import RunResult, Trainer

CNN = "gearshift.examples.digits_cnn"
CONFIG = {"lr": 0.05}
MLP = "gearshift.examples.mlp"
BIG = {"features": 512, "hidden": 2048, "classes": 10, "samples": 4096, "optimizer": "adam"}


def trainer(
    folder: Path,
    settings: RunSettings,
    *,
    async_checkpoint: bool,
    module: str = CNN,
    config: dict[str, Any] = CONFIG,
) -> Trainer:
    seed_globals(settings.seed)
    job = load_job(module, dict(config))
    ref = {"module": module, "config": config}
    procs = placement((settings.num_ests,))
    return Trainer(job, settings, procs, 0, folder, job_ref=ref, async_checkpoint=async_checkpoint)


def one_checkpoint(folder: Path, repeats: int) -> dict[str, Any]:
    """Median pause of each way, and the background write's median time (seconds)."""
    settings = RunSettings(num_ests=4, global_batch_size=16, total_steps=20, seed=7, shard_size=16)
    it = trainer(folder, settings, async_checkpoint=False)
    it.run()  # 20 steps: momentum buffers and every EST's state are real
    it.writer.start()  # as run() does before its loop: the fork is off every pause
    sync, snap, write = [], [], []
    for _ in range(repeats):
        began = time.perf_counter()
        it.save_checkpoint()
        sync.append(time.perf_counter() - began)
        began = time.perf_counter()
        it.save_checkpoint(wait=False)
        snap.append(time.perf_counter() - began)
        it.writer.wait()
        write.append(time.perf_counter() - began)
    path = it.checkpoint_dir / f"ckpt-{it.step:08d}.pt"
    return {
        "sync_pause_s": statistics.median(sync),
        "snapshot_pause_s": statistics.median(snap),
        "background_write_s": statistics.median(write),
        "ratio": statistics.median(snap) / statistics.median(sync),
        "checkpoint_bytes": path.stat().st_size,
        "repeats": repeats,
    }


def in_a_run(folder: Path, steps: int, every: int, *, big: bool = False) -> dict[str, Any]:
    """The same run checkpointing every `every` steps, synchronously then off the path."""
    settings = RunSettings(
        num_ests=2 if big else 4, global_batch_size=32 if big else 16, total_steps=steps,
        seed=7, shard_size=64 if big else 16, checkpoint_every=every,
    )  # fmt: skip
    module, config = (MLP, BIG) if big else (CNN, CONFIG)
    results: dict[str, RunResult] = {}
    for mode in ("sync", "async"):
        async_checkpoint = mode == "async"
        it = trainer(
            folder / mode, settings, async_checkpoint=async_checkpoint, module=module, config=config
        )
        results[mode] = it.run()
    sync, snap = results["sync"], results["async"]
    return {
        "steps": steps,
        "every": every,
        "sync_pauses_s": sync.checkpoint_pause_s,
        "snapshot_pauses_s": snap.checkpoint_pause_s,
        "ratio": snap.checkpoint_pause_s / sync.checkpoint_pause_s,
        "sync_wall_s": sync.wall_s,
        "snapshot_wall_s": snap.wall_s,
        "same_digest": sync.digest == snap.digest,
    }


def _print_run(title: str, run: dict[str, Any]) -> None:
    print(title)
    for mode, label in (("sync", "synchronous:       "), ("snapshot", "snapshot-and-write:")):
        print(
            f"  {label} {run[f'{mode}_pauses_s'] * 1e3:8.1f} ms of pauses, "
            f"run {run[f'{mode}_wall_s']:.2f} s"
        )
    print(f"  ratio: {run['ratio']:.3f}; same digest: {run['same_digest']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="checkpoints of each way")
    parser.add_argument("--steps", type=int, default=100, help="steps of each run (part 2)")
    parser.add_argument("--every", type=int, default=10, help="checkpoint interval (part 2)")
    parser.add_argument(
        "--big-steps", type=int, default=60, help="steps of the 63 MB runs (part 3; 0: skip)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    determinism.apply(Determinism.D1, 1, 1)
    with tempfile.TemporaryDirectory(prefix="gearshift-checkpoint-") as tmp:
        root = Path(tmp)
        one = one_checkpoint(root / "one", args.repeats)
        run = in_a_run(root / "run", args.steps, args.every)
        big = in_a_run(root / "big", args.big_steps, 5, big=True) if args.big_steps else None
    target = one["ratio"] <= 0.2
    same = run["same_digest"] and (big is None or big["same_digest"])
    if args.json:
        document = {"one_checkpoint": one, "in_a_run": run, "larger_state": big}
        print(json.dumps(document | {"target_met": target}))
        return 0 if target and same else 1
    kib = one["checkpoint_bytes"] / 1024
    print(f"digits CNN, 4 ESTs, one CPU process, checkpoint of {kib:.0f} KiB")
    print(f"one checkpoint, median of {args.repeats}:")
    print(f"  synchronous (write, fsync, rename):   {one['sync_pause_s'] * 1e3:8.2f} ms pause")
    print(f"  snapshot-and-write:                   {one['snapshot_pause_s'] * 1e3:8.2f} ms pause")
    print(f"    (its write, in the background:      {one['background_write_s'] * 1e3:8.2f} ms)")
    print(f"  ratio: {one['ratio']:.3f} (target <= 0.2: {'met' if target else 'NOT met'})")
    _print_run(f"{args.steps} steps, a checkpoint every {args.every}:", run)
    if big is not None:
        _print_run(f"MLP with Adam, 63 MB state, {args.big_steps} steps, one every 5:", big)
    return 0 if target and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
