"""The dev cluster's own Redis: started on a Unix socket in the run folder, stopped cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearshift.client.devcluster import RedisProcess, parse_workers, redis_ping
from gearshift.common.errors import ValidationError


def test_parse_workers() -> None:
    assert parse_workers("v100:2, T4:1:16GiB") == [
        ("worker-1", "v100:2"),
        ("worker-2", "t4:1:16GiB"),
    ]
    for bad in ("v100", "v100:0", ":2", "v100:two"):
        with pytest.raises(ValidationError, match="--workers"):
            parse_workers(bad)


def test_redis_starts_answers_and_stops(tmp_path: Path) -> None:
    redis = RedisProcess.start(tmp_path / "redis")
    try:
        redis.wait_ready(30)
        assert redis.url.startswith("unix://")
        assert redis_ping(redis.endpoint)
    finally:
        assert redis.stop() == 0
    assert not redis_ping(redis.endpoint)


def test_long_run_dirs_fall_back_to_tcp(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    redis = RedisProcess.start(deep)
    try:
        redis.wait_ready(30)
        assert redis.url.startswith("redis://127.0.0.1:")
    finally:
        redis.stop()
