"""A small CNN with dropout, BatchNorm and random augmentation on scikit-learn's digits.

1,797 8×8 images that ship with scikit-learn (no download). Augmentation draws
from all three global generators — a random shift (torch), pixel noise (NumPy)
and a brightness factor (Python `random`) — so it shows that each logical
loader worker's state travels with the batch it builds.

Config: lr (0.05), momentum (0.9), optimizer ("sgd" or "adam"), channels (8),
dropout (0.2), augment (true), lr_step (100), lr_gamma (0.5), holdout (0): samples
kept out of training (a fixed split) to measure accuracy on:

    python -m gearshift.examples.digits_cnn evaluate --checkpoint-dir DIR --config JSON

prints the held-out accuracy of the newest checkpoint in DIR as JSON.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gearshift.worker.runtime import checkpoint
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


HOLDOUT_SEED = 20231112  # the split never changes, whatever the job's seed


def split(total: int, holdout: int) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, held-out indices): a fixed permutation, drawn from a generator of
    its own so that no global random state moves."""
    if not 0 <= holdout < total:
        raise ValueError(f"holdout must be between 0 and {total - 1} (got {holdout})")
    order = np.random.default_rng(HOLDOUT_SEED).permutation(total)
    return np.sort(order[: total - holdout]), np.sort(order[total - holdout :])


class Digits:
    """Map-style digits: (1×8×8 float image in [0, 1], label), the training part of the split."""

    def __init__(self, augment: bool, holdout: int = 0, held_out: bool = False) -> None:
        images, labels = load_digits()
        train, test = split(len(labels), holdout)
        keep = test if held_out else train
        self.images = torch.from_numpy(images[keep]).unsqueeze(1) / 16.0
        self.labels = torch.from_numpy(labels[keep])
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
        dataset=Digits(bool(config.get("augment", True)), int(config.get("holdout", 0))),
        loss=nn.CrossEntropyLoss(),
        lr_scheduler=scheduler,
    )


def evaluate(checkpoint_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Accuracy of the newest checkpoint's model on the held-out digits (no augmentation)."""
    holdout = int(config.get("holdout", 0))
    if holdout <= 0:
        raise ValueError("the job kept no held-out samples: set holdout in its config")
    path = checkpoint.latest(checkpoint_dir)
    if path is None:
        raise ValueError(f"no checkpoint in {checkpoint_dir}")
    payload = checkpoint.load(path)
    model = build(config).model
    model.load_state_dict(payload["model"])
    model.eval()
    data = Digits(augment=False, holdout=holdout, held_out=True)
    with torch.no_grad():
        predicted = model(data.images).argmax(dim=1)
    correct = int((predicted == data.labels).sum())
    return {
        "accuracy": correct / len(data),
        "correct": correct,
        "samples": len(data),
        "step": int(payload["step"]),
        "checkpoint": str(path),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gearshift.examples.digits_cnn",
        description="Held-out accuracy of a digits CNN checkpoint.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help="accuracy of the newest checkpoint on held-out digits")
    ev.add_argument("--checkpoint-dir", type=Path, required=True)
    ev.add_argument("--config", default="{}", help="the job's config (JSON object)")
    args = parser.parse_args(argv)
    try:
        result = evaluate(args.checkpoint_dir, json.loads(args.config))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
