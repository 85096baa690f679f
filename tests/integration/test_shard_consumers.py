"""Consumers as real processes, killed with SIGKILL mid-shard: no sample is lost or acked twice.

Each consumer is this module run as a program (`python -m
tests.integration.test_shard_consumers consume ...`): it reads a dynamic-mode
dataset through gearshift.worker.shard_client, "trains" on each shard for a
few milliseconds, and logs every grant (with the sample indices it was given)
and every acknowledgement to its own file, line by line.

The checks use both sides. From the logs: per epoch, every sample index was
acknowledged exactly once. A consumer killed between the server applying its
acknowledgement and its log line leaves a grant without an ack line; such a
shard counts as acknowledged by it exactly when ReleaseHolder did not give it
back (or, for lease expiry, when nobody else acknowledged it). From the
server: per epoch samples_done == size and shards_done == the shard count, so
a shard acknowledged twice would show, and the redeliveries it counts equal
the shards the killed consumers held.

Also here, for the other shard tests: a private redis-server (for tests that
kill Redis or count its commands) and helpers to read consumer logs.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gearshift.common.ports import free_port
from tests.conftest import DaemonFactory

REPO = Path(__file__).resolve().parents[2]


# -- a private Redis -----------------------------------------------------------


@dataclass
class RedisServer:
    """A redis-server process of our own, in its own folder (killable, restartable)."""

    folder: Path
    port: int = field(default_factory=free_port)
    appendonly: bool = False
    appendfsync: str = "always"
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> RedisServer:
        """Start (or restart, on the same port and files) and wait until it answers.

        A first start that finds its port taken (another test's server) moves
        to a new port; a restart must keep its port.
        """
        first = self.process is None
        for _ in range(5):
            if self._try_start(timeout):
                return self
            if not first:
                break
            self.port = free_port()
        log = (self.folder / "redis.log").read_text(errors="replace")
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log[-2000:]}")

    def _try_start(self, timeout: float) -> bool:
        import redis

        self.folder.mkdir(parents=True, exist_ok=True)
        command = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--logfile", str(self.folder / "redis.log"),
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while self.process.poll() is None and time.monotonic() < deadline:
                try:
                    # Ours, not another test's server that holds the port.
                    if client.info("server")["process_id"] == self.process.pid:
                        return True
                except redis.exceptions.BusyLoadingError:
                    pass
                except redis.ConnectionError:
                    pass
                time.sleep(0.05)
            self.kill()
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to write anything more."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def redis_servers(folder: Path) -> Iterator[Callable[..., RedisServer]]:
    """A factory of private redis-servers in `folder`, all killed when the generator ends."""
    started: list[RedisServer] = []

    def start(**kwargs: object) -> RedisServer:
        server = RedisServer(folder / f"redis-{len(started)}", **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start redis-server processes for one test: `private_redis(appendonly=True)`."""
    yield from redis_servers(tmp_path)


# -- the consumer program ----------------------------------------------------------


def consume(address: str, dataset: str, holder: str, log_path: str, work_seconds: float) -> None:
    """Read the dataset until its end, logging grants and acknowledgements (one line each)."""
    from gearshift.common.errors import PreconditionError
    from gearshift.worker.shard_client import ShardClient

    client = ShardClient(address, retry_seconds=120)
    consumer = client.consumer(dataset, holder)
    with open(log_path, "a", buffering=1) as out:
        previous = None
        while True:
            try:
                shard = consumer.acquire(ack=previous)
            except PreconditionError as exc:  # the previous shard was taken back
                assert previous is not None, exc
                out.write(f"L {previous.epoch} {previous.shard_id}\n")
                previous = None
                continue
            if previous is not None:
                out.write(f"A {previous.epoch} {previous.shard_id} {previous.attempt}\n")
            if shard is None:
                out.write("E\n")
                break
            indices = ",".join(map(str, shard.sample_indices()))
            out.write(f"G {shard.epoch} {shard.shard_id} {shard.attempt} {indices}\n")
            time.sleep(work_seconds)  # the training step on this shard
            previous = shard
    consumer.close(release=False)
    client.close()


@dataclass
class Consumer:
    holder: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def lines(self) -> list[str]:
        try:
            return self.log_path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def mid_shard(self) -> bool:
        """Running, and its last line is a grant: it holds a shard it has not acknowledged."""
        lines = self.lines()
        return self.process.poll() is None and bool(lines) and lines[-1].startswith("G ")


def start_consumer(
    address: str,
    dataset: str,
    holder: str,
    folder: Path,
    work_seconds: float = 0.02,
) -> Consumer:
    log_path = folder / f"{holder}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.test_shard_consumers", "consume",
         address, dataset, holder, str(log_path), str(work_seconds)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / f"{holder}.err", "wb"),  # noqa: SIM115 - the child owns it
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return Consumer(holder, process, log_path)


