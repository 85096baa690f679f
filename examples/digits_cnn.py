"""A small CNN with dropout, BatchNorm and random augmentation on scikit-learn's digits.

1,797 8×8 images that ship with scikit-learn (no download). Augmentation draws
from all three global generators — a random shift (torch), pixel noise (NumPy)
and a brightness factor (Python `random`) — so it shows that each logical
loader worker's state travels with the batch it builds.

Config: lr (0.05), momentum (0.9), optimizer ("sgd" or "adam"), channels (8),
dropout (0.2), augment (true), lr_step (100), lr_gamma (0.5).
"""

from __future__ import annotations

import gzip
import importlib.util
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gearshift.worker.runtime.job import Job


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images 1797×8×8, labels) from the CSV scikit-learn ships.

    Read from the installed package without importing it: importing
    sklearn.datasets costs about a second in every training process.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("scikit-learn is not installed (pip install 'gearshift[worker]')")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


class Digits:
    """Map-style digits: (1×8×8 float image in [0, 1], label)."""

    def __init__(self, augment: bool) -> None:
        images, labels = load_digits()
        self.images = torch.from_numpy(images).unsqueeze(1) / 16.0
        self.labels = torch.from_numpy(labels)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if self.augment:
            dy, dx = (int(v) for v in torch.randint(-1, 2, (2,)))
            image = torch.roll(image, shifts=(dy, dx), dims=(1, 2))
            noise = np.random.normal(0.0, 0.05, size=image.shape).astype(np.float32)
            image = (image + torch.from_numpy(noise)) * random.uniform(0.9, 1.1)
        return image, self.labels[index]


class SmallCnn(nn.Module):
    def __init__(self, channels: int, dropout: float) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * channels * 16, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # type: ignore[no-any-return]


def make_optimizer(name: str, params: Any, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer must be sgd or adam (got {name!r})")


def build(config: dict[str, Any]) -> Job:
    model = SmallCnn(int(config.get("channels", 8)), float(config.get("dropout", 0.2)))
    optimizer = make_optimizer(
        str(config.get("optimizer", "sgd")),
        model.parameters(),
        float(config.get("lr", 0.05)),
        float(config.get("momentum", 0.9)),
    )
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, int(config.get("lr_step", 100)), float(config.get("lr_gamma", 0.5))
    )
    return Job(
        model=model,
        optimizer=optimizer,
        dataset=Digits(bool(config.get("augment", True))),
        loss=nn.CrossEntropyLoss(),
        lr_scheduler=scheduler,
    )
