"""Shard manager throughput: acquire+ack round trips per second, through gRPC and against Redis.

    python -m bench.shards [--redis-url URL] [--seconds 3] [--clients 1,4,8] [--variants ...]

One run starts shard-manager daemons (real processes) on the given Redis and,
for each number of concurrent clients (each client a separate process), runs
the same loop -- acquire a shard, acknowledge it -- six ways, side by side:

  redis 2 calls   ShardStore.acquire then ShardStore.ack, straight to Redis (the baseline)
  redis 1 call    ShardStore.acquire carrying the previous shard's ack
  grpc 2 RPCs     AcquireShard then AckShard through one daemon (ShardConsumer(stream=False))
  grpc 1 RPC      AcquireShard carrying the ack, one call per shard, one daemon
  grpc stream     the same request and answer per shard over one StreamShards stream per
                  client (iterating a ShardConsumer: the default), one daemon
  grpc stream x2  the same, clients spread over two daemon replicas

Every variant does the same work per round trip: one shard acquired and one
acknowledged, each atomically in Redis (one Lua script), and every gRPC
variant crosses processes (client process -> daemon -> Redis).

It prints round trips (one shard acquired and acknowledged) per second, the
gRPC / Redis ratios, and the CPU time each round trip costs in the clients,
the daemons and Redis (Redis's figure includes anything else it serves), so
that figures taken on a shared machine can be read. It also counts the Redis
commands each transition sends (a counting client in this process): the
design's bound is 2.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_REDIS = os.environ.get("GEARSHIFT_REDIS_URL", "redis://127.0.0.1:6379/0")
VARIANTS = {
    "redis-2": "redis 2 calls",
    "redis-1": "redis 1 call",
    "grpc-2": "grpc 2 RPCs",
    "grpc-1": "grpc 1 RPC",
    "grpc-s": "grpc stream",
    "grpc-sx2": "grpc stream x2",
}


def _loop(variant: str, target: str, dataset: str, holder: str) -> Callable[[], None]:
    """A function that runs one acquire+ack round trip."""
    if variant.startswith("redis"):
        from gearshift.shardmanager.store import ShardStore

        store = ShardStore.from_url(target)
        last: list[Any] = [None]

        def redis_separate() -> None:
            result = store.acquire(dataset, holder, uuid.uuid4().hex)
            assert result.shard is not None
            store.ack(dataset, holder, result.shard.epoch, result.shard.shard_id)

        def redis_combined() -> None:
            prev = last[0]
            ack = None if prev is None else (prev.epoch, prev.shard_id)
            last[0] = store.acquire(dataset, holder, uuid.uuid4().hex, ack).shard

        return redis_separate if variant == "redis-2" else redis_combined

    from gearshift.worker.shard_client import ShardClient

    stream = variant.startswith("grpc-s")
    consumer = ShardClient(target).consumer(dataset, holder, renew=False, stream=stream)
    if variant == "grpc-2":

        def grpc_separate() -> None:
            shard = consumer.acquire()
            assert shard is not None
            consumer.ack(shard)

        return grpc_separate
    shards = iter(consumer)

    def grpc_combined() -> None:
        next(shards)

    return grpc_combined


@dataclass(frozen=True)
class Job:
    variant: str
    target: str
    dataset: str
    holder: str
    seconds: float


def _client(job: Job, start: Any, out: Any) -> None:
    step = _loop(job.variant, job.target, job.dataset, job.holder)
    step()  # connect and warm up before the clock starts
    start.wait()
    count = 0
    cpu = time.process_time()
    stop = time.perf_counter() + job.seconds
    while time.perf_counter() < stop:
        step()
        count += 1
    out.put((count, time.process_time() - cpu))


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass(frozen=True)
class Result:
    per_second: float
    client_cpu_us: float
    daemon_cpu_us: float
    redis_cpu_us: float


def measure(
    variant: str,
    targets: list[str],
    pids: list[int],
    dataset: str,
    *,
    clients: int,
    seconds: float,
    redis_client: Any,
) -> Result:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_client,
            args=(Job(variant, targets[i % len(targets)], dataset, f"h{i}", seconds), start, out),
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0 + 0.3 * clients)  # every client connects and warms up first
    daemon_cpu = sum(_process_cpu(pid) for pid in pids)
    redis_cpu = _redis_cpu(redis_client)
    start.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    daemon_cpu = sum(_process_cpu(pid) for pid in pids) - daemon_cpu
    redis_cpu = _redis_cpu(redis_client) - redis_cpu
    for p in procs:
        p.join(timeout=30)
    count = sum(n for n, _ in results)
    per = 1e6 / max(count, 1)
    return Result(
        per_second=count / seconds,
        client_cpu_us=sum(c for _, c in results) * per,
        daemon_cpu_us=daemon_cpu * per,
        redis_cpu_us=redis_cpu * per,
    )


def count_round_trips(redis_url: str) -> dict[str, float]:
    """Redis commands sent per transition, with a client that counts what it sends."""
    import redis

    from gearshift.shardmanager.model import DatasetSettings, Mode
    from gearshift.shardmanager.store import ShardStore

    class Counting(redis.Redis):
        sent = 0

        def execute_command(self, *args: Any, **options: Any) -> Any:
            Counting.sent += 1
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    store = ShardStore(Counting.from_url(redis_url))
    store.load_scripts()  # as the daemon does at start: steady state is one EVALSHA per call
    dataset = f"bench-rt-{uuid.uuid4().hex[:8]}"
    settings = DatasetSettings("bench", size=40, shard_size=10, seed=1, num_epochs=3,
                               mode=Mode.DYNAMIC)  # fmt: skip
    counts: dict[str, float] = {}

    def trips(name: str, action: Callable[[], Any]) -> Any:
        before = Counting.sent
        result = action()
        counts[name] = Counting.sent - before
        return result

    def granted(result: Any) -> int:
        assert result.shard is not None, result
        return int(result.shard.shard_id)

    trips("create", lambda: store.create(dataset, settings))
    first = granted(trips("acquire", lambda: store.acquire(dataset, "a", "r1")))
    trips("ack", lambda: store.ack(dataset, "a", 0, first))
    second = granted(store.acquire(dataset, "a", "r2"))
    trips("acquire+ack", lambda: store.acquire(dataset, "a", "r3", (0, second)))
    trips("renew", lambda: store.renew(dataset, "a"))
    trips("checkpoint", lambda: store.checkpoint(dataset, "c0"))
    trips("release holder", lambda: store.release(dataset, "a"))
    for i in range(2):  # the requeued shard and the last one: epoch 0 is then over
        store.ack(dataset, "b", 0, granted(store.acquire(dataset, "b", f"d{i}")))
    rolled = trips("acquire at an epoch change", lambda: store.acquire(dataset, "b", "r4"))
    assert rolled.epoch == 1, rolled
    trips("restore (other epoch)", lambda: store.restore(dataset, "c0", force=True))
    trips("describe", lambda: store.describe(dataset))
    trips("delete", lambda: store.delete(dataset))
    store.close()
    return counts


# Ratios printed: a gRPC variant against the Redis loop doing the same calls.
RATIOS = [("grpc-2", "redis-2"), ("grpc-1", "redis-1"), ("grpc-s", "redis-1")]


def _short(variant: str) -> str:
    return variant.replace("-", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    parser.add_argument("--clients", default="1,4,8", help="comma-separated client counts")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}"
    )
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    variants = {v: VARIANTS[v] for v in args.variants.split(",")}

    import redis

    from gearshift.client.processes import start_daemon
    from gearshift.worker.shard_client import ShardClient

    load = os.getloadavg()[0]
    print(f"cpus: {os.cpu_count()}, load average at start: {load:.2f}, redis: {args.redis_url}")
    print("\nRedis commands per transition (bound: 2)")
    for name, value in count_round_trips(args.redis_url).items():
        print(f"  {name:28s} {value:g}")

    run_dir = Path(tempfile.mkdtemp(prefix="gearshift-bench-"))
    flags = ["--redis-url", args.redis_url, "--log-level", "warning", "--deleted-ttl-seconds", "0"]
    daemons = [start_daemon("shardmanager", flags, run_dir=run_dir / f"sm{i}") for i in range(2)]
    redis_client = redis.Redis.from_url(args.redis_url)
    try:
        for daemon in daemons:
            daemon.wait_ready(60)
        addresses = [d.address for d in daemons]
        pids = [d.process.pid for d in daemons]
        admin = ShardClient(addresses[0])
        results: dict[tuple[str, int], Result] = {}
        for n in clients:
            for variant in variants:
                dataset = f"bench-{variant}-{n}-{uuid.uuid4().hex[:6]}"
                admin.create_dataset(dataset, job_id="bench", size=500_000, shard_size=1,
                                     num_epochs=100, mode="dynamic")  # fmt: skip
                if variant.startswith("redis"):
                    targets, used = [args.redis_url], []
                elif variant.endswith("x2"):
                    targets, used = addresses, pids
                else:
                    targets, used = addresses[:1], pids[:1]
                results[(variant, n)] = measure(
                    variant, targets, used, dataset,
                    clients=n, seconds=args.seconds, redis_client=redis_client,
                )  # fmt: skip
                admin.delete_dataset(dataset)
        admin.close()
    finally:
        for daemon in daemons:
            daemon.stop()
        redis_client.close()

    ratios = [(a, b) for a, b in RATIOS if a in variants and b in variants]
    print(f"\nacquire+ack round trips per second ({args.seconds:g} s each; clients are processes)")
    print("clients " + "".join(f"{label:>15s}" for label in variants.values())
          + "".join(f"{_short(a) + '/' + _short(b):>15s}" for a, b in ratios))  # fmt: skip
    for n in clients:
        row = [results[(v, n)].per_second for v in variants]
        quotients = [results[(a, n)].per_second / results[(b, n)].per_second for a, b in ratios]
        line = "".join(f"{x:15.0f}" for x in row) + "".join(f"{x:15.2f}" for x in quotients)
        print(f"{n:7d} {line}")
    print("\nCPU microseconds per round trip: clients + shard manager(s) + redis = total")
    for n in clients:
        cells = []
        for v, label in variants.items():
            r = results[(v, n)]
            total = r.client_cpu_us + r.daemon_cpu_us + r.redis_cpu_us
            cells.append(
                f"{label}: {r.client_cpu_us:.0f}+{r.daemon_cpu_us:.0f}"
                f"+{r.redis_cpu_us:.0f}={total:.0f}"
            )
        print(f"{n:7d}  " + "; ".join(cells))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (other work shares these CPUs)")


if __name__ == "__main__":
    main()
