"""Workloads: Gavel's 10-field trace format and the section 7.1 Poisson generator."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import JobKey, load_throughputs
from gearshift.scheduler.sim.trace import (
    generate_workload,
    parse_trace_lines,
    read_trace,
    write_trace,
)

LINE = "\t".join(
    [
        "ResNet-18 (batch size 64)",
        "python3 main.py",
        "image_classification/cifar10",
        "--num_steps",
        "1",
        "1000",
        "2",
        "1",
        "-1.000000",
        "0",
    ]
)


def test_parse_and_round_trip(tmp_path: Path) -> None:
    (job,) = parse_trace_lines([LINE])
    assert (job.job_type, job.total_steps, job.scale_factor, job.slo, job.arrival_time) == (
        "ResNet-18 (batch size 64)",
        1000,
        2,
        None,
        0.0,
    )
    path = tmp_path / "t.trace"
    write_trace([job], path)
    assert read_trace(path) == [job]


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("a\tb", "t:1"),
        (LINE.replace("\t1000\t", "\t0\t"), "t:1 total_steps"),
        (LINE.replace("\t1000\t2\t", "\t1000\t0\t"), "t:1 scale_factor"),
        (LINE.rsplit("\t", 1)[0] + "\tsoon", "t:1"),
    ],
)
def test_bad_lines_are_named(line: str, field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_trace_lines([line], "t")
    assert exc.value.field == field


def test_reads_gavels_traces(gavel_data: Path) -> None:
    jobs = read_trace(gavel_data / "max_min_fairness.trace")
    assert len(jobs) == 96
    assert {j.scale_factor for j in jobs} == {1, 2, 4}
    assert len(read_trace(gavel_data / "artifact_evaluation.trace")) == 15


def test_generator_follows_section_7_1(gavel_data: Path) -> None:
    table = load_throughputs(gavel_data / "simulation_throughputs.json")
    jobs = generate_workload(table, 3000, jobs_per_hour=2.0, seed=7)
    shares = {s: sum(j.scale_factor == s for j in jobs) / len(jobs) for s in (1, 2, 4, 8)}
    assert shares[1] == pytest.approx(0.7, abs=0.03)
    assert shares[2] == pytest.approx(0.1, abs=0.02)
    assert shares[4] == pytest.approx(0.15, abs=0.02)
    assert shares[8] == pytest.approx(0.05, abs=0.015)
    durations = [
        j.total_steps / table.throughput(JobKey(j.job_type, j.scale_factor), "v100") for j in jobs
    ]
    assert min(durations) >= 60 * 10**1.5 * 0.99
    assert max(durations) <= 60 * 10**4 * 1.01
    long = sum(d > 60 * 10**3 for d in durations) / len(durations)
    assert long == pytest.approx(0.2, abs=0.03)
    gaps = [b.arrival_time - a.arrival_time for a, b in itertools.pairwise(jobs)]
    assert sum(gaps) / len(gaps) == pytest.approx(1800, rel=0.08)  # 2 jobs/hour
    # Seeds reproduce; different seeds differ.
    assert generate_workload(table, 50, 2.0, seed=7) == jobs[:50]
    assert generate_workload(table, 50, 2.0, seed=8) != jobs[:50]
    single = generate_workload(table, 100, 2.0, seed=1, multi_gpu=False)
    assert {j.scale_factor for j in single} == {1}
