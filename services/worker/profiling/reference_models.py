"""The paper's three models as torch.nn modules, from their published architectures.

VGG-16 (Simonyan & Zisserman 2015, configuration D), Wide ResNet-101-2 (Zagoruyko &
Komodakis 2016: ResNet-101's bottlenecks with twice the inner width) and Inception-v3
(Szegedy et al. 2016, without the auxiliary classifier). Written here, not downloaded, so
that the profiler can trace real branching graphs (residual additions, concatenations)
without weights; build them on the meta device to inspect them without memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(num_classes: int = 1000) -> nn.Sequential:
    layers: list[nn.Module] = []
    channels = 3
    for item in _VGG16:
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            assert isinstance(item, int)
            layers += [nn.Conv2d(channels, item, 3, padding=1), nn.ReLU()]
            channels = item
    layers += [nn.AdaptiveAvgPool2d(7), nn.Flatten()]
    for fan_in, fan_out in ((512 * 7 * 7, 4096), (4096, 4096)):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU(), nn.Dropout()]
    layers.append(nn.Linear(4096, num_classes))
    return nn.Sequential(*layers)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand x4; the shortcut is added."""

    def __init__(self, inplanes: int, planes: int, width: int, stride: int = 1):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        out: torch.Tensor = self.relu(y + shortcut)
        return out


def wide_resnet101_2(num_classes: int = 1000) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, padding=1),
    ]
    inplanes = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, planes * 2, stride if i == 0 else 1))
            inplanes = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes)]
    return nn.Sequential(*layers)


def _conv(cin: int, cout: int, kernel: int | tuple[int, int], **kw: object) -> nn.Sequential:
    """Inception's basic unit: convolution without bias, BatchNorm, ReLU."""
    conv = nn.Conv2d(cin, cout, kernel, bias=False, **kw)  # type: ignore[arg-type]
    return nn.Sequential(conv, nn.BatchNorm2d(cout, eps=0.001), nn.ReLU())


class _Branches(nn.Module):
    """Run every branch on the same input and concatenate along channels."""

    def __init__(self, branches: Sequence[nn.Module]):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], 1)


_ROW, _COL = (1, 7), (7, 1)


def _block_a(cin: int, pool: int) -> _Branches:
    return _Branches(
        [
            _conv(cin, 64, 1),
            nn.Sequential(_conv(cin, 48, 1), _conv(48, 64, 5, padding=2)),
            nn.Sequential(
                _conv(cin, 64, 1), _conv(64, 96, 3, padding=1), _conv(96, 96, 3, padding=1)
            ),
            nn.Sequential(nn.AvgPool2d(3, 1, padding=1), _conv(cin, pool, 1)),
        ]
    )


def _block_b(cin: int) -> _Branches:
    return _Branches(
        [
            _conv(cin, 384, 3, stride=2),
            nn.Sequential(
                _conv(cin, 64, 1), _conv(64, 96, 3, padding=1), _conv(96, 96, 3, stride=2)
            ),
            nn.MaxPool2d(3, 2),
        ]
    )


def _block_c(cin: int, c7: int) -> _Branches:
    def row(a: int, b: int) -> nn.Sequential:
        return _conv(a, b, _ROW, padding=(0, 3))

    def col(a: int, b: int) -> nn.Sequential:
        return _conv(a, b, _COL, padding=(3, 0))

    return _Branches(
        [
            _conv(cin, 192, 1),
            nn.Sequential(_conv(cin, c7, 1), row(c7, c7), col(c7, 192)),
            nn.Sequential(_conv(cin, c7, 1), col(c7, c7), row(c7, c7), col(c7, c7), row(c7, 192)),
            nn.Sequential(nn.AvgPool2d(3, 1, padding=1), _conv(cin, 192, 1)),
        ]
    )


def _block_d(cin: int) -> _Branches:
    return _Branches(
        [
            nn.Sequential(_conv(cin, 192, 1), _conv(192, 320, 3, stride=2)),
            nn.Sequential(
                _conv(cin, 192, 1),
                _conv(192, 192, _ROW, padding=(0, 3)),
                _conv(192, 192, _COL, padding=(3, 0)),
                _conv(192, 192, 3, stride=2),
            ),
            nn.MaxPool2d(3, 2),
        ]
    )


def _split(cin: int) -> _Branches:
    """Inception-v3's widened 3x3: a 1x3 and a 3x1 side by side."""
    return _Branches(
        [_conv(cin, 384, (1, 3), padding=(0, 1)), _conv(cin, 384, (3, 1), padding=(1, 0))]
    )


def _block_e(cin: int) -> _Branches:
    return _Branches(
        [
            _conv(cin, 320, 1),
            nn.Sequential(_conv(cin, 384, 1), _split(384)),
            nn.Sequential(_conv(cin, 448, 1), _conv(448, 384, 3, padding=1), _split(384)),
            nn.Sequential(nn.AvgPool2d(3, 1, padding=1), _conv(cin, 192, 1)),
        ]
    )


def inception_v3(num_classes: int = 1000) -> nn.Sequential:
    """Inception-v3 for 299 x 299 inputs (75 x 75 is the smallest that fits)."""
    return nn.Sequential(
        _conv(3, 32, 3, stride=2),
        _conv(32, 32, 3),
        _conv(32, 64, 3, padding=1),
        nn.MaxPool2d(3, 2),
        _conv(64, 80, 1),
        _conv(80, 192, 3),
        nn.MaxPool2d(3, 2),
        _block_a(192, 32),
        _block_a(256, 64),
        _block_a(288, 64),
        _block_b(288),
        _block_c(768, 128),
        _block_c(768, 160),
        _block_c(768, 160),
        _block_c(768, 192),
        _block_d(768),
        _block_e(1280),
        _block_e(2048),
        nn.AdaptiveAvgPool2d(1),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Linear(2048, num_classes),
    )
