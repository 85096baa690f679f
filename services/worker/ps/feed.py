"""Where a worker's training batches come from.

`CounterFeed`: global batch n of the seeded stream (every epoch visits every block
once); the batch number, claimed from PS 0, alone decides the data.
`ShardFeed`: dynamic shards from the shard manager (DLRover's at-least-once
sharding): one shard = one training block; each shard is acknowledged when the
next is asked for, provisionally — the launcher covers a phase's acks once its
checkpoint is published, and releases the holders of a phase that died, so the
shards whose updates the checkpoint lost are read again.

The launcher forks its PS and worker processes, and gRPC does not survive a fork
of a process that used it: so the launcher makes its shard-manager calls (create,
cover, release) through `python -m gearshift.worker.ps.feed` (JSON on stdin),
which imports neither torch nor the launcher.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from gearshift.worker.ps.data import Batch, ClickData
from gearshift.worker.shard_client import Shard, ShardClient


@dataclass(frozen=True)
class ShardSource:
    """A dynamic-mode dataset of `train_blocks` one-block shards on a shard manager."""

    address: str
    dataset_id: str
    token: str | None = None
    epochs: int = 100
    job_id: str = ""  # the job the dataset belongs to (deleted with it); "": dataset_id

    def holder(self, generation: int, worker: int) -> str:
        return f"{self.dataset_id}/gen{generation}/worker{worker}"

    def create(self, train_blocks: int, seed: int) -> None:
        """Create the dataset (the same settings again find the existing one)."""
        with ShardClient(self.address, token=self.token) as client:
            client.create_dataset(
                self.dataset_id,
                job_id=self.job_id or self.dataset_id,
                size=train_blocks,
                shard_size=1,
                seed=seed,
                num_epochs=self.epochs,
                provisional_acks=True,
            )

    def cover(self, holder: str, shards: list[tuple[int, int]]) -> int:
        with ShardClient(self.address, token=self.token) as client:
            return client.cover(self.dataset_id, holder, shards)

    def release(self, holder: str, reason: str) -> None:
        with ShardClient(self.address, token=self.token) as client:
            client.release_holder(self.dataset_id, holder, reason)


class Feed(Protocol):
    def next_batch(self, number: int) -> Batch | None:
        """The batch to train as global step `number`; None when the data ran out."""

    def finish(self) -> list[tuple[int, int]]:
        """Stop reading; the (epoch, shard) pairs acknowledged, if any."""


class CounterFeed:
    def __init__(self, data: ClickData) -> None:
        self.data = data

    def next_batch(self, number: int) -> Batch | None:
        return self.data.train_batch(number)[1]

    def finish(self) -> list[tuple[int, int]]:
        return []


class ShardFeed:
    def __init__(self, data: ClickData, source: ShardSource, holder: str) -> None:
        self.data = data
        self.client = ShardClient(source.address, token=source.token)
        self.consumer = self.client.consumer(source.dataset_id, holder)
        self.previous: Shard | None = None
        self.acked: list[tuple[int, int]] = []

    def _ack_previous(self) -> None:
        if self.previous is not None:
            self.acked.append((self.previous.epoch, self.previous.shard_id))
            self.previous = None

    def next_batch(self, number: int) -> Batch | None:
        shard = self.consumer.acquire(ack=self.previous)
        self._ack_previous()
        if shard is None:
            return None
        self.previous = shard
        return self.data.block(shard.start)

    def finish(self) -> list[tuple[int, int]]:
        if self.previous is not None:
            self.consumer.ack(self.previous)
            self._ack_previous()
        self.consumer.close(release=False)
        self.client.close()
        return self.acked


def call_out_of_process(source: ShardSource, op: str, timeout_s: float = 120.0, **args: Any) -> Any:
    """Run one of create / cover / release in a fresh interpreter (see the module doc)."""
    request = json.dumps({"source": asdict(source), "op": op, "args": args})
    out = subprocess.run(
        [sys.executable, "-m", "gearshift.worker.ps.feed"],
        input=request,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"shard manager {op} on {source.address} failed: {out.stderr.strip()[-800:]}"
        )
    return json.loads(out.stdout)


def main() -> int:
    request = json.loads(sys.stdin.read())
    source = ShardSource(**request["source"])
    args = request["args"]
    result: Any = None
    if request["op"] == "create":
        source.create(int(args["train_blocks"]), int(args["seed"]))
    elif request["op"] == "cover":
        result = source.cover(args["holder"], [(int(e), int(s)) for e, s in args["shards"]])
    elif request["op"] == "release":
        source.release(args["holder"], args["reason"])
    else:
        raise SystemExit(f"unknown op {request['op']!r}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
