"""Shard manager pieces that need no Redis: settings validation, stored form, the client's Shard."""

from __future__ import annotations

import sys

import pytest

from gearshift.common.errors import ValidationError
from gearshift.shardmanager.model import DatasetSettings, Mode
from gearshift.shardmanager.servicer import check_holder, settings_from_request
from gearshift.v1 import common_pb2, shardmanager_pb2
from gearshift.worker.shard_client import Shard


def config(**kw: object) -> shardmanager_pb2.DatasetConfig:
    values: dict[str, object] = {"job_id": "j", "size": 100, "shard_size": 10, "num_epochs": 1}
    values.update(kw)
    return shardmanager_pb2.DatasetConfig(**values)  # type: ignore[arg-type]


def test_defaults_apply_and_unspecified_mode_means_deterministic() -> None:
    settings = settings_from_request(config(num_ranks=4))
    assert settings.mode is Mode.DETERMINISTIC
    assert (settings.lease_ms, settings.max_attempts, settings.num_shards) == (60_000, 3, 10)
    dynamic = settings_from_request(config(mode=common_pb2.DATA_MODE_DYNAMIC, lease_seconds=0.5))
    assert dynamic.mode is Mode.DYNAMIC and dynamic.lease_ms == 500


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"job_id": ""}, "config.job_id"),
        ({"job_id": "a b"}, "config.job_id"),
        ({"size": 0}, "config.size"),
        ({"size": 10**13}, "config.size"),
        ({"shard_size": -1}, "config.shard_size"),
        ({"shard_size": 101}, "config.shard_size"),
        ({"num_epochs": -1}, "config.num_epochs"),
        ({"mode": 5}, "config.mode"),
        ({"num_ranks": 0}, "config.num_ranks"),
        ({"mode": common_pb2.DATA_MODE_DYNAMIC, "num_ranks": -1}, "config.num_ranks"),
        ({"num_ranks": 1, "lease_seconds": 1e6}, "config.lease_seconds"),
        ({"num_ranks": 1, "lease_seconds": float("inf")}, "config.lease_seconds"),
        ({"num_ranks": 1, "max_attempts": 1001}, "config.max_attempts"),
    ],
)
def test_bad_settings_name_their_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        settings_from_request(config(**change))
    assert exc.value.field == field


def test_holder_ids() -> None:
    check_holder("job-1/rank-3")
    for bad in ["", "a b", "tab\there", "x" * 257, "bell\x07"]:
        with pytest.raises(ValidationError, match="holder_id"):
            check_holder(bad)


def test_stored_form_round_trips() -> None:
    settings = DatasetSettings("j", 95, 10, -3, 2, Mode.DYNAMIC, 0, 1500, 5, True)
    assert DatasetSettings.from_stored(settings.stored()) == settings
    assert settings.stored()["num_shards"] == "10"


def test_client_shard_indices() -> None:
    plain = Shard("ds", 0, 2, 20, 25)
    assert plain.sample_indices() == [20, 21, 22, 23, 24] and len(plain) == 5
    shuffled = Shard("ds", 0, 2, 20, 23, indices=(22, 20, 21))
    assert shuffled.sample_indices() == [22, 20, 21]


def test_client_module_stays_light() -> None:
    import subprocess

    code = (
        "import sys, gearshift.worker.shard_client; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'redis') "
        "or m.startswith('gearshift.shardmanager')]; print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
