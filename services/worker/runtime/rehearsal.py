"""A joining process's first step, rehearsed before it says it is ready (issue 47).

A new process pays for its first kernels at its first step: on a GPU the lazy loading of
each kernel's module and the cuDNN and cuBLAS handles took 0.38 s for the digits CNN on
an H200, against 10 ms for the steps after it. When the survivors of an in-place change
wait for a joiner at the step boundary, every one of them waits that long. A joiner that
rehearses a forward and backward on its own freshly built model while the job trains on,
and only then announces itself (membership.py, `Change.waits_for_joiners`), costs the
survivors only the regrouping. What the rehearsal computes is thrown away: the global
random generators are put back, the gradients dropped, and the state the joiner receives
replaces the model's parameters and buffers.
"""

from __future__ import annotations

import torch

from gearshift.worker.runtime.job import Job
from gearshift.worker.runtime.rng import restore, snapshot
from gearshift.worker.runtime.trainer import to_device


def rehearse(job: Job, device: torch.device, samples: int) -> None:
    """One forward and backward of `job`'s model on its first `samples` samples (an EST's
    micro-batch: the shapes, so the kernels, of the steps to come) on `device`."""
    cuda = device.type == "cuda"
    model = job.model.to(device)
    kept = snapshot(cuda=cuda)  # the dataset's augmentation and dropout draw from them
    try:
        count = max(1, min(samples, len(job.dataset)))
        batch = job.collate([job.dataset[i] for i in range(count)])
        inputs, targets = to_device(batch, device)
        job.loss(model(inputs), targets).backward()  # type: ignore[no-untyped-call]
        if cuda:
            torch.cuda.synchronize(device)
    finally:
        model.zero_grad(set_to_none=True)
        restore(kept)
