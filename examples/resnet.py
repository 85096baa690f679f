"""A ResNet-style CNN on synthetic images (no download): big enough to keep a GPU busy.

Residual stages of 3×3 convolutions with BatchNorm (each stage halves the resolution and
doubles the width, a 1×1 projection where the shape changes), global average pooling,
dropout and a linear head; SGD with momentum and a step LR schedule. With
`{"width": 64, "blocks": [2, 2, 2, 2], "image": 32}` it is the ResNet-18 layout for
32×32 inputs (11.2 M parameters); the defaults are tiny, for CPU tests.

The images are drawn once from a generator of their own (`data_seed`, not the job seed):
each class has a smooth random pattern, each image is its class's pattern plus noise.
Augmentation (a random shift of up to 2 pixels and a random horizontal flip) draws from
the loader worker's torch generator.

Config: width (8), blocks ([1, 1]), image (16), classes (10), samples (512),
dropout (0.1), augment (true), lr (0.05), momentum (0.9), lr_step (100), lr_gamma (0.5),
data_seed (11).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from gearshift.worker.runtime.job import Job


class SyntheticImages:
    """Map-style (3×S×S float image, label): class patterns plus noise, fixed by `seed`."""

    def __init__(self, samples: int, image: int, classes: int, seed: int, augment: bool) -> None:
        gen = torch.Generator().manual_seed(seed)
        coarse = torch.randn(classes, 3, 4, 4, generator=gen)
        patterns = functional.interpolate(
            coarse, size=(image, image), mode="bilinear", align_corners=False
        )
        self.labels = torch.randint(0, classes, (samples,), generator=gen)
        noise = torch.randn(samples, 3, image, image, generator=gen) * 0.5
        self.images = patterns[self.labels] + noise
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if self.augment:
            shift = torch.randint(-2, 3, (2,))
            image = torch.roll(image, shifts=(int(shift[0]), int(shift[1])), dims=(1, 2))
            if bool(torch.rand(()) < 0.5):
                image = image.flip(-1)
        return image, self.labels[index]


class BasicBlock(nn.Module):
    """Two 3×3 convolutions and a shortcut (a 1×1 projection when the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = functional.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return functional.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, width: int, blocks: list[int], classes: int, dropout: float) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        layers: list[nn.Module] = []
        channels = width
        for stage, count in enumerate(blocks):
            outputs = width * 2**stage
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(BasicBlock(channels, outputs, stride))
                channels = outputs
        self.stages = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(channels, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A mean over the pixels, not AdaptiveAvgPool2d: its CUDA backward has no
        # deterministic implementation (an error under torch.use_deterministic_algorithms).
        pooled = self.stages(self.stem(x)).mean(dim=(2, 3))
        return self.head(pooled)  # type: ignore[no-any-return]


def build(config: dict[str, Any]) -> Job:
    blocks = [int(b) for b in config.get("blocks", [1, 1])]
    if not blocks or min(blocks) < 1:
        raise ValueError(f"blocks must be a non-empty list of counts >= 1 (got {blocks})")
    classes = int(config.get("classes", 10))
    model = ResNet(int(config.get("width", 8)), blocks, classes, float(config.get("dropout", 0.1)))
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=float(config.get("lr", 0.05)),
        momentum=float(config.get("momentum", 0.9)),
        weight_decay=5e-4,
    )
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, int(config.get("lr_step", 100)), float(config.get("lr_gamma", 0.5))
    )
    dataset = SyntheticImages(
        int(config.get("samples", 512)),
        int(config.get("image", 16)),
        classes,
        int(config.get("data_seed", 11)),
        bool(config.get("augment", True)),
    )
    return Job(
        model=model,
        optimizer=optimizer,
        dataset=dataset,
        loss=nn.CrossEntropyLoss(),
        lr_scheduler=scheduler,
    )
