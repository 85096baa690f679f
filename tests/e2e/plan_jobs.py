"""A job for the resource-plan tests, imported by training processes (PYTHONPATH = the repo).

`sleepy`: the MLP example whose forward sleeps `sleep` seconds first, as a job waiting on
I/O would: it uses a small part of any CPU it is given, which the Brain's adjust stage
should see and shrink.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gearshift.examples import mlp
from gearshift.worker.runtime.job import Job


class Sleepy(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner = inner
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.inner(x)  # type: ignore[no-any-return]


def build(config: dict[str, Any]) -> Job:
    job = mlp.build(config)
    job.model = Sleepy(job.model, float(config.get("sleep", 0.1)))
    return job
