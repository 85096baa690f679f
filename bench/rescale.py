"""What rescaling costs the digits CNN job (4 ESTs, elastic 1..4) on a local cluster of real
daemons, CPU only; every figure measured in this run.

1. Rescale latency: from the scheduler's decision (the job's RESCALING event) to the first
   training step on the new devices (the step log's time of the first step the new
   placement runs), split at the moment the old processes had checkpointed and exited
   (CHECKPOINTED) and the new ones were spawned (RESCALED). Mean and max of 3 rescales,
   beside the scheduler's own measure of the same interval (Job.rescale_cost).
2. One checkpoint + restore inside a process: Trainer.save_checkpoint (written, synced,
   renamed) and loading it back into model, optimizer, LR scheduler and EST contexts;
   median of --repeats (target: checkpoint + restore under 5 s on CPU).
3. Throughput of a job rescaled 3 times (2 -> 4 devices as a worker joins, 4 -> 2 as a
   second job arrives, 2 -> 4 as it is cancelled) against the same job on 4 devices
   without a rescale: steps per second from its start to its end, and the ratio. Both
   must end with the same digest.

The Brain and the scheduler keep their state in SQLite files in a temporary folder; the
shard manager uses --redis-url (default: $GEARSHIFT_TEST_REDIS_URL or the local Redis).

    .venv/bin/python bench/rescale.py [--steps 300] [--redis-url URL] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gearshift.client.devcluster import ClusterConfig, DevCluster, parse_workers
from gearshift.client.sdk import Client
from gearshift.v1 import common_pb2, scheduler_pb2

CNN = "gearshift.examples.digits_cnn"
CONFIG = {"lr": 0.05}
C = common_pb2
S = scheduler_pb2
TIMEOUT_S = 600.0


def spec(name: str, steps: int, ests: int = 4) -> C.JobSpec:
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module=CNN, config_json=json.dumps(CONFIG)),
        num_ests=ests,
        global_batch_size=4 * ests,
        total_steps=steps,
        dataset=C.DatasetSpec(name="digits", size=1797, shard_size=16, seed=7),
        elastic=C.ElasticBounds(min_devices=1, max_devices=ests),
        checkpoint_every_steps=50,
    )


# -- 2. checkpoint + restore in one process ---------------------------------------------


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


# -- the cluster -------------------------------------------------------------------------


def step_log(cluster: DevCluster, job_id: str) -> list[dict[str, Any]]:
    """Rank 0's audit trail of the job: one line per step, with its time."""
    path = cluster.config.run_dir / "checkpoints" / job_id / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(what: str, check: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _events(client: Client, job_id: str) -> list[S.JobEvent]:
    return list(client.watch(job_id))


def _throughput(client: Client, job: S.Job) -> float:
    events = _events(client, job.job_id)
    start = next(e.time for e in events if e.type == S.JOB_EVENT_TYPE_STARTED)
    end = next(e.time for e in events if e.type == S.JOB_EVENT_TYPE_SUCCEEDED)
    return job.spec.total_steps / (end - start)


def rescaled_run(cluster: DevCluster, client: Client, steps: int) -> tuple[S.Job, list[float]]:
    """The job on worker-1 (2 devices); worker-2 joins; a second job comes and is cancelled."""
    job_id = client.submit(spec("rescaled", steps)).job_id
    at = [steps // 5, 2 * steps // 5, 3 * steps // 5]

    def reached(step: int, rescales: int) -> Callable[[], bool]:
        def check() -> bool:
            job = client.get(job_id)
            return (
                job.progress.step >= step
                and job.rescale_count >= rescales
                and (job.state == C.JOB_STATE_RUNNING)
            )

        return check

    _wait("the job trains on w1", reached(at[0], 0))
    cluster.add_worker("cpu:2", timeout=120)  # rescale 1: 2 -> 4 devices
    _wait("the job grows", reached(at[1], 1))
    other = client.submit(spec("newcomer", 10**6, ests=1)).job_id  # rescale 2: 4 -> 2
    _wait("the job shrinks", reached(at[2], 2))
    client.cancel(other, "leaving")  # rescale 3: 2 -> 4
    job = client.wait(job_id, timeout=TIMEOUT_S)
    return job, _latencies(cluster, client, job_id)


def _latencies(cluster: DevCluster, client: Client, job_id: str) -> list[float]:
    """Per rescale: (decision -> exited, exited -> spawned, spawned -> first step) seconds."""
    events = _events(client, job_id)
    log = step_log(cluster, job_id)
    out: list[float] = []
    for i, event in enumerate(events):
        if event.type != S.JOB_EVENT_TYPE_RESCALING:
            continue
        after = events[i:]
        exited = next(e.time for e in after if e.type == S.JOB_EVENT_TYPE_CHECKPOINTED)
        spawned = next(e.time for e in after if e.type == S.JOB_EVENT_TYPE_RESCALED)
        first = next(line["time"] for line in log if line["time"] > exited)
        out += [exited - event.time, spawned - exited, first - spawned]
    return out


def scheduler_costs(client: Client, job_id: str) -> list[float]:
    """Each rescale's cost as the scheduler measured and said it ("rescale cost 1.23 s ...":
    an ended job's Job message no longer carries the figure, its events do)."""
    prefix = "rescale cost "
    return [
        float(e.message[len(prefix) :].split()[0])
        for e in _events(client, job_id)
        if e.type == S.JOB_EVENT_TYPE_PROGRESS and e.message.startswith(prefix)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="global steps of each job")
    parser.add_argument("--repeats", type=int, default=5, help="checkpoint + restore repeats")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("GEARSHIFT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gearshift-rescale-") as tmp:
        root = Path(tmp)
        save, restore, size = checkpoint_and_restore(root / "inproc", args.repeats)
        print("digits CNN, 4 ESTs, CPU")
        print(f"checkpoint (save, fsync, rename): {save * 1e3:8.1f} ms  ({size / 1024:.0f} KiB)")
        print(f"restore (load into the trainer):  {restore * 1e3:8.1f} ms")
        print(f"checkpoint + restore:             {(save + restore) * 1e3:8.1f} ms  (target < 5 s)")

        cluster = DevCluster(
            ClusterConfig(
                run_dir=root / "cluster", base_port=0, workers=parse_workers("cpu:2"),
                redis_url=args.redis_url, round_seconds=1.0, heartbeat_interval=0.5,
                heartbeat_timeout=10.0, report_interval=0.5,
            )
        )  # fmt: skip
        try:
            cluster.start(timeout=120)
            with Client(cluster.address("scheduler")) as client:
                rescaled, parts = rescaled_run(cluster, client, args.steps)
                measured = scheduler_costs(client, rescaled.job_id)
                assert rescaled.state == C.JOB_STATE_SUCCEEDED, rescaled.message
                base_id = client.submit(spec("fixed", args.steps)).job_id
                fixed = client.wait(base_id, timeout=TIMEOUT_S)
                assert fixed.state == C.JOB_STATE_SUCCEEDED, fixed.message
                with_rescales, without = _throughput(client, rescaled), _throughput(client, fixed)
        finally:
            cluster.stop()

    count = len(parts) // 3
    stop, spawn, first = parts[0::3], parts[1::3], parts[2::3]
    totals = [a + b + c for a, b, c in zip(stop, spawn, first, strict=True)]
    print(f"\nrescale latency over {count} rescales (decision -> first step on new devices):")
    rows = [
        ("decision -> old processes checkpointed and exited", stop),
        ("-> new processes spawned (StartTask returned)", spawn),
        ("-> first step (rendezvous, restore, first batch)", first),
    ]
    for label, values in rows:
        print(f"  {label:<50} mean {statistics.mean(values):5.2f} s")
    print(f"  total: mean {statistics.mean(totals):5.2f} s, max {max(totals):5.2f} s")
    if measured:  # what the scheduler measured itself, decision -> first step
        print(
            f"  the scheduler's own figures (its events): mean {statistics.mean(measured):5.2f} s"
            f", max {max(measured):5.2f} s over {len(measured)}"
        )
    print(f"\nthroughput, {args.steps} steps, start to end:")
    print(f"  {rescaled.rescale_count} rescales: {with_rescales:6.2f} steps/s")
    print(f"  no rescale:  {without:6.2f} steps/s")
    print(f"  ratio:       {with_rescales / without:6.3f}")
    same = rescaled.final_digest == fixed.final_digest
    print(f"  same digest: {same} ({fixed.final_digest[:16]}...)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
