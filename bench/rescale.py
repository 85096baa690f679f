"""What rescaling costs the digits CNN job on a local cluster of real daemons, in place
against checkpoint-and-restart, CPU only; every figure measured in this run.

1. One checkpoint + restore inside a process: Trainer.save_checkpoint (written, synced,
   renamed) and loading it back into model, optimizer, LR scheduler and EST contexts;
   median of --repeats (target: checkpoint + restore under 5 s on CPU).
2. Rescales driven through the scheduler, once per path, each path on clusters of its own
   (the same workers and job specs; `round.rescaleInPlace` on for the in-place path, off for
   the restart path):
   - **grow and shrink:** a job of 4 ESTs (elastic 1..4) on two workers of 2 CPU slots.
     --cycles times, a one-EST newcomer is submitted (the job shrinks; EasyScale's allocator
     gives it 2 devices, on one worker) and then cancelled (it grows back to 4), each
     rescale measured, and `--gap` steps trained, before the next action;
   - **move between workers:** a job of 2 ESTs on 2 devices (min 2), on three workers of one
     CPU slot: a fast one and two whose daemons sleep --step-delay a step (the daemon's
     test-only flag). The job starts on the fast worker and a slow one; the straggler
     detection marks that one degraded and the job moves off it onto the other slow one
     (whose mark has cleared after --clear-seconds), and back, until the job ends: one
     process stays on the fast worker, one changes worker. The joiner's first step
     includes its step delay.
   A rescale's cost is the scheduler's own measure, from its decision (the RESCALING event;
   in place, the later of it and the moment the job paused for the change: it trains on
   while its joiners start) to the new placement's first step, as its PROGRESS event says it
   ("rescale cost [in place] X s"); its kind is read from the placements before and after
   the RESCALED event, its path from that message (the RESCALED event of an in-place one
   says "in place (generation N: ...)"): a rescale that the round sent down the restart path
   counts as a restart, one whose processes gave the change up (exit 75, then restarted) as
   in place.
   Median and max per kind and path.
3. Throughput: the grow-and-shrink job (2 x --cycles rescales) against the same job on 4
   devices never rescaled (steps per second from STARTED to SUCCEEDED, on the same
   cluster), and the ratio. Every run's digest must equal its fixed run's (the moving job's:
   a 2-process run of the same spec outside the cluster).

The scheduler runs EasyScale's allocator alone with `estimates.restartSeconds: 0` (the
restart assumed until one is measured: a grow always pays, so the job grows back as soon as
the newcomer leaves), rounds of 1 s, event rounds always, no start/move limits and no
exemption of young placements. The
Brain and the scheduler keep their state in SQLite files in a temporary folder; the shard
manager uses --redis-url (default: $GEARSHIFT_TEST_REDIS_URL or the local Redis).

    .venv/bin/python bench/rescale.py [--cycles 10] [--steps 2500] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rescale_inplace import KINDS, summary
from gearshift.client.devcluster import ClusterConfig, DevCluster
from gearshift.client.sdk import Client
from gearshift.v1 import common_pb2, scheduler_pb2

CNN = "gearshift.examples.digits_cnn"
CONFIG = {"lr": 0.05}
C = common_pb2
S = scheduler_pb2
TIMEOUT_S = 600.0
PATHS = ("in_place", "restart")
RESIZE_WORKERS = (("w1", "cpu:2"), ("w2", "cpu:2"))
# The moving job starts on fast and slow1 (placed in the workers' order); from the start, so
# that slow2's zygote is warm (its imports done) when the job first moves there.
MOVE_WORKERS = (("fast", "cpu:1"), ("slow1", "cpu:1"), ("slow2", "cpu:1"))
COST = re.compile(r"^rescale cost( in place)? ([0-9.]+) s")


def spec(name: str, steps: int, ests: int = 4, min_devices: int = 1) -> C.JobSpec:
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module=CNN, config_json=json.dumps(CONFIG)),
        num_ests=ests,
        global_batch_size=4 * ests,
        total_steps=steps,
        dataset=C.DatasetSpec(name="digits", size=1797, shard_size=16, seed=7),
        elastic=C.ElasticBounds(min_devices=min_devices, max_devices=ests),
        checkpoint_every_steps=50,
    )


# -- 1. checkpoint + restore in one process ---------------------------------------------


def checkpoint_and_restore(folder: Path, repeats: int) -> tuple[float, float, int]:
    """(median save seconds, median restore seconds, checkpoint bytes) of the digits CNN."""
    from gearshift.worker.runtime import checkpoint, determinism
    from gearshift.worker.runtime.job import load_job
    from gearshift.worker.runtime.process import seed_globals
    from gearshift.worker.runtime.settings import Determinism, RunSettings, placement
    from gearshift.worker.runtime.trainer import Trainer

    determinism.apply(Determinism.D1, 1, 1)
    settings = RunSettings(num_ests=4, global_batch_size=16, total_steps=20, seed=7, shard_size=16)

    def trainer(resume: bool) -> Trainer:
        seed_globals(settings.seed)
        job = load_job(CNN, dict(CONFIG))
        ref = {"module": CNN, "config": CONFIG}
        return Trainer(job, settings, placement((4,)), 0, folder, job_ref=ref, resume=resume)

    first = trainer(False)
    first.run()  # 20 steps: momentum buffers and every EST's state are real
    saves, restores = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        path = first.save_checkpoint()
        saves.append(time.perf_counter() - began)
        assert path is not None
        began = time.perf_counter()
        trainer(True)
        with_restore = time.perf_counter() - began
        began = time.perf_counter()
        trainer(False)
        restores.append(max(with_restore - (time.perf_counter() - began), 0.0))
    latest = checkpoint.latest(folder)
    size = latest.stat().st_size if latest else 0
    return statistics.median(saves), statistics.median(restores), size


# -- 2. rescales through the scheduler -------------------------------------------------


def scheduler_config(path: str, clear_seconds: float) -> dict[str, Any]:
    """The scheduler file's keys for one path (the module docstring says why these)."""
    stragglers = {"margin": 0.5, "reports": 3, "clearSeconds": clear_seconds}
    return {
        "round": {
            "rescaleInPlace": path == "in_place",
            "maxStarts": 0,
            "maxMoves": 0,
            "preemptExemptSeconds": 0,
            "eventRounds": "always",
            "decisionProcess": False,
        },
        "estimates": {"restartSeconds": 0},
        "heartbeats": {"relays": 0},
        "limits": {"stopTimeoutSeconds": 30},
        "profile": {
            "allocate": {"name": "easyscale"},
            "collocate": {"name": "none"},
            "stragglers": {"args": stragglers},
        },
    }