# -- reading the logs ------------------------------------------------------------------


@dataclass
class Outcome:
    """What the consumers' logs say, with the killed consumers' last acks inferred."""

    acked: dict[tuple[int, int], list[tuple[str, int]]]  # (epoch, shard) -> [(holder, attempt)]
    indices: dict[tuple[int, int], list[int]]


def read_outcome(
    consumers: Sequence[Consumer],
    killed: set[str],
    requeued_by: dict[str, set[tuple[int, int]]] | None,
) -> Outcome:
    acked: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    indices: dict[tuple[int, int], list[int]] = {}
    pending: list[tuple[str, tuple[int, int], int]] = []
    for consumer in consumers:
        grants: dict[tuple[int, int], int] = {}
        for line in consumer.lines():
            kind, *rest = line.split(" ")
            if kind == "G":
                key = (int(rest[0]), int(rest[1]))
                grants[key] = int(rest[2])
                got = [int(x) for x in rest[3].split(",")]
                assert indices.setdefault(key, got) == got, f"{key} served two index lists"
            elif kind == "A":
                key = (int(rest[0]), int(rest[1]))
                acked[key].append((consumer.holder, int(rest[2])))
                grants.pop(key)
            elif kind == "L":
                raise AssertionError(f"{consumer.holder} lost a shard: {line}")
        if consumer.holder in killed:
            pending += [(consumer.holder, key, attempt) for key, attempt in grants.items()]
        else:
            assert not grants, f"{consumer.holder} ended holding {grants}"
    logged = set(acked)
    by_key: dict[tuple[int, int], list[tuple[int, str]]] = defaultdict(list)
    for holder, key, attempt in pending:
        if requeued_by is not None:
            given_back = key in requeued_by.get(holder, set())
            assert given_back == (key in logged), (holder, key, "requeued vs acked elsewhere")
            if given_back:
                continue
        elif key in logged:
            continue  # its lease ran out and another consumer acknowledged it
        by_key[key].append((attempt, holder))
    for key, deliveries in by_key.items():
        # Only the last delivery can have been acknowledged: an earlier one was taken back.
        attempt, holder = max(deliveries)
        acked[key].append((holder, attempt))  # the server applied its ack before the kill
    return Outcome(dict(acked), indices)


def check_exactly_once(outcome: Outcome, size: int, num_shards: int, epochs: int) -> None:
    for key, who in outcome.acked.items():
        assert len(who) == 1, f"shard {key} acknowledged {len(who)} times: {who}"
    for epoch in range(epochs):
        shards = {s for e, s in outcome.acked if e == epoch}
        assert shards == set(range(num_shards)), (
            f"epoch {epoch}: lost {set(range(num_shards)) - shards}"
        )
        samples: Counter[int] = Counter()
        for (e, shard), idx in outcome.indices.items():
            if e == epoch and (e, shard) in outcome.acked:
                samples.update(idx)
        assert samples == Counter(range(size)), f"epoch {epoch}: samples not exactly once"


