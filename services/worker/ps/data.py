"""Synthetic click data, generated on the fly from a seed (nothing ships as files).

Each sample has `fields` categorical ids drawn from a Zipf-like distribution over
`vocab` ids per field, plus `dense` Gaussian features; the label is Bernoulli of a
hidden logistic model (one weight per id, one per dense feature), so a model can
learn it. Samples come in blocks of `batch` samples; block k of the training set and
of the held-out set are pure functions of (seed, split, k), so any process can
produce any batch without coordination.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TRAIN = 0
HELDOUT = 1


@dataclass(frozen=True)
class ClickConfig:
    """Shape of the synthetic click dataset."""

    seed: int = 0
    fields: int = 8
    vocab: int = 50_000  # ids per field
    dense: int = 4
    batch: int = 256
    train_blocks: int = 400  # training set = train_blocks * batch samples
    zipf: float = 1.1  # exponent of the id distribution (larger = more skewed)

    def __post_init__(self) -> None:
        for name in ("fields", "vocab", "dense", "batch", "train_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"ClickConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.zipf <= 1.0:
            raise ValueError(f"ClickConfig.zipf must be > 1, got {self.zipf}")

    @property
    def rows(self) -> int:
        """Rows of the one embedding table (every field's ids side by side)."""
        return self.fields * self.vocab

    @property
    def train_size(self) -> int:
        return self.train_blocks * self.batch


@dataclass(frozen=True)
class Batch:
    ids: np.ndarray  # [batch, fields] int64, global row ids (field offset added)
    dense: np.ndarray  # [batch, dense] float32
    labels: np.ndarray  # [batch] float32 in {0, 1}


class ClickData:
    """The generator: hidden model drawn once from the seed, blocks on demand."""

    def __init__(self, cfg: ClickConfig) -> None:
        self.cfg = cfg
        rng = np.random.default_rng([cfg.seed, 7])
        # A permutation per field so that hot ids are spread over the id range (and so
        # over the PS shards) rather than being the smallest ids.
        self._perm = np.stack([rng.permutation(cfg.vocab) for _ in range(cfg.fields)])
        self._w_ids = rng.normal(0.0, 0.8, size=(cfg.fields, cfg.vocab)).astype(np.float32)
        self._w_dense = rng.normal(0.0, 0.8, size=cfg.dense).astype(np.float32)
        self._bias = np.float32(-0.5)

    def block(self, k: int, split: int = TRAIN) -> Batch:
        """Block k of a split: `batch` samples, the same for every caller."""
        cfg = self.cfg
        if split == TRAIN and not 0 <= k < cfg.train_blocks:
            raise ValueError(f"train block {k} outside 0..{cfg.train_blocks - 1}")
        rng = np.random.default_rng([cfg.seed, split, k])
        ranks = rng.zipf(cfg.zipf, size=(cfg.batch, cfg.fields)) - 1
        ranks = np.minimum(ranks, cfg.vocab - 1)
        field = np.arange(cfg.fields)
        local = self._perm[field, ranks]  # [batch, fields]
        dense = rng.normal(0.0, 1.0, size=(cfg.batch, cfg.dense)).astype(np.float32)
        logit = self._w_ids[field, local].sum(axis=1) + dense @ self._w_dense + self._bias
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(cfg.batch) < prob).astype(np.float32)
        ids = (local + field * cfg.vocab).astype(np.int64)
        return Batch(ids=ids, dense=dense, labels=labels)

    def train_batch(self, number: int) -> tuple[int, Batch]:
        """The global batch `number` of the training stream: (epoch, batch).

        Each epoch visits every training block once, in an order shuffled with
        (seed, epoch); the batch number alone decides the data, whichever worker
        claims it.
        """
        if number < 0:
            raise ValueError(f"batch number must be >= 0, got {number}")
        epoch, pos = divmod(number, self.cfg.train_blocks)
        order = np.random.default_rng([self.cfg.seed, 99, epoch]).permutation(self.cfg.train_blocks)
        return epoch, self.block(int(order[pos]))

    def heldout(self, blocks: int) -> Batch:
        """The first `blocks` held-out blocks, concatenated."""
        parts = [self.block(k, HELDOUT) for k in range(blocks)]
        return Batch(
            ids=np.concatenate([p.ids for p in parts]),
            dense=np.concatenate([p.dense for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
        )
