"""Shard manager throughput: acquire+ack round trips per second, through gRPC and against Redis.

    python -m bench.shards [--redis-url URL] [--seconds 3] [--clients 1,4,8] [--variants ...]

One run starts shard-manager daemons (real processes) on the given Redis and,
for each number of concurrent clients (each client a separate process), runs
the same loop -- acquire a shard, acknowledge it -- six ways, side by side:

  redis 2 calls   ShardStore.acquire then ShardStore.ack, straight to Redis (the baseline)
  redis 1 call    ShardStore.acquire carrying the previous shard's ack
  grpc 2 RPCs     AcquireShard then AckShard through one daemon (the unary RPCs, called as
                  they are: consumers acquire over the stream)
  grpc 1 RPC      AcquireShard carrying the ack, one call per shard, one daemon
  grpc stream     the same request and answer per shard over one StreamShards stream per
                  client (iterating a ShardConsumer: the default), one daemon
  grpc stream x2  the same, clients spread over two daemon replicas

Every variant does the same work per round trip: one shard acquired and one
acknowledged, atomically in Redis (one Lua script for both; one each in the
"2" variants), and every gRPC variant crosses processes (client process ->
daemon -> Redis).

It prints round trips (one shard acquired and acknowledged) per second, the
gRPC / Redis ratios, the CPU time each round trip costs in the clients, the
daemons and Redis (Redis's figure includes anything else it serves), and how
much CPU the whole machine used during each measurement and how much of that
was other work, so that figures taken on a shared machine can be read. It also
counts the Redis commands each transition sends, with counting clients for
both stores (ShardStore over redis-py, AsyncShardStore as the daemon runs it):
the design's bound is 2.
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

    from gearshift.v1 import shardmanager_pb2 as pb
    from gearshift.worker.shard_client import ShardClient

    client = ShardClient(target)
    if variant in ("grpc-2", "grpc-1"):
        session = uuid.uuid4().hex[:12]
        calls = [0]
        held: list[Any] = [None]

        def grpc_unary() -> None:
            calls[0] += 1
            request = pb.AcquireShardRequest(
                dataset_id=dataset, holder_id=holder, request_id=f"{session}-{calls[0]}"
            )
            previous = held[0]
            if previous is not None:  # grpc-1: the previous shard's ack rides along
                request.ack.epoch, request.ack.shard_id = previous.epoch, previous.shard_id
            shard = client.call("AcquireShard", request).shard
            if variant == "grpc-1":
                held[0] = shard
                return
            ack = pb.AckShardRequest(
                dataset_id=dataset, holder_id=holder, epoch=shard.epoch, shard_id=shard.shard_id
            )
            client.call("AckShard", ack)

        return grpc_unary
    shards = iter(client.consumer(dataset, holder, renew=False))

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


def _machine_busy() -> float:
    """CPU seconds every process of the machine spent so far (all cores; /proc/stat, Linux)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass(frozen=True)
class Result:
    per_second: float
    client_cpu_us: float
    daemon_cpu_us: float
    redis_cpu_us: float
    busy_cores: float  # the whole machine's CPU use during the measurement
    other_cores: float  # of which not the clients, daemons or Redis (other work, the bench)


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
    busy, began = _machine_busy(), time.perf_counter()
    start.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    busy, elapsed = _machine_busy() - busy, time.perf_counter() - began
    daemon_cpu = sum(_process_cpu(pid) for pid in pids) - daemon_cpu
    redis_cpu = _redis_cpu(redis_client) - redis_cpu
    ours = sum(c for _, c in results) + daemon_cpu + redis_cpu
    for p in procs:
        p.join(timeout=30)
    count = sum(n for n, _ in results)
    per = 1e6 / max(count, 1)
    return Result(
        per_second=count / seconds,
        client_cpu_us=sum(c for _, c in results) * per,
        daemon_cpu_us=daemon_cpu * per,
        redis_cpu_us=redis_cpu * per,
        busy_cores=busy / elapsed,
        other_cores=max(busy - ours, 0.0) / elapsed,
    )