def check_server_counts(dataset: object, size: int, num_shards: int, epochs: int) -> int:
    """Every epoch complete on the server; returns the redeliveries it counted."""
    from gearshift.v1 import shardmanager_pb2

    assert isinstance(dataset, shardmanager_pb2.Dataset)
    assert dataset.state == shardmanager_pb2.DATASET_STATE_FINISHED
    assert [p.epoch for p in dataset.epochs] == list(range(epochs))
    for p in dataset.epochs:
        assert (p.samples_done, p.shards_done, p.samples_failed) == (size, num_shards, 0), p
        assert (p.samples_in_flight, p.samples_todo) == (0, 0), p
    return sum(p.shards_redelivered for p in dataset.epochs)


# -- the runs ------------------------------------------------------------------------------


@dataclass
class KillRun:
    """8 consumers over 3 epochs; consumers killed mid-shard at spread-out points and replaced."""

    addresses: Sequence[str]
    folder: Path
    size: int = 2000
    shard_size: int = 10
    epochs: int = 3
    consumers: int = 8
    kills: int = 6
    lease_seconds: float = 30.0
    release_killed: bool = True
    work_seconds: float = 0.02
    seed: int = field(default_factory=lambda: random.randrange(10**6))
    on_progress: Callable[[int], None] | None = None  # called with shards done, for extra faults

    def run(self, dataset: str) -> None:
        from gearshift.worker.shard_client import ShardClient
        from tests.helpers import wait_until

        rng = random.Random(self.seed)
        print(f"kill run seed {self.seed}")
        admin = ShardClient(self.addresses[0], retry_seconds=120)
        admin.create_dataset(dataset, job_id=f"job-{dataset}", size=self.size,
                             shard_size=self.shard_size, num_epochs=self.epochs, seed=self.seed,
                             lease_seconds=self.lease_seconds, max_attempts=50)  # fmt: skip
        num_shards = -(-self.size // self.shard_size)
        total = num_shards * self.epochs
        everyone: list[Consumer] = []
        live: list[Consumer] = []
        killed: set[str] = set()
        requeued_by: dict[str, set[tuple[int, int]]] = {}
        requeued_count = 0

        def spawn() -> None:
            n = len(everyone)
            address = self.addresses[n % len(self.addresses)]
            consumer = start_consumer(address, dataset, f"c{n}", self.folder, self.work_seconds)
            everyone.append(consumer)
            live.append(consumer)

        def victims() -> list[Consumer]:
            found = [c for c in live if c.mid_shard()]
            if not found and all(c.process.poll() is not None for c in live):
                pytest.fail("every consumer ended before the kills were done")
            return found

        def done() -> int:
            return sum(p.shards_done for p in admin.describe(dataset).epochs)

        def reached(point: int) -> bool:
            return done() >= point

        for _ in range(self.consumers):
            spawn()
        try:
            for k in range(self.kills):
                point = total * (k + 1) // (self.kills + 2)
                wait_until(functools.partial(reached, point), 180, f"{point} shards done")
                if self.on_progress is not None:
                    self.on_progress(done())
                candidates = wait_until(victims, 60, "a consumer in the middle of a shard")
                victim = rng.choice(candidates)
                victim.process.send_signal(signal.SIGKILL)
                victim.process.wait(timeout=30)
                live.remove(victim)
                killed.add(victim.holder)
                if self.release_killed:
                    reply = admin.release_holder(dataset, victim.holder, "killed by the test")
                    requeued_by[victim.holder] = {
                        (reply.epoch, s) for s in reply.requeued_shard_ids
                    }
                    requeued_count += len(reply.requeued_shard_ids)
                    assert reply.failed == 0
                spawn()
            for consumer in live:
                code = consumer.process.wait(timeout=300)
                err = (self.folder / f"{consumer.holder}.err").read_text(errors="replace")
                assert code == 0, f"{consumer.holder} exited {code}:\n{err[-3000:]}"
        finally:
            for consumer in everyone:
                if consumer.process.poll() is None:
                    consumer.process.kill()
                    consumer.process.wait()
        final = admin.describe(dataset)
        admin.close()

        outcome = read_outcome(everyone, killed, requeued_by if self.release_killed else None)
        check_exactly_once(outcome, self.size, num_shards, self.epochs)
        redelivered = check_server_counts(final, self.size, num_shards, self.epochs)
        again = {key for key, who in outcome.acked.items() if who[0][1] > 1}
        inferred = sum(1 for who in outcome.acked.values() if who[0][0] in killed)
        print(f"killed {sorted(killed)}; redelivered {redelivered} shards {sorted(again)}; "
              f"acks of killed consumers {inferred}")  # fmt: skip
        if self.release_killed:
            # Redeliveries are exactly the shards the killed consumers held.
            assert redelivered == requeued_count, (redelivered, requeued_count)
            assert again == set().union(*requeued_by.values())
        else:
            # A killed consumer held at most one shard: it comes back once, after its lease.
            assert redelivered == len(again), (redelivered, again)
            assert 1 <= redelivered <= len(killed), (redelivered, killed)
        assert len(killed) == self.kills


def replica_factory(daemons: DaemonFactory, redis_url: str, prefix: str) -> Callable[..., str]:
    """Start shard-manager replicas on one Redis with one key prefix; returns their addresses."""

    def start(port: int = 0) -> str:
        args = ["--redis-url", redis_url, "--key-prefix", prefix, "--deleted-ttl-seconds", "5"]
        if port:
            args += ["--listen", f"127.0.0.1:{port}"]
        return str(daemons("shardmanager", args).address)

    return start


@pytest.fixture
def sm(daemons: DaemonFactory, redis_url: str, unique_id: str) -> Callable[..., str]:
    """Shard-manager replicas on the shared Redis, with this test's own key prefix."""
    return replica_factory(daemons, redis_url, f"gstest:{unique_id}")


@pytest.mark.slow
def test_killed_consumers_lose_nothing(
    sm: Callable[..., str], tmp_path: Path, unique_id: str
) -> None:
    KillRun([sm()], tmp_path).run(f"kill-{unique_id}")


@pytest.mark.slow
def test_two_replicas_serve_the_consumers(
    sm: Callable[..., str], tmp_path: Path, unique_id: str
) -> None:
    KillRun([sm(), sm()], tmp_path).run(f"two-{unique_id}")


@pytest.mark.slow
def test_expired_leases_of_killed_consumers_are_redelivered(
    sm: Callable[..., str], tmp_path: Path, unique_id: str
) -> None:
    run = KillRun([sm()], tmp_path, size=600, consumers=4, kills=2, lease_seconds=2.0,
                  release_killed=False)  # fmt: skip
    run.run(f"lease-{unique_id}")


@pytest.mark.slow
def test_shard_manager_killed_and_restarted_mid_run(
    daemons: DaemonFactory, redis_url: str, tmp_path: Path, unique_id: str
) -> None:
    port = free_port()
    args = ["--redis-url", redis_url, "--key-prefix", f"gstest:{unique_id}",
            "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    current = [daemons("shardmanager", args)]
    restarts: list[int] = []

    def crash_and_restart(shards_done: int) -> None:
        if len(restarts) >= 2:
            return
        current[0].kill()  # SIGKILL, mid-run: consumers are inside calls
        current.append(daemons("shardmanager", args))
        restarts.append(shards_done)

    run = KillRun([f"127.0.0.1:{port}"], tmp_path, kills=3, work_seconds=0.05,
                  on_progress=crash_and_restart)  # fmt: skip
    run.run(f"restart-{unique_id}")
    assert len(restarts) == 2, restarts


if __name__ == "__main__":
    if sys.argv[1:2] == ["consume"]:
        address, dataset, holder, log_path, work = sys.argv[2:7]
        consume(address, dataset, holder, log_path, float(work))
