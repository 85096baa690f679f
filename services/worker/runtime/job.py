"""The job API: a user module's `build(config)` returns what to train; the runtime owns the loop.

```python
# mypackage/myjob.py
from gearshift.worker.runtime.job import Job

def build(config: dict) -> Job:
    model = MyNet(config["width"])
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    return Job(
        model=model,
        optimizer=optimizer,
        dataset=MyDataset(),            # map-style: dataset[i] -> (input, target)
        loss=torch.nn.CrossEntropyLoss(),  # loss(model(inputs), targets) -> scalar
        lr_scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 100, 0.5),  # stepped per step
    )
```

`dataset[i]` may use randomness (augmentation) from torch, `random` and NumPy's
global generator: it runs inside the state of the logical loader worker that
builds the batch. The model may use randomness too (dropout): it runs inside
its EST's state. `build` itself runs after the runtime seeded those
generators from the job seed, so every process builds the same initial model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import default_collate

from gearshift.common.errors import ValidationError
from gearshift.worker.runtime.loader import Collate, MapDataset


@dataclass
class Job:
    """What `build(config)` returns."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: MapDataset
    loss: Callable[[Any, Any], torch.Tensor]
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    collate: Collate = field(default=default_collate)


def load_job(module: str, config: dict[str, Any]) -> Job:
    """Import `module` and call its `build(config)`; errors name what is wrong."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # a user's module may fail at import in any way: bad input
        raise ValidationError(
            "--job", f"cannot import module {module!r}: {type(exc).__name__}: {exc}"
        ) from None
    build = getattr(mod, "build", None)
    if not callable(build):
        raise ValidationError("--job", f"module {module!r} has no build(config) function")
    job = build(config)
    if not isinstance(job, Job):
        raise ValidationError(
            "--job", f"{module}.build(config) returned {type(job).__name__}, not a Job"
        )
    if len(job.dataset) == 0:
        raise ValidationError("--job", f"{module}.build(config) returned an empty dataset")
    return job
