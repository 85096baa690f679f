"""Plain data of the shard manager: settings, progress and the results of transitions.

The store speaks these, the servicer turns them into protobuf messages, so the
domain code does not depend on gRPC and tests can read results directly.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from gearshift.common.sharding import num_shards

DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_MAX_ATTEMPTS = 3


class Mode(enum.StrEnum):
    """How a dataset's shards are handed out."""

    DYNAMIC = "dynamic"
    DETERMINISTIC = "deterministic"


@dataclass(frozen=True)
class DatasetSettings:
    """What CreateDataset fixes for the life of a dataset (validated by the servicer)."""

    job_id: str
    size: int
    shard_size: int
    seed: int
    num_epochs: int
    mode: Mode
    num_ranks: int = 0
    lease_ms: int = int(DEFAULT_LEASE_SECONDS * 1000)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    shuffle_within_shard: bool = False
    # Acknowledgements stay provisional until the holder's checkpoint covers them
    # (CoverShards); releasing the holder undoes the provisional ones (see lua.py).
    provisional_acks: bool = False

    @property
    def num_shards(self) -> int:
        return num_shards(self.size, self.shard_size)

    def stored(self) -> dict[str, str]:
        """The settings as the strings kept in the dataset's Redis hash (fixed order)."""
        return {
            "job_id": self.job_id,
            "size": str(self.size),
            "shard_size": str(self.shard_size),
            "seed": str(self.seed),
            "num_epochs": str(self.num_epochs),
            "mode": self.mode.value,
            "num_ranks": str(self.num_ranks),
            "lease_ms": str(self.lease_ms),
            "max_attempts": str(self.max_attempts),
            "shuffle": "1" if self.shuffle_within_shard else "0",
            "num_shards": str(self.num_shards),
            "provisional": "1" if self.provisional_acks else "0",
        }

    @classmethod
    def from_stored(cls, fields: Mapping[str, str]) -> DatasetSettings:
        return cls(
            job_id=fields["job_id"],
            size=int(fields["size"]),
            shard_size=int(fields["shard_size"]),
            seed=int(fields["seed"]),
            num_epochs=int(fields["num_epochs"]),
            mode=Mode(fields["mode"]),
            num_ranks=int(fields["num_ranks"]),
            lease_ms=int(fields["lease_ms"]),
            max_attempts=int(fields["max_attempts"]),
            shuffle_within_shard=fields["shuffle"] == "1",
            provisional_acks=fields.get("provisional") == "1",
        )


@dataclass(frozen=True)
class EpochProgress:
    """Counters of one epoch; samples unless named shards."""

    epoch: int
    samples_done: int = 0
    samples_in_flight: int = 0
    samples_todo: int = 0
    samples_redelivered: int = 0
    samples_failed: int = 0
    failed_shards: tuple[int, ...] = ()
    shards_done: int = 0
    shards_redelivered: int = 0
    shards_undone: int = 0  # provisional acks undone by releasing their holder


@dataclass(frozen=True)
class DatasetStatus:
    """A dataset's settings and progress at one instant (Redis time `at_ms`)."""

    dataset_id: str
    settings: DatasetSettings
    epoch: int
    finished: bool
    epochs: tuple[EpochProgress, ...]
    at_ms: int


@dataclass(frozen=True)
class ShardData:
    """A shard as handed to a reader: which samples, in which order, and its lease."""

    epoch: int
    shard_id: int
    start: int
    end: int
    indices: tuple[int, ...] | None = None
    attempt: int = 0
    lease_deadline_ms: int = 0


class AcquireStatus(enum.Enum):
    GRANTED = "granted"
    WAIT = "wait"
    END_OF_DATA = "end"


@dataclass(frozen=True)
class AcquireResult:
    """What AcquireShard found; `acked` is None when no acknowledgement was asked."""

    status: AcquireStatus
    epoch: int
    shard: ShardData | None = None
    lease_seconds: float = 0.0
    acked: bool | None = None


@dataclass(frozen=True)
class RenewResult:
    renewed: int
    lease_deadline_ms: int
    lost: tuple[int, ...]


@dataclass(frozen=True)
class ReleasedShard:
    """A shard a release put back in TODO, with the step that had read it (-1: not known)
    and whether its provisional acknowledgement was undone (else it was DOING)."""

    epoch: int
    shard_id: int
    read_step: int
    acknowledged: bool


@dataclass(frozen=True)
class ReleaseResult:
    epoch: int
    requeued: tuple[int, ...]
    failed: tuple[int, ...]
    covered: int = 0  # provisional acks made final by the release's resume step
    released: tuple[ReleasedShard, ...] = ()
    repeat: bool = False  # the answer to an earlier call with the same request id


@dataclass(frozen=True)
class ShardsAt:
    """Shards of one logical rank from a position, and the length of its sequence."""

    shards: tuple[ShardData, ...]
    sequence_length: int
