"""An MLP classifier on synthetic Gaussian clusters (no download), SGD with momentum.

Inputs get a little random noise per sample (augmentation from the loader
worker's torch generator); the model has dropout. Sizes are configurable so the
same job serves the tests (tiny) and the overhead benchmark (larger).

Config: features (32), hidden (64), layers (2), classes (8), samples (4096),
dropout (0.1), noise (0.05), lr (0.05), momentum (0.9), optimizer ("sgd" or "adam"),
lr_step (100), lr_gamma (0.5), global_norm (false: scale the hidden activations by their
RMS over the whole batch — one large reduction whose bits, with a wide layer, depend on
the intra-op thread count: the case D2's pinned thread count is for).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gearshift.worker.runtime.job import Job


class Clusters:
    """Points around `classes` random centres; fixed by `data_seed`, not the job seed."""

    def __init__(self, samples: int, features: int, classes: int, noise: float, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        centres = torch.randn(classes, features, generator=gen) * 2.0
        self.labels = torch.randint(0, classes, (samples,), generator=gen)
        self.inputs = centres[self.labels] + torch.randn(samples, features, generator=gen)
        self.noise = noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.inputs[index]
        if self.noise:
            x = x + torch.randn_like(x) * self.noise
        return x, self.labels[index]


class GlobalRmsNorm(nn.Module):
    """x / RMS(x) over the whole tensor (batch included)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(2).mean().add(1e-6).sqrt()


def mlp(
    features: int, hidden: int, layers: int, classes: int, *, dropout: float, global_norm: bool
) -> nn.Sequential:
    blocks: list[nn.Module] = []
    width = features
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
        if global_norm:
            blocks.append(GlobalRmsNorm())
        width = hidden
    return nn.Sequential(*blocks, nn.Linear(width, classes))


def build(config: dict[str, Any]) -> Job:
    features = int(config.get("features", 32))
    classes = int(config.get("classes", 8))
    model = mlp(
        features,
        int(config.get("hidden", 64)),
        int(config.get("layers", 2)),
        classes,
        dropout=float(config.get("dropout", 0.1)),
        global_norm=bool(config.get("global_norm", False)),
    )
    lr = float(config.get("lr", 0.05))
    if config.get("optimizer", "sgd") == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        optimizer = torch.optim.SGD(
            model.parameters(), lr=lr, momentum=float(config.get("momentum", 0.9))
        )
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, int(config.get("lr_step", 100)), float(config.get("lr_gamma", 0.5))
    )
    dataset = Clusters(
        int(config.get("samples", 4096)),
        features,
        classes,
        float(config.get("noise", 0.05)),
        int(config.get("data_seed", 7)),
    )
    return Job(
        model=model,
        optimizer=optimizer,
        dataset=dataset,
        loss=nn.CrossEntropyLoss(),
        lr_scheduler=scheduler,
    )
