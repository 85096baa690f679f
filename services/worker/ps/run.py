"""Run a PS job locally.

    python -m gearshift.worker.ps.run --ps 2 --workers 2 --steps 300 --checkpoint-dir D

`--phases 2x2:300,3x4:300,2x2:300` trains phase after phase (PS x workers : global
batches), checkpointing and re-partitioning between them; a checkpoint dir that
already holds a checkpoint is resumed. Prints samples/s and held-out AUC per phase.

`--task` is how a worker daemon runs a PS job's task (see task.py): one phase up to
`--total-steps` global batches from the checkpoint, the cores of the launcher's affinity
split over the processes (`--ps-cores-each`, `--worker-cores`), progress and measured use
in `--progress-file`, SIGUSR1 = stop at the batches claimed and checkpoint (exit 75).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from gearshift.common.facts import EXIT_COMPLETED, EXIT_STOPPED
from gearshift.worker.ps import task as pstask
from gearshift.worker.ps.checkpoint import evaluate, read_manifest
from gearshift.worker.ps.data import ClickConfig
from gearshift.worker.ps.feed import ShardSource
from gearshift.worker.ps.launch import Phase, PhaseResult, run_phase
from gearshift.worker.ps.meet import Meeting, parse_roles
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
    read_ms: float = 0.0,
    meeting: Meeting | None = None,
) -> list[PhaseResult]:
    """Every phase in turn on one checkpoint folder, with the held-out AUC after each;
    `meeting`: this launcher's part of phases spread over hosts (meet.py)."""
    results = []
    for phase in phases:
        res = run_phase(
            root,
            phase,
            data,
            model,
            timeout_s=timeout_s,
            shards=shards,
            read_ms=read_ms,
            meeting=meeting,
        )
        res = replace(res, auc=evaluate(root, eval_blocks) if eval_blocks else None)
        results.append(res)
    return results


