"""The Wide&Deep model, split into sparse rows (on the PS) and a dense net.

Each embedding row has `dim` deep columns and one wide column: the wide logit is
the sum of the wide columns of a sample's ids, the deep logit an MLP over the
concatenated deep columns and the dense features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gearshift.worker.ps.sharding import shard_ids


@dataclass(frozen=True)
class ModelConfig:
    dim: int = 8
    hidden: tuple[int, ...] = (64, 32)
    lr: float = 0.05  # Adagrad, sparse rows and dense net alike
    init_std: float = 0.01

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"ModelConfig.dim must be >= 1, got {self.dim}")
        if self.lr <= 0:
            raise ValueError(f"ModelConfig.lr must be > 0, got {self.lr}")

    @property
    def width(self) -> int:
        """Columns of an embedding row: deep columns + the wide weight."""
        return self.dim + 1


class DenseNet(nn.Module):
    """The deep tower over [deep columns of every field, dense features]."""

    def __init__(self, cfg: ModelConfig, fields: int, dense: int, seed: int) -> None:
        super().__init__()
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        width = fields * cfg.dim + dense
        for h in cfg.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        torch.random.set_rng_state(gen_state)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Logits [batch] from emb [batch, fields, dim + 1] and dense [batch, dense]."""
        wide = emb[..., -1].sum(dim=1)
        deep = torch.cat([emb[..., :-1].flatten(1), dense], dim=1)
        logits: torch.Tensor = self.mlp(deep).squeeze(1) + wide
        return logits


def init_rows(total: int, shard: int, n: int, cfg: ModelConfig, seed: int) -> torch.Tensor:
    """Initial rows of PS `shard` of `n`: each row a function of (seed, row id) only,

    so the initial table does not depend on the PS count.
    """
    ids = shard_ids(total, shard, n)
    # A cheap counter-based hash of (seed, id) -> normal values; no generator state
    # to share between PSs.
    cols = torch.arange(cfg.width, dtype=torch.int64)
    x = (ids[:, None] * 1_000_003 + cols[None, :] * 7_919 + seed * 104_729) % 2_147_483_647
    x = (x * 48_271) % 2_147_483_647
    u1 = (x.double() + 1.0) / 2_147_483_648.0
    x = (x * 48_271) % 2_147_483_647
    u2 = (x.double() + 1.0) / 2_147_483_648.0
    normal = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)
    return (normal * cfg.init_std).float()
