"""Reference throughputs (the matrix-completion references) from Gavel's throughputs file.

Gavel's job types ("ResNet-18 (batch size 16)") become Brain model types that
pass the JobSpec name rules ("resnet-18-bs16"); each (job type, scale factor)
becomes one row entry per worker type, keyed by (accelerator type, device
count). An `*_unconsolidated` worker type at one device is the same
measurement as the consolidated one, so it is left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gearshift.brain.estimator import Column
from gearshift.common.gavel import load_throughputs

_BATCH = re.compile(r"^(?P<name>.*?)\s*\(batch size (?P<batch>\d+)\)$")


@dataclass(frozen=True)
class ReferenceThroughput:
    """One measured throughput of a reference model."""

    model_type: str
    accelerator_type: str
    device_count: int
    steps_per_second: float


def model_type_of(job_type: str) -> str:
    """Gavel job type -> Brain model type: "ResNet-18 (batch size 16)" -> "resnet-18-bs16"."""
    match = _BATCH.match(job_type)
    base, suffix = (match["name"], f"-bs{match['batch']}") if match else (job_type, "")
    slug = re.sub(r"[^a-z0-9.]+", "-", base.lower()).strip("-")
    return slug + suffix


def gavel_references(path: str | Path) -> list[ReferenceThroughput]:
    """Every isolated throughput of Gavel's file as reference rows (zeros, cannot run: left out)."""
    table = load_throughputs(path)
    out: list[ReferenceThroughput] = []
    for worker_type in table.worker_types:
        for key, value in table.isolated[worker_type].items():
            if value <= 0:
                continue
            if worker_type.endswith("_unconsolidated") and key.scale_factor == 1:
                continue
            out.append(
                ReferenceThroughput(
                    model_type_of(key.job_type), worker_type, key.scale_factor, value
                )
            )
    return out


def as_rows(references: list[ReferenceThroughput]) -> dict[str, dict[Column, float]]:
    """Reference throughputs grouped by model type, keyed by column."""
    rows: dict[str, dict[Column, float]] = {}
    for ref in references:
        rows.setdefault(ref.model_type, {})[Column(ref.accelerator_type, ref.device_count)] = (
            ref.steps_per_second
        )
    return rows
