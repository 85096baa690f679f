"""Gavel's measured-throughput file (simulation_throughputs.json) as plain data.

Read by the scheduler's simulator (throughput matrix) and by the Brain (its
reference table for matrix completion), so both parse the file the same way.
Keys in the file look like "('ResNet-18 (batch size 16)', 1)": a job type and
its scale factor (number of GPUs).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.errors import ValidationError


@dataclass(frozen=True, order=True)
class JobKey:
    """A job type at a scale factor, e.g. ("ResNet-18 (batch size 16)", 1)."""

    job_type: str
    scale_factor: int


def parse_job_key(text: str) -> JobKey:
    """Parse "('<job type>', <scale factor>)"; ValueError names the bad key."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"bad job key {text!r}") from None
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)):
        raise ValueError(f"bad job key {text!r}: expected ('<job type>', <scale factor>)")
    return JobKey(value[0], int(value[1]))


@dataclass(frozen=True)
class ThroughputTable:
    """Steps/s per worker type: alone (isolated) and when sharing a GPU with another job."""

    isolated: dict[str, dict[JobKey, float]]
    colocated: dict[str, dict[tuple[JobKey, JobKey], tuple[float, float]]]

    @property
    def worker_types(self) -> list[str]:
        return sorted(self.isolated)

    @property
    def job_keys(self) -> list[JobKey]:
        return sorted({k for table in self.isolated.values() for k in table})

    def throughput(self, job: JobKey, worker_type: str) -> float:
        """Isolated steps/s of a job on one worker type (0.0 when it cannot run there)."""
        return self.isolated.get(worker_type, {}).get(job, 0.0)

    def pair(self, job: JobKey, other: JobKey, worker_type: str) -> tuple[float, float]:
        """(job's, other's) steps/s when both share a device of worker_type."""
        return self.colocated.get(worker_type, {}).get((job, other), (0.0, 0.0))


def load_throughputs(path: str | Path) -> ThroughputTable:
    """Read Gavel's throughputs JSON; ValidationError names the file and key on bad content."""
    source = Path(path)
    try:
        raw = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError(str(source), f"cannot read throughputs: {exc}") from None
    isolated: dict[str, dict[JobKey, float]] = {}
    colocated: dict[str, dict[tuple[JobKey, JobKey], tuple[float, float]]] = {}
    for worker_type, jobs in raw.items():
        iso = isolated.setdefault(worker_type, {})
        pairs = colocated.setdefault(worker_type, {})
        for key_text, entry in jobs.items():
            try:
                job = parse_job_key(key_text)
                iso[job] = float(entry["null"])
                for other_text, values in entry.items():
                    if other_text != "null":
                        pairs[(job, parse_job_key(other_text))] = (
                            float(values[0]),
                            float(values[1]),
                        )
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ValidationError(f"{source}: {worker_type}/{key_text}", str(exc)) from None
    return ThroughputTable(isolated, colocated)