def new_cluster(
    root: Path,
    redis_url: str,
    workers: Sequence[tuple[str, str]],
    scheduler: Mapping[str, Any],
    flags: Mapping[str, Sequence[str]] | None = None,
) -> DevCluster:
    cluster = DevCluster(
        ClusterConfig(
            run_dir=root, base_port=0, workers=workers, redis_url=redis_url, round_seconds=1.0,
            heartbeat_interval=0.5, heartbeat_timeout=10.0, report_interval=0.5, metrics=False,
            flags=flags or {}, scheduler=scheduler,
        )
    )  # fmt: skip
    cluster.start(timeout=120)
    return cluster


def _wait(what: str, check: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def measured(job: S.Job) -> int:
    """Rescales of the running job whose first step the scheduler has measured."""
    return job.rescale_cost.count + job.in_place_rescale_cost.count


def settled(client: Client, job_id: str, rescales: int, steps: int = 0) -> Callable[[], bool]:
    """The job runs, after at least `rescales` rescales, each measured, at step >= `steps`."""

    def check() -> bool:
        job = client.get(job_id)
        if job.state in (C.JOB_STATE_SUCCEEDED, C.JOB_STATE_FAILED, C.JOB_STATE_CANCELLED):
            raise RuntimeError(f"{job_id} ended ({job.message}) before {rescales} rescales")
        return (
            job.state == C.JOB_STATE_RUNNING
            and job.rescale_count >= rescales
            and measured(job) >= job.rescale_count
            and job.progress.step >= steps
        )

    return check


def resized_run(client: Client, steps: int, cycles: int, gap: int) -> S.Job:
    """The 4-EST job shrunk by a newcomer and grown back as it is cancelled, `cycles` times,
    `gap` steps between two rescales."""
    job_id = client.submit(spec("resized", steps)).job_id
    _wait("the job trains on 4 devices", settled(client, job_id, 0, gap))
    for cycle in range(cycles):
        done = client.get(job_id).rescale_count
        newcomer = client.submit(spec(f"newcomer-{cycle}", 10**6, ests=1)).job_id
        at = client.get(job_id).progress.step + gap
        _wait(f"shrink {cycle + 1}", settled(client, job_id, done + 1, at))
        client.cancel(newcomer, "leaving")
        at = client.get(job_id).progress.step + gap
        _wait(f"grow {cycle + 1}", settled(client, job_id, done + 2, at))
    return client.wait(job_id, timeout=TIMEOUT_S)


def moving_run(client: Client, steps: int) -> S.Job:
    """The 2-EST job on the fast and a slow worker, moved between the slow ones until it
    ends."""
    job_id = client.submit(spec("moving", steps, ests=2, min_devices=2)).job_id
    return client.wait(job_id, timeout=TIMEOUT_S)


def rescales(events: Sequence[S.JobEvent]) -> list[tuple[str, str, float]]:
    """(kind, path, seconds) of each measured rescale: the kind from the placements before
    and after the RESCALED event, the path and the seconds from the cost the scheduler said."""
    out: list[tuple[str, str, float]] = []
    placement: C.Placement | None = None
    kind = ""
    for event in events:
        if event.type == S.JOB_EVENT_TYPE_STARTED and event.placement.processes:
            placement = event.placement
        elif event.type == S.JOB_EVENT_TYPE_RESCALED and placement is not None:
            kind = kind_of(placement, event.placement)
            placement = event.placement
        elif event.type == S.JOB_EVENT_TYPE_PROGRESS and (cost := COST.match(event.message)):
            if kind:
                out.append((kind, "in_place" if cost.group(1) else "restart", float(cost[2])))
            kind = ""
    return out


def kind_of(old: C.Placement, new: C.Placement) -> str:
    """grow, shrink, or move (as many processes, on other devices)."""
    before, after = len(old.processes), len(new.processes)
    return "grow" if after > before else "shrink" if after < before else "move"


def keep_events(folder: Path, client: Client, job_id: str) -> None:
    """The job's events, a line each, beside its cluster's logs (for --keep)."""
    lines = [
        f"{e.time:.3f} {S.JobEventType.Name(e.type)[15:]} {len(e.placement.processes)} {e.message}"
        for e in client.events(job_id)
    ]
    (folder / f"events-{job_id}.txt").write_text("\n".join(lines) + "\n")


def throughput(client: Client, job: S.Job) -> float:
    events = client.events(job.job_id)
    start = next(e.time for e in events if e.type == S.JOB_EVENT_TYPE_STARTED)
    end = next(e.time for e in events if e.type == S.JOB_EVENT_TYPE_SUCCEEDED)
    return job.spec.total_steps / (end - start)


def fixed_digest(folder: Path, job: C.JobSpec, procs: int) -> str:
    """The digest of `job` on `procs` processes started directly (no daemons)."""
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json_format.MessageToJson(job))
    command = [sys.executable, "-m", "gearshift.worker.run", "--spec", str(folder / "spec.json")]
    command += ["--procs", str(procs), "--checkpoint-dir", str(folder / "ckpt")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    return str(re.findall(r"^digest sha256:([0-9a-f]{64})$", run.stdout, re.MULTILINE)[-1])


def one_path(root: Path, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both runs of one path, each on a cluster of its own: the rescales, throughputs and
    digests."""
    config = scheduler_config(path, args.clear_seconds)
    out: dict[str, Any] = {"rescales": [], "digests": {}}
    cluster = new_cluster(root / "resize", args.redis_url, RESIZE_WORKERS, config)
    try:
        with Client(cluster.address("scheduler")) as client:
            resized = resized_run(client, args.steps, args.cycles, args.gap)
            assert resized.state == C.JOB_STATE_SUCCEEDED, resized.message
            out["rescales"] += rescales(client.events(resized.job_id))
            keep_events(root / "resize", client, resized.job_id)
            fixed = client.wait(client.submit(spec("fixed", args.steps)).job_id, TIMEOUT_S)
            assert fixed.state == C.JOB_STATE_SUCCEEDED, fixed.message
            out["steps_per_s"] = {
                "rescaled": throughput(client, resized),
                "fixed": throughput(client, fixed),
            }
            out["rescale_count"] = resized.rescale_count
            out["digests"]["resized"] = (resized.final_digest, fixed.final_digest)
    finally:
        cluster.stop()
    if args.move_steps <= 0:
        return out
    slow = ["--step-delay", str(args.step_delay)]
    flags = {"slow1": slow, "slow2": slow}
    cluster = new_cluster(root / "move", args.redis_url, MOVE_WORKERS, config, flags)
    try:
        with Client(cluster.address("scheduler")) as client:
            moving = moving_run(client, args.move_steps)
            assert moving.state == C.JOB_STATE_SUCCEEDED, moving.message
            out["rescales"] += rescales(client.events(moving.job_id))
            keep_events(root / "move", client, moving.job_id)
            out["digests"]["moving"] = moving.final_digest
    finally:
        cluster.stop()
    return out


def figures(runs: Mapping[str, dict[str, Any]], moving_fixed: str) -> dict[str, Any]:
    """One document: per kind and path the cost's median, max and count; throughputs;
    whether every digest equals its fixed run's."""
    out: dict[str, Any] = {kind: {} for kind in KINDS}
    for kind in KINDS:
        for path in PATHS:
            values = [
                s for run in runs.values() for k, p, s in run["rescales"] if (k, p) == (kind, path)
            ]
            if values:
                out[kind][path] = summary(values)
    out["throughput"] = {
        path: {
            "rescales": run["rescale_count"],
            "rescaled_steps_per_s": run["steps_per_s"]["rescaled"],
            "fixed_steps_per_s": run["steps_per_s"]["fixed"],
            "ratio": run["steps_per_s"]["rescaled"] / run["steps_per_s"]["fixed"],
        }
        for path, run in runs.items()
    }
    fixed = {run["digests"]["resized"][1] for run in runs.values()}  # one digest, not per path
    pairs = [run["digests"]["resized"] for run in runs.values()]
    pairs += [(run["digests"]["moving"], moving_fixed) for run in runs.values() if moving_fixed]
    out["digests_equal"] = len(fixed) == 1 and all(a == b for a, b in pairs)
    out["digest"] = fixed.pop()
    return out


def report(doc: Mapping[str, Any], steps: int) -> None:
    print(
        "\nrescale cost, decision (in place: the later of it and the pause) -> first step on "
        "the new placement (the scheduler's figure):"
    )
    print(f"  {'kind':<8}{'path':<10}{'median s':>10}{'max s':>10}{'n':>4}")
    for kind in KINDS:
        for path, row in doc[kind].items():
            print(
                f"  {kind:<8}{path:<10}{row['median_s']:>10.2f}{row['max_s']:>10.2f}{row['n']:>4}"
            )
    print(f"\nthroughput, {steps} steps, STARTED to SUCCEEDED:")
    for path, row in doc["throughput"].items():
        print(
            f"  {path:<9} rescaled {row['rescales']:3d} times {row['rescaled_steps_per_s']:6.2f}"
            f" steps/s, not rescaled {row['fixed_steps_per_s']:6.2f}, ratio {row['ratio']:5.3f}"
        )
    print(f"digests equal to the fixed runs': {doc['digests_equal']} ({doc['digest'][:16]}...)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2500, help="global steps of the 4-EST job")
    parser.add_argument("--cycles", type=int, default=10, help="shrinks (and grows) per path")
    parser.add_argument("--gap", type=int, default=20, help="steps between two rescales")
    parser.add_argument(
        "--move-steps", type=int, default=600, help="steps of the moving job (0: no moves)"
    )
    parser.add_argument("--step-delay", type=float, default=0.05, help="slow workers, s a step")
    parser.add_argument("--clear-seconds", type=float, default=1.0, help="degraded mark, s")
    parser.add_argument("--repeats", type=int, default=5, help="checkpoint + restore repeats")
    parser.add_argument("--json", action="store_true", help="print one JSON document only")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (logs, events)")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("GEARSHIFT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gearshift-rescale-") as tmp:
        root = args.keep or Path(tmp)
        save, restore, size = checkpoint_and_restore(root / "inproc", args.repeats)
        runs = {path: one_path(root / path, path, args) for path in PATHS}
        moving_fixed = ""
        if args.move_steps > 0:
            moving_fixed = fixed_digest(root / "fixed-2", spec("fixed", args.move_steps, 2, 2), 2)
    doc = figures(runs, moving_fixed)
    doc["checkpoint"] = {"save_s": save, "restore_s": restore, "bytes": size}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print("digits CNN, CPU")
        print(f"checkpoint (save, fsync, rename): {save * 1e3:8.1f} ms  ({size / 1024:.0f} KiB)")
        print(f"restore (load into the trainer):  {restore * 1e3:8.1f} ms")
        print(f"checkpoint + restore:             {(save + restore) * 1e3:8.1f} ms  (target < 5 s)")
        report(doc, args.steps)
    return 0 if doc["digests_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
