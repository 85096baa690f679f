"""Jobs for the worker daemon's tests, imported by training processes (PYTHONPATH = the repo).

`crashing`: the MLP example whose forward raises after `crash_after` calls, as a bug in
user code would (a RuntimeError; a MemoryError with `"error": "memory"`); its building
takes `start_delay` seconds (a slow start, before step 1).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gearshift.examples import mlp
from gearshift.worker.runtime.job import Job


class Crashing(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, after: int, error: str = "") -> None:
        super().__init__()
        self.inner = inner
        self.after = after
        self.error = error
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.after and self.error == "memory":
            raise MemoryError(f"no memory after {self.after} forward passes")
        if self.calls > self.after:
            raise RuntimeError(f"boom after {self.after} forward passes")
        return self.inner(x)  # type: ignore[no-any-return]


def build(config: dict[str, Any]) -> Job:
    time.sleep(float(config.get("start_delay", 0.0)))
    job = mlp.build(config)
    job.model = Crashing(job.model, int(config.get("crash_after", 3)), str(config.get("error", "")))
    return job
