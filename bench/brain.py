"""Brain benchmarks, measured side by side in one run on the same PostgreSQL.

1. Ingest: samples per second in batches of 100 into PostgreSQL, through the
   Brain (its ReportSamples RPC on a daemon process, and its storage layer
   in-process) against a raw psycopg2 `executemany` of the same rows into the
   same table (and, for reference, psycopg2's one-statement `execute_values`),
   one transaction per batch each. Rounds alternate between the
   three so that load on the shared machine hits them alike. Target: the Brain
   >= 0.5x raw.
2. Estimate latency: EstimateThroughput over gRPC with 10,000 ended jobs of
   history (plus the Gavel references), p50/p99 overall and per source.
   Target: p99 < 20 ms.

Usage: python bench/brain.py [--postgres-url URL] [--jobs 10000] [--batches 100]
(default URL: $GEARSHIFT_BENCH_POSTGRES_URL, else $GEARSHIFT_TEST_POSTGRES_URL).
A fresh database is created for the run and dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg2.extras
import sqlalchemy as sa

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shared import shared_data
from gearshift.brain import models
from gearshift.brain.convert import sample_message
from gearshift.brain.records import EventKind, JobEvent, JobKeys, Sample
from gearshift.brain.storage import SqlBrainStore
from gearshift.client.processes import start_daemon
from gearshift.common.channel import connect
from gearshift.common.db import create_engine, migrate, scratch_database
from gearshift.v1 import brain_pb2, brain_pb2_grpc

BATCH = 100
TYPES = ("v100", "p100", "k80")
COUNTS = (1, 2, 4, 8)
COLUMNS = (
    "job_id",
    "node_id",
    "time",
    "step",
    "steps_per_second",
    "samples_per_second",
    "cpu_cores_used",
    "memory_bytes_used",
    "accelerator_type",
    "device_count",
    "ests_per_device",
)


def _submit(store: SqlBrainStore, job_id: str, model: str, num_ests: int = 4) -> None:
    keys = JobKeys("bench", model, "data", num_ests, {"name": job_id})
    store.record_event(JobEvent(f"{job_id}-s", job_id, EventKind.SUBMITTED, time.time(), keys))


def _rows(job_id: str, batch: int) -> list[Sample]:
    base = batch * BATCH
    return [
        Sample(
            time=1e9 + base + i,
            step=base + i,
            steps_per_second=5.0 + (i % 7) * 0.1,
            accelerator_type="v100",
            device_count=2,
            node_id="worker-0",
            samples_per_second=160.0,
            cpu_cores_used=3.5,
            memory_bytes_used=2**30,
            ests_per_device=(2, 2),
        )
        for i in range(BATCH)
    ]


def _row_tuple(job_id: str, s: Sample) -> tuple[object, ...]:
    """A sample as the raw baselines insert it, in COLUMNS order."""
    return (
        job_id,
        s.node_id,
        s.time,
        s.step,
        s.steps_per_second,
        s.samples_per_second,
        s.cpu_cores_used,
        s.memory_bytes_used,
        s.accelerator_type,
        s.device_count,
        json.dumps(list(s.ests_per_device)),
    )


def _message(job_id: str, batch_id: str, rows: list[Sample]) -> brain_pb2.ReportSamplesRequest:
    return brain_pb2.ReportSamplesRequest(
        batch_id=batch_id,
        job_id=job_id,
        samples=[sample_message(s) for s in rows],
    )


def bench_ingest(url: str, stub: brain_pb2_grpc.BrainStub, batches: int, rounds: int) -> None:
    engine = create_engine(url)
    store = SqlBrainStore(engine)
    for job in ("raw", "values", "store", "rpc"):
        _submit(store, f"ingest-{job}", "ingest")
    raw = engine.raw_connection()
    insert = (
        f"INSERT INTO brain_samples ({', '.join(COLUMNS)}) "
        f"VALUES ({', '.join(['%s'] * len(COLUMNS))})"
    )

    def raw_batch(number: int) -> None:
        cursor = raw.cursor()
        cursor.executemany(
            insert,
            [_row_tuple("ingest-raw", s) for s in _rows("ingest-raw", number)],
        )
        raw.commit()
        cursor.close()

    def values_batch(number: int) -> None:
        cursor = raw.cursor()
        psycopg2.extras.execute_values(
            cursor,
            f"INSERT INTO brain_samples ({', '.join(COLUMNS)}) VALUES %s",
            [_row_tuple("ingest-values", s) for s in _rows("ingest-values", number)],
            page_size=BATCH,
        )
        raw.commit()
        cursor.close()

    def store_batch(number: int) -> None:
        store.add_samples(f"store-{number}", "ingest-store", _rows("ingest-store", number), 0.0)

    messages = {
        n: _message("ingest-rpc", f"rpc-{n}", _rows("", n)) for n in range(batches * rounds + 2)
    }

    def rpc_batch(number: int) -> None:
        stub.ReportSamples(messages[number])

    ways: dict[str, Callable[[int], None]] = {
        "raw executemany": raw_batch,
        "raw execute_values": values_batch,
        "Brain storage layer": store_batch,
        "Brain ReportSamples RPC": rpc_batch,
    }
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():  # warm up every path (connections, caches)
        way(batches * rounds + 1)
    for r in range(rounds):
        for name, way in ways.items():
            started = time.perf_counter()
            for n in range(r * batches, (r + 1) * batches):
                way(n)
            rates[name].append(batches * BATCH / (time.perf_counter() - started))
    raw.close()
    with engine.connect() as conn:
        query = sa.select(models.samples.c.job_id, sa.func.count()).group_by(
            models.samples.c.job_id
        )
        counts: dict[str, int] = {row[0]: int(row[1]) for row in conn.execute(query)}
    engine.dispose()
    expected = (batches * rounds + 1) * BATCH
    paths = ("raw", "values", "store", "rpc")
    assert all(counts[f"ingest-{j}"] == expected for j in paths), counts
    baseline = statistics.median(rates["raw executemany"])
    print(
        f"\nIngest into PostgreSQL, batches of {BATCH}, {rounds} rounds x {batches} batches "
        f"per path (median samples/s; ratio to raw):"
    )
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"  {name:26s} {median:10,.0f} samples/s   {median / baseline:5.2f}x")


def populate_history(url: str, jobs: int, samples_per_job: int, seed: int = 1) -> list[str]:
    """Bulk-insert `jobs` ended jobs over 50 model types, each with samples on one column and
    the per-job summary the Brain writes when a job ends. Returns the model types."""
    rng = random.Random(seed)
    model_types = [f"model-{i:02d}" for i in range(50)]
    engine = create_engine(url)
    now = time.time()
    job_rows, sample_rows, summary_rows = [], [], []
    for j in range(jobs):
        job_id = f"hist-{j:05d}"
        model = model_types[j % len(model_types)]
        kind, count = rng.choice(TYPES), rng.choice(COUNTS)
        rate = (10 + j % 50) * count**0.8 * {"v100": 3, "p100": 2, "k80": 1}[kind]
        job_rows.append(
            {
                "job_id": job_id,
                "tenant": "bench",
                "model_type": model,
                "dataset_name": "data",
                "num_ests": 8,
                "spec": {"name": job_id},
                "status": "succeeded",
                "submitted_at": now - jobs + j,
                "started_at": now - jobs + j,
                "finished_at": now - jobs + j + 0.5,
                "exit_reason": "succeeded",
            }
        )
        for i in range(samples_per_job):
            sample_rows.append(
                {
                    "job_id": job_id,
                    "node_id": "",
                    "time": now - jobs + j + i * 1e-3,
                    "step": i,
                    "steps_per_second": rate * rng.uniform(0.95, 1.05),
                    "samples_per_second": 0.0,
                    "cpu_cores_used": 1.0,
                    "memory_bytes_used": 2**30,
                    "accelerator_type": kind,
                    "device_count": count,
                    "ests_per_device": [],
                }
            )
        summary_rows.append(
            {
                "job_id": job_id,
                "accelerator_type": kind,
                "device_count": count,
                "model_type": model,
                "steps_per_second": rate,
                "minibatches_per_second": rate * 8 / count,
                "sample_count": samples_per_job,
                "finished_at": now - jobs + j + 0.5,
            }
        )
    with engine.begin() as conn:
        conn.execute(models.jobs.insert(), job_rows)
        for start in range(0, len(sample_rows), 20_000):
            conn.execute(models.samples.insert(), sample_rows[start : start + 20_000])
        conn.execute(models.job_throughputs.insert(), summary_rows)
        conn.execute(sa.text("ANALYZE"))
    engine.dispose()
    return model_types


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_estimates(
    stub: brain_pb2_grpc.BrainStub, model_types: list[str], jobs: int, calls: int
) -> None:
    rng = random.Random(2)
    sources = {v: k for k, v in brain_pb2.EstimateSource.items()}
    requests = []
    for _ in range(calls):
        pick = rng.random()
        if pick < 0.4:  # a known job: its own samples, or completion for other columns
            request = brain_pb2.EstimateThroughputRequest(
                job_id=f"hist-{rng.randrange(jobs):05d}",
                accelerator_type=rng.choice(TYPES),
                device_count=rng.choice(COUNTS),
            )
        elif pick < 0.8:  # a new job of a known model type: history
            request = brain_pb2.EstimateThroughputRequest(
                model_type=rng.choice(model_types),
                accelerator_type=rng.choice(TYPES),
                device_count=rng.choice(COUNTS),
            )
        elif pick < 0.95:  # a Gavel reference model on a column it was not measured at
            request = brain_pb2.EstimateThroughputRequest(
                model_type="a3c",
                accelerator_type=rng.choice(TYPES),
                device_count=rng.choice((2, 4)),
            )
        else:  # nothing known
            request = brain_pb2.EstimateThroughputRequest(
                model_type="never-seen", accelerator_type="t4", device_count=1
            )
        requests.append(request)
    for request in requests[:50]:  # warm up
        stub.EstimateThroughput(request)
    latencies: dict[str, list[float]] = {}
    every: list[float] = []
    for request in requests:
        started = time.perf_counter()
        reply = stub.EstimateThroughput(request)
        ms = (time.perf_counter() - started) * 1e3
        every.append(ms)
        latencies.setdefault(sources[reply.source], []).append(ms)
    print(
        f"\nEstimateThroughput over gRPC, {jobs:,} ended jobs of history, {calls:,} calls "
        f"(ms; target p99 < 20):"
    )
    print(
        f"  {'all':36s} p50 {_pct(every, 0.5):6.2f}  p99 {_pct(every, 0.99):6.2f}  n={len(every)}"
    )
    for name, values in sorted(latencies.items()):
        print(
            f"  {name:36s} p50 {_pct(values, 0.5):6.2f}  p99 {_pct(values, 0.99):6.2f}  "
            f"n={len(values)}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("GEARSHIFT_BENCH_POSTGRES_URL")
        or os.environ.get("GEARSHIFT_TEST_POSTGRES_URL", ""),
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--samples-per-job", type=int, default=20)
    parser.add_argument("--batches", type=int, default=100, help="batches per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument(
        "--references", default=str(shared_data("gavel") / "simulation_throughputs.json")
    )
    args = parser.parse_args(argv)
    if not args.postgres_url:
        parser.error("give --postgres-url or set GEARSHIFT_BENCH_POSTGRES_URL")
    with (
        scratch_database(args.postgres_url, "gs_bench_brain") as url,
        tempfile.TemporaryDirectory() as run,
    ):
        migrate(url)
        started = time.perf_counter()
        model_types = populate_history(url, args.jobs, args.samples_per_job)
        print(
            f"history: {args.jobs:,} jobs, {args.jobs * args.samples_per_job:,} samples "
            f"inserted in {time.perf_counter() - started:.1f} s"
        )
        daemon = start_daemon(
            "brain",
            ["--database-url", url, "--reference-throughputs", args.references],
            run_dir=Path(run),
        )
        try:
            daemon.wait_ready(60)
            with connect(daemon.address, retry=False) as channel:
                stub = brain_pb2_grpc.BrainStub(channel)
                # Let the reference calibration (a background thread) finish first.
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and "calibrated" not in daemon.log_tail(200):
                    time.sleep(0.2)
                bench_ingest(url, stub, args.batches, args.rounds)
                bench_estimates(stub, model_types, args.jobs, args.calls)
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
