"""Loading Gavel's measured throughputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import JobKey, ThroughputTable, load_throughputs, parse_job_key


@pytest.fixture(scope="module")
def table(gavel_data: Path) -> ThroughputTable:
    return load_throughputs(gavel_data / "simulation_throughputs.json")


def test_parse_job_key() -> None:
    assert parse_job_key("('ResNet-18 (batch size 16)', 1)") == JobKey(
        "ResNet-18 (batch size 16)", 1
    )
    with pytest.raises(ValueError, match="bad job key"):
        parse_job_key("ResNet")


def test_real_file(table: ThroughputTable) -> None:
    assert set(table.worker_types) >= {"k80", "p100", "v100"}
    job = JobKey("ResNet-18 (batch size 16)", 1)
    assert table.throughput(job, "k80") == pytest.approx(4.795294551566172)
    own, other = table.pair(job, JobKey("ResNet-18 (batch size 32)", 1), "k80")
    assert (own, other) == pytest.approx((2.539979567443098, 3.1201925448827033))
    assert table.throughput(job, "tpu") == 0.0
    assert len({k.job_type for k in table.job_keys}) == 26


def test_bad_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text('{"k80": {"nonsense": {"null": 1}}}')
    with pytest.raises(ValidationError, match="k80/nonsense"):
        load_throughputs(bad)
