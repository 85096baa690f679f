"""The shard manager: dynamic and deterministic data sharding with all state in Redis."""
