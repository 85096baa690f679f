"""The shard manager's Prometheus metrics (served with the RPC metrics, see
gearshift.common.metrics). Counts are this replica's: sum them over replicas."""

from __future__ import annotations

import prometheus_client

TRANSITIONS = prometheus_client.Counter(
    "gearshift_shard_transitions",
    "Shard and dataset transitions done by this replica, by kind: acquired (TODO -> DOING), "
    "acked (DOING -> DONE), requeued and failed (a released holder's shards), created, "
    "deleted, checkpointed, restored",
    ["kind"],
)
DETERMINISTIC_READS = prometheus_client.Counter(
    "gearshift_shard_deterministic_reads",
    "Shards served by GetShardsAt (deterministic mode: no state changes)",
)


def transition(kind: str, count: int = 1) -> None:
    if count:
        TRANSITIONS.labels(kind).inc(count)


def deterministic_read(count: int) -> None:
    DETERMINISTIC_READS.inc(count)
