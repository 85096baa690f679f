"""Shard manager throughput: acquire+ack round trips per second, through gRPC and against Redis.

    python -m bench.shards [--redis-url URL] [--seconds 3] [--clients 1,4,8]

One run starts a shard-manager daemon (a real process) on the given Redis,
then, for each number of concurrent clients (each a separate process), runs
the same loop four ways, side by side:

  redis  2 calls   ShardStore.acquire then ShardStore.ack, straight to Redis (the baseline)
  redis  1 call    ShardStore.acquire carrying the previous shard's ack
  grpc   2 RPCs    AcquireShard then AckShard through the daemon (ShardConsumer.acquire/ack)
  grpc   1 RPC     AcquireShard carrying the ack (iterating a ShardConsumer)

and prints round trips (one shard acquired and acknowledged) per second and
the gRPC / Redis ratio. It also counts the Redis commands each transition
sends (a counting client in this process): the design's bound is 2.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_REDIS = os.environ.get("GEARSHIFT_REDIS_URL", "redis://127.0.0.1:6379/0")
VARIANTS = ("redis-2", "redis-1", "grpc-2", "grpc-1")


def _loop(variant: str, target: str, dataset: str, holder: str) -> Callable[[], int]:
    """A function that runs one acquire+ack round trip and returns 1."""
    if variant.startswith("redis"):
        from gearshift.shardmanager.store import ShardStore

        store = ShardStore.from_url(target)
        last: list[Any] = [None]

        def redis_separate() -> int:
            result = store.acquire(dataset, holder, uuid.uuid4().hex)
            assert result.shard is not None
            store.ack(dataset, holder, result.shard.epoch, result.shard.shard_id)
            return 1

        def redis_combined() -> int:
            prev = last[0]
            ack = None if prev is None else (prev.epoch, prev.shard_id)
            result = store.acquire(dataset, holder, uuid.uuid4().hex, ack)
            last[0] = result.shard
            return 1

        return redis_separate if variant == "redis-2" else redis_combined

    from gearshift.worker.shard_client import ShardClient

    consumer = ShardClient(target).consumer(dataset, holder, renew=False)
    if variant == "grpc-2":

        def grpc_separate() -> int:
            shard = consumer.acquire()
            assert shard is not None
            consumer.ack(shard)
            return 1

        return grpc_separate
    shards = iter(consumer)
    return lambda: (next(shards), 1)[1]


def _client(
    variant: str, target: str, dataset: str, holder: str, seconds: float, start: Any, out: Any
) -> None:
    step = _loop(variant, target, dataset, holder)
    step()  # connect and warm up before the clock starts
    start.wait()
    count = 0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        count += step()
    out.put(count)


def measure(
    variant: str, clients: int, target: str, dataset: str, seconds: float
) -> float:  # round trips per second
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_client, args=(variant, target, dataset, f"h{i}", seconds, start, out))
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0 + 0.25 * clients)  # let every client connect and warm up
    start.set()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return total / seconds


def count_round_trips(redis_url: str) -> dict[str, float]:
    """Redis commands sent per transition, with a client that counts what it sends."""
    import redis

    from gearshift.shardmanager.model import DatasetSettings, Mode
    from gearshift.shardmanager.store import ShardStore

    class Counting(redis.Redis):
        sent = 0

        def execute_command(self, *args: Any, **options: Any) -> Any:
            Counting.sent += 1
            return super().execute_command(*args, **options)

    store = ShardStore(Counting.from_url(redis_url))
    store.load_scripts()  # as the daemon does at start: steady state is one EVALSHA per call
    dataset = f"bench-rt-{uuid.uuid4().hex[:8]}"
    settings = DatasetSettings("bench", size=40, shard_size=10, seed=1, num_epochs=3,
                               mode=Mode.DYNAMIC)  # fmt: skip
    counts: dict[str, float] = {}

    def trips(name: str, action: Callable[[], Any], repeat: int = 1) -> Any:
        before = Counting.sent
        result = None
        for _ in range(repeat):
            result = action()
        counts[name] = (Counting.sent - before) / repeat
        return result

    trips("create", lambda: store.create(dataset, settings))
    first = trips("acquire", lambda: store.acquire(dataset, "a", "r1")).shard
    trips("ack", lambda: store.ack(dataset, "a", 0, first.shard_id))
    second = store.acquire(dataset, "a", "r2").shard
    trips("acquire+ack", lambda: store.acquire(dataset, "a", "r3", (0, second.shard_id)))
    trips("renew", lambda: store.renew(dataset, "a"))
    trips("checkpoint", lambda: store.checkpoint(dataset, "c0"))
    trips("release holder", lambda: store.release(dataset, "a"))
    for i in range(2):  # the requeued shard and the last one: epoch 0 is then over
        shard = store.acquire(dataset, "b", f"d{i}").shard
        store.ack(dataset, "b", 0, shard.shard_id)
    rolled = trips("acquire at an epoch change", lambda: store.acquire(dataset, "b", "r4"))
    assert rolled.epoch == 1, rolled
    trips("restore (other epoch)", lambda: store.restore(dataset, "c0", force=True))
    trips("describe", lambda: store.describe(dataset))
    store.delete(dataset)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    parser.add_argument("--clients", default="1,4,8", help="comma-separated client counts")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]

    from gearshift.client.processes import start_daemon
    from gearshift.worker.shard_client import ShardClient

    print(
        f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}, redis: {args.redis_url}"
    )
    print("\nRedis commands per transition (bound: 2)")
    for name, value in count_round_trips(args.redis_url).items():
        print(f"  {name:28s} {value:g}")

    run_dir = Path(tempfile.mkdtemp(prefix="gearshift-bench-"))
    daemon = start_daemon(
        "shardmanager",
        ["--redis-url", args.redis_url, "--log-level", "warning", "--deleted-ttl-seconds", "0"],
        run_dir=run_dir,
    )
    daemon.wait_ready(60)
    try:
        admin = ShardClient(daemon.address)
        results: dict[tuple[str, int], float] = {}
        for n in clients:
            for variant in VARIANTS:
                dataset = f"bench-{variant}-{n}-{uuid.uuid4().hex[:6]}"
                admin.create_dataset(dataset, job_id="bench", size=500_000, shard_size=1,
                                     num_epochs=100, mode="dynamic")  # fmt: skip
                target = args.redis_url if variant.startswith("redis") else daemon.address
                results[(variant, n)] = measure(variant, n, target, dataset, args.seconds)
                admin.delete_dataset(dataset)
        print(
            f"\nacquire+ack round trips per second ({args.seconds:g} s each, clients are processes)"
        )
        header = "clients  redis 2 calls  redis 1 call  grpc 2 RPCs  grpc 1 RPC  grpc2/redis2  grpc1/redis1"
        print(header)
        for n in clients:
            r2, r1, g2, g1 = (results[(v, n)] for v in VARIANTS)
            print(f"{n:7d}  {r2:12.0f}  {r1:12.0f}  {g2:11.0f}  {g1:10.0f}  "
                  f"{g2 / r2:12.2f}  {g1 / r1:12.2f}")  # fmt: skip
        admin.close()
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