def checkpoint_digest(root: Path) -> str:
    """SHA-256 of the last checkpoint (manifest, dense part, every PS shard): what a
    finished PS task reports as its digest. Asynchronous training: two runs differ."""
    manifest = read_manifest(root)
    if manifest is None:
        return ""
    h = hashlib.sha256((root / "manifest.json").read_bytes())
    for path in sorted((root / manifest.folder).glob("*.pt")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def run_task(
    args: argparse.Namespace, data: ClickConfig, model: ModelConfig, meeting: Meeting | None
) -> int:
    """One phase as a worker daemon's task (module doc of task.py); the exit code.
    `meeting`: the job spreads over several workers' launchers (ps/spread.py)."""
    from gearshift.worker.resources import pin_from_environment  # noqa: PLC0415
    from gearshift.worker.spawner import STOP_SIGNALS, die_with_parent  # noqa: PLC0415

    root: Path = args.checkpoint_dir
    root.mkdir(parents=True, exist_ok=True)
    stop = root / pstask.STOP_FILE
    stop.unlink(missing_ok=True)  # a stop meant for an earlier task

    def on_stop(signum: int, frame: object) -> None:
        stop.touch()

    die_with_parent()  # a worker daemon that dies takes its task along
    for sig in STOP_SIGNALS:
        signal.signal(sig, on_stop)
    # The daemon spawns with the stop signals blocked (one that came early waits): let them in.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    pinned = pin_from_environment()
    if pinned:
        print(pinned, flush=True)
    prev = read_manifest(root)
    first = prev.next_batch if prev is not None else 0
    steps = max(args.total_steps - first, 0)
    progress_file: Path | None = args.progress_file
    ps_each = args.ps_cores_each or [1.0] * args.ps
    if len(ps_each) != args.ps:
        raise ValueError(f"--ps-cores-each has {len(ps_each)} values for {args.ps} PS")
    cores = pstask.assign_cores(
        sorted(os.sched_getaffinity(0)), [*ps_each, *[args.worker_cores] * args.workers]
    )
    last_auc = float(pstask.read_json(root / "last-auc.json").get("auc", 0.0))
    started: list[tuple[float, int]] = []

    def write_progress(next_batch: int, rate: float, metrics: Mapping[str, object]) -> None:
        if progress_file is None:
            return
        pstask.write_json_atomic(
            progress_file,
            {
                "step": next_batch,
                "loss": 0.0,
                "samples_per_s": rate,
                # Told to resume and found no checkpoint: the scheduler's STARTED_FRESH.
                "started_fresh": args.resume and prev is None,
                "ps_metrics": {**metrics, "heldout_auc": last_auc},
            },
        )

    def on_tick(meter: pstask.UseMeter, counter: dict[str, Any]) -> None:
        next_batch = int(counter.get("next_batch", first))
        now = time.monotonic()
        if not started and next_batch > first:
            started.append((now, next_batch))
        rate = 0.0
        if started and now > started[0][0]:
            rate = (next_batch - started[0][1]) * data.batch / (now - started[0][0])
        write_progress(next_batch, rate, meter.metrics())

    print(
        f"PS task: {args.ps} PS x {args.workers} workers, batches {first} -> "
        f"{args.total_steps}, cores {cores}",
        flush=True,
    )
    write_progress(first, 0.0, {"ps": args.ps, "workers": args.workers})
    shards = _shards(args, root)
    # Phases of the same counts, each ending in a published checkpoint: a task killed
    # mid-run loses at most --checkpoint-every batches, not everything since it started.
    every = args.checkpoint_every or steps
    at = first
    while True:
        length = min(every, args.total_steps - at)
        res = run_phase(
            root,
            Phase(args.ps, args.workers, length),
            data,
            model,
            timeout_s=args.timeout,
            shards=shards,
            cores=cores,
            on_tick=on_tick,
            read_ms=args.read_ms,
            meeting=meeting,
        )
        ran_short = res.end_batch < at + length  # stopped, or the data ran out
        at = res.end_batch
        if ran_short or at >= args.total_steps or stop.exists():
            break
    if args.eval_blocks:
        last_auc = evaluate(root, args.eval_blocks)
        pstask.write_json_atomic(root / "last-auc.json", {"auc": last_auc})
    res = replace(res, auc=last_auc)
    write_progress(res.end_batch, res.samples_per_s, dict(res.metrics or {}))
    print(json.dumps(asdict(res)) if args.json else describe(res), flush=True)
    if res.end_batch < args.total_steps:
        if stop.exists():
            return EXIT_STOPPED
        print(
            f"error: the data ran out at global batch {res.end_batch} of {args.total_steps} "
            f"(the shard manager's dataset has {args.epochs} epochs of {data.train_blocks})",
            file=sys.stderr,
        )
        return 1
    if args.stats_file is not None:
        args.stats_file.parent.mkdir(parents=True, exist_ok=True)
        pstask.write_json_atomic(args.stats_file, {"digest": checkpoint_digest(root)})
    return EXIT_COMPLETED


def _shards(args: argparse.Namespace, root: Path) -> ShardSource | None:
    if not args.shard_manager:
        return None
    dataset_id = (
        args.dataset_id or f"ps-{hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]}"
    )
    token = args.token or os.environ.get("GEARSHIFT_TOKEN")
    return ShardSource(
        args.shard_manager, dataset_id, token, args.epochs, job_id=args.job_id or dataset_id
    )


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
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="seconds a phase may take (inf: no limit)"
    )
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
    ap.add_argument(
        "--read-ms",
        type=float,
        default=0.0,
        help="each worker sleeps this long per batch: a stand-in for reading it from "
        "remote storage (the synthetic batches are generated in place)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object per phase")
    ap.add_argument(
        "--store",
        help="HOST:PORT of the TCP store where the processes of launchers on several hosts "
        "meet (one launcher serves it: --serve-store; default: one host, a file store)",
    )
    ap.add_argument(
        "--serve-store",
        action="store_true",
        help="--store: serve it here, and publish each phase's checkpoint",
    )
    ap.add_argument(
        "--roles",
        help="--store: the processes this launcher runs, e.g. ps:0,worker:0 ('': none; "
        "default: all)",
    )
    ap.add_argument(
        "--task", action="store_true", help="run as a worker daemon's task (see task.py)"
    )
    ap.add_argument("--total-steps", type=int, help="--task: train up to this global batch")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="--task: a checkpoint is expected (the progress says so when none is found); "
        "a task always resumes the checkpoint it finds",
    )
    ap.add_argument("--job-id", help="--task: the job that owns the shard-manager dataset")
    ap.add_argument("--progress-file", type=Path, help="--task: progress and measured use")
    ap.add_argument("--stats-file", type=Path, help="--task: the digest, once finished")
    ap.add_argument(
        "--ps-cores-each",
        type=lambda t: [float(x) for x in t.split(",")],
        help="--task: cores of each PS, e.g. 1,2 (default 1 each)",
    )
    ap.add_argument("--worker-cores", type=float, default=1.0, help="--task: cores per worker")
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="--task: checkpoint every this many global batches (each a phase of the same "
        "counts); 0: only when the task stops or ends",
    )
    args = ap.parse_args(argv)
    if args.task and (args.checkpoint_dir is None or args.total_steps is None):
        ap.error("--task needs --checkpoint-dir and --total-steps")
    if args.checkpoint_every < 0:
        ap.error(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if not (math.isfinite(args.read_ms) and args.read_ms >= 0):
        ap.error(f"--read-ms must be a finite number >= 0, got {args.read_ms}")
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
        meeting = None
        if args.store:
            roles = parse_roles(args.roles) if args.roles is not None else None
            meeting = Meeting(args.store, args.serve_store, roles)
        elif args.serve_store or args.roles is not None:
            raise ValueError("--serve-store and --roles need --store")
        if meeting is not None and not args.task and args.shard_manager:
            raise ValueError("--store with --shard-manager is for --task (the scheduler's)")
    except ValueError as exc:
        ap.error(str(exc))
    torch.set_num_threads(1)  # the launcher only evaluates; its children fork from it
    if args.task:
        try:
            return run_task(args, data, model, meeting)
        except (RuntimeError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    root = args.checkpoint_dir or Path(tempfile.mkdtemp(prefix="gearshift-ps-"))
    shards = _shards(args, root)
    try:
        for res in run(
            root,
            phases,
            data,
            model,
            eval_blocks=args.eval_blocks,
            timeout_s=args.timeout,
            shards=shards,
            read_ms=args.read_ms,
            meeting=meeting,
        ):
            print(json.dumps(asdict(res)) if args.json else describe(res), flush=True)
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"checkpoint: {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
