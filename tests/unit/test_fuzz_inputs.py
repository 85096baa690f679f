"""Fuzzing the two file readers a user feeds by hand: the job YAML loader and Gavel's trace
reader. Whatever the bytes, the answer is a valid result or a ValidationError, never
another exception; what the trace reader accepts is what its writer writes back."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gearshift.client.spec import load_job
from gearshift.common.errors import ValidationError
from gearshift.scheduler.sim.trace import TraceJob, parse_trace_lines, write_trace

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SPEC_KEYS = [
    "name", "entrypoint", "num_ests", "global_batch_size", "total_steps", "dataset",
    "elastic", "accelerator_types", "determinism", "service_class", "working_dir",
    "priority", "module", "config", "path", "mode", "size", "shard_size", "seed",
    "min_devices", "max_devices", "slo_seconds", "checkpoint_every",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.dates(),
    st.datetimes(),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(SPEC_KEYS) | st.text(max_size=6), inner, max_size=5),
    ),
    max_leaves=20,
)
documents = st.dictionaries(st.sampled_from(SPEC_KEYS), values, max_size=10)


def _load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    try:
        job = load_job(path)
    except ValidationError as exc:
        assert str(exc), "a refusal says what is wrong"
        return
    assert job.spec.name  # accepted: a validated spec


@FUZZ
@given(document=documents)
@example(
    document={
        "name": "x",
        "entrypoint": {"module": "m", "config": {"at": datetime.date(2026, 1, 1)}},
    }
)
def test_job_yaml_documents_load_or_say_what_is_wrong(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    _load(tmp_path, yaml.safe_dump(document, allow_unicode=True))


@FUZZ
@given(text=st.text(max_size=300))
@example(text="name: [\n")
@example(text="\x00")
@example(text="a: &x [*x]")
def test_job_yaml_text_loads_or_says_what_is_wrong(tmp_path: Path, text: str) -> None:
    _load(tmp_path, text)


field_texts = st.one_of(
    st.from_regex(r"-?[0-9]{1,6}(\.[0-9]{1,3})?", fullmatch=True),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "-0", "", " 1", "1_0", "0x10"]),
    st.text(alphabet=st.characters(blacklist_characters="\t\n\r"), max_size=8),
)
trace_lines = st.lists(field_texts, min_size=8, max_size=11).map("\t".join)


@FUZZ
@given(lines=st.lists(trace_lines, max_size=5))
@example(lines=["ResNet-18 (batch size 16)\tcmd\tdir\t-n\t0\t100\t1\tnan\t-1\t0"])
@example(lines=["ResNet-18 (batch size 16)\tcmd\tdir\t-n\t0\t100\t1\t1\tnan\t0"])
@example(lines=["ResNet-18 (batch size 16)\tcmd\tdir\t-n\t0\t100\t1\tinf\t-1\t0"])
def test_trace_lines_parse_or_name_the_line(tmp_path: Path, lines: list[str]) -> None:
    try:
        jobs = parse_trace_lines(lines, "fuzz")
    except ValidationError as exc:
        assert "fuzz:" in str(exc), f"the refusal names the line: {exc}"
        return
    for job in jobs:
        assert job.total_steps > 0 and job.scale_factor >= 1
        assert math.isfinite(job.priority_weight) and job.priority_weight > 0
        assert math.isfinite(job.arrival_time) and job.arrival_time >= 0
        assert job.slo is None or (math.isfinite(job.slo) and job.slo >= 0)
    path = tmp_path / "trace.txt"
    write_trace(jobs, path)
    again = parse_trace_lines(path.read_text().splitlines(), "again")
    assert [_comparable(j) for j in again] == [_comparable(j) for j in jobs]


def _comparable(job: TraceJob) -> tuple[Any, ...]:
    return (job.job_type, job.total_steps, job.scale_factor, job.needs_data_dir)


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_trace_weight_that_is_not_a_finite_number_is_refused(bad: str) -> None:
    line = f"ResNet-18 (batch size 16)\tcmd\tdir\t-n\t0\t100\t1\t{bad}\t-1\t0"
    with pytest.raises(ValidationError, match="priority_weight"):
        parse_trace_lines([line], "t")


def test_a_trace_slo_that_is_not_a_number_is_refused() -> None:
    line = "ResNet-18 (batch size 16)\tcmd\tdir\t-n\t0\t100\t1\t1\tnan\t0"
    with pytest.raises(ValidationError, match="t:1 SLO"):
        parse_trace_lines([line], "t")


def test_a_config_that_is_not_json_data_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nentrypoint: {module: m, config: {at: 2026-01-01}}\n")
    with pytest.raises(ValidationError, match=r"spec\.entrypoint\.config.*plain JSON"):
        load_job(path)