def count_round_trips(redis_url: str) -> dict[str, tuple[float, float]]:
    """Redis commands sent per transition by each store, with clients that count what they send:
    (ShardStore over redis-py, AsyncShardStore over pipelined connections -- the daemon's)."""
    import asyncio

    import redis

    from gearshift.shardmanager.redis_pipe import RedisPipe
    from gearshift.shardmanager.store import AsyncShardStore, ShardStore

    class Counting(redis.Redis):
        sent = 0

        def execute_command(self, *args: Any, **options: Any) -> Any:
            Counting.sent += 1
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    class CountingPipe(RedisPipe):
        sent = 0

        async def execute(self, *args: Any) -> Any:
            CountingPipe.sent += 1
            return await super().execute(*args)

    blocking = ShardStore(Counting.from_url(redis_url))
    blocking.load_scripts()  # as the daemon does at start: steady state is one EVALSHA per call
    counted = _transitions(lambda name, *a, **k: getattr(blocking, name)(*a, **k),
                           lambda: Counting.sent)  # fmt: skip
    blocking.close()
    loop = asyncio.new_event_loop()
    daemons = AsyncShardStore([CountingPipe(redis_url)])
    counted_async = _transitions(
        lambda name, *a, **k: loop.run_until_complete(getattr(daemons, name)(*a, **k)),
        lambda: CountingPipe.sent,
    )
    daemons.close()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    return {name: (value, counted_async[name]) for name, value in counted.items()}


def _transitions(run: Callable[..., Any], sent: Callable[[], int]) -> dict[str, float]:
    """Every kind of transition once, on a dataset of its own; `run(method, *args)` calls the
    store, `sent()` reads its command counter."""
    from gearshift.shardmanager.model import DatasetSettings, Mode

    dataset = f"bench-rt-{uuid.uuid4().hex[:8]}"
    settings = DatasetSettings("bench", size=40, shard_size=10, seed=1, num_epochs=3,
                               mode=Mode.DYNAMIC)  # fmt: skip
    counts: dict[str, float] = {}

    def trips(name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        before = sent()
        result = run(method, *args, **kwargs)
        counts[name] = sent() - before
        return result

    def granted(result: Any) -> int:
        assert result.shard is not None, result
        return int(result.shard.shard_id)

    trips("create", "create", dataset, settings)
    first = granted(trips("acquire", "acquire", dataset, "a", "r1"))
    trips("ack", "ack", dataset, "a", 0, first)
    second = granted(run("acquire", dataset, "a", "r2"))
    trips("acquire+ack", "acquire", dataset, "a", "r3", (0, second))
    trips("renew", "renew", dataset, "a")
    trips("checkpoint", "checkpoint", dataset, "c0")
    trips("release holder", "release", dataset, "a")
    for i in range(2):  # the requeued shard and the last one: epoch 0 is then over
        run("ack", dataset, "b", 0, granted(run("acquire", dataset, "b", f"d{i}")))
    rolled = trips("acquire at an epoch change", "acquire", dataset, "b", "r4")
    assert rolled.epoch == 1, rolled
    trips("restore (other epoch)", "restore", dataset, "c0", force=True)
    trips("describe", "describe", dataset)
    trips("delete", "delete", dataset)
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
    print("\nRedis commands per transition (bound: 2): ShardStore, AsyncShardStore (the daemon's)")
    for name, (by_blocking, by_async) in count_round_trips(args.redis_url).items():
        print(f"  {name:28s} {by_blocking:g} {by_async:5g}")

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
    print("\nmachine CPU in use during each measurement, cores: all (of which other work)")
    for n in clients:
        cells = [
            f"{label}: {results[(v, n)].busy_cores:.2f} ({results[(v, n)].other_cores:.2f})"
            for v, label in variants.items()
        ]
        print(f"{n:7d}  " + "; ".join(cells))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (other work shares these CPUs)")


if __name__ == "__main__":
    main()
