"""Workloads for the simulator: Gavel's 10-field trace format, and Poisson workloads generated
the way Gavel's evaluation does (section 7.1).

Trace line (tab-separated): job_type, command, working_directory, num_steps_arg,
needs_data_dir, total_steps, scale_factor, priority_weight, SLO (-1: none),
arrival_time (seconds).

Generated workloads: Poisson arrivals at `jobs_per_hour`; durations 60*10^U(1.5,3)
seconds with probability 0.8, else 60*10^U(3,4) (Gandiva's distribution, as
Gavel); scale factor 1/2/4/8 with probability 0.7/0.1/0.15/0.05 ("continuous-
multiple"; only job types measured at that scale qualify), or always 1
("continuous-single"); steps = duration x the type's isolated throughput on
the reference type (v100).
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import JobKey, ThroughputTable

FIELDS = 10


@dataclass(frozen=True)
class TraceJob:
    """One job of a workload."""

    job_type: str
    total_steps: int
    scale_factor: int
    arrival_time: float
    priority_weight: float = 1.0
    slo: float | None = None
    command: str = ""
    working_directory: str = ""
    num_steps_arg: str = ""
    needs_data_dir: bool = False
    entity: str = "default"
    guaranteed: bool = False  # its tenant's quota may cover it (not in the trace line)
    one_type: bool = False  # never spans two types at once, as Sia's jobs (not in the line)

    @property
    def key(self) -> JobKey:
        return JobKey(self.job_type, self.scale_factor)

    def to_line(self) -> str:
        slo = -1.0 if self.slo is None else self.slo
        return "\t".join(
            [
                self.job_type,
                self.command,
                self.working_directory,
                self.num_steps_arg,
                "1" if self.needs_data_dir else "0",
                str(self.total_steps),
                str(self.scale_factor),
                f"{self.priority_weight:g}",
                f"{slo:f}",
                f"{self.arrival_time:g}",
            ]
        )


def csv_rows(path: Path, columns: Sequence[str], what: str) -> csv.DictReader[str]:
    """A CSV trace's rows by column; ValidationError names the file when it cannot be read or
    lacks a column (`what`: the kind of file, for the message)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValidationError(str(path), f"cannot read {what}: {exc.strerror or exc}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise ValidationError(f"{path}:1", f"missing columns: {', '.join(missing)}")
    return reader


def parse_trace_lines(lines: Iterable[str], source: str = "trace") -> list[TraceJob]:
    """Parse trace lines; ValidationError names the line and field."""
    jobs: list[TraceJob] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        parts = line.split("\t")
        where = f"{source}:{number}"
        if len(parts) != FIELDS:
            raise ValidationError(
                where, f"expected {FIELDS} tab-separated fields, got {len(parts)}"
            )
        try:
            steps, scale = int(parts[5]), int(parts[6])
            weight, slo, arrival = float(parts[7]), float(parts[8]), float(parts[9])
        except ValueError as exc:
            raise ValidationError(where, f"bad number: {exc}") from None
        if steps <= 0:
            raise ValidationError(f"{where} total_steps", f"must be > 0 (got {steps})")
        if scale < 1:
            raise ValidationError(f"{where} scale_factor", f"must be >= 1 (got {scale})")
        if not math.isfinite(arrival) or arrival < 0:
            raise ValidationError(f"{where} arrival_time", f"must be >= 0 (got {arrival})")
        if not math.isfinite(weight) or weight <= 0:
            raise ValidationError(f"{where} priority_weight", f"must be > 0 (got {weight})")
        if not math.isfinite(slo):
            raise ValidationError(f"{where} SLO", f"must be a number, -1 for none (got {slo})")
        jobs.append(
            TraceJob(
                job_type=parts[0],
                command=parts[1],
                working_directory=parts[2],
                num_steps_arg=parts[3],
                needs_data_dir=parts[4].strip() == "1",
                total_steps=steps,
                scale_factor=scale,
                priority_weight=weight,
                slo=None if slo < 0 else slo,
                arrival_time=arrival,
            )
        )
    return jobs


def read_trace(path: str | Path) -> list[TraceJob]:
    """Read a Gavel trace file (jobs keep their line order; arrivals must not decrease)."""
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise ValidationError(str(source), f"cannot read trace: {exc}") from None
    jobs = parse_trace_lines(text.splitlines(), str(source))
    for before, after in itertools.pairwise(jobs):
        if after.arrival_time < before.arrival_time:
            raise ValidationError(str(source), "arrival times must not decrease")
    return jobs


def write_trace(jobs: Iterable[TraceJob], path: str | Path) -> None:
    Path(path).write_text("".join(job.to_line() + "\n" for job in jobs))


def philly_scale_factor(rng: random.Random) -> int:
    """1/2/4/8 devices with probability 0.7/0.1/0.15/0.05."""
    r = rng.uniform(0, 1)
    if r < 0.7:
        return 1
    if r < 0.8:
        return 2
    if r < 0.95:
        return 4
    return 8


def gandiva_duration(rng: random.Random) -> float:
    """Seconds: 60*10^U(3,4) with probability 0.2, else 60*10^U(1.5,3)."""
    if rng.random() >= 0.8:
        return 60 * 10 ** rng.uniform(3, 4)
    return 60 * 10 ** rng.uniform(1.5, 3)


def generate_workload(
    table: ThroughputTable,
    num_jobs: int,
    jobs_per_hour: float,
    *,
    seed: int = 0,
    multi_gpu: bool = True,
    reference_type: str = "v100",
    start_with: int = 0,
) -> list[TraceJob]:
    """A continuous workload; `start_with` jobs arrive at time 0 (a busy cluster at start)."""
    if num_jobs < 1:
        raise ValidationError("num_jobs", "must be >= 1")
    if jobs_per_hour <= 0:
        raise ValidationError("jobs_per_hour", "must be > 0")
    rng = random.Random(seed)
    arrivals = random.Random(seed + 1)
    by_scale: dict[int, list[str]] = {}
    for key in table.job_keys:
        if table.throughput(key, reference_type) > 0:
            by_scale.setdefault(key.scale_factor, []).append(key.job_type)
    jobs: list[TraceJob] = []
    now = 0.0
    for i in range(num_jobs):
        scale = philly_scale_factor(rng) if multi_gpu else 1
        while scale not in by_scale:
            scale //= 2
        duration = gandiva_duration(rng)
        job_type = rng.choice(sorted(by_scale[scale]))
        rate = table.throughput(JobKey(job_type, scale), reference_type)
        if i >= start_with:
            now += -math.log(1.0 - arrivals.random()) * 3600.0 / jobs_per_hour
        jobs.append(
            TraceJob(
                job_type=job_type,
                total_steps=max(1, int(duration * rate)),
                scale_factor=scale,
                arrival_time=round(now, 3),
            )
        )
    return jobs
