"""A small transformer language model with dropout on synthetic text (no download).

The text is sampled once from a fixed random bigram model (seeded by `text_seed`,
independent of the job seed), so it has structure to learn. Each sample is a
window of `seq_len + 1` tokens; the model predicts every next token under a
causal mask. Adam and a step LR schedule.

Config: vocab (32), seq_len (16), d_model (32), heads (4), layers (2), dropout (0.1),
lr (3e-3), text_len (20000), text_seed (1234), lr_step (100), lr_gamma (0.5).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from gearshift.worker.runtime.job import Job


def synthetic_text(vocab: int, length: int, seed: int) -> torch.Tensor:
    """Tokens from a bigram model whose rows favour a few successors."""
    rng = np.random.RandomState(seed)
    logits = rng.standard_normal((vocab, vocab)) * 3.0
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    tokens = np.empty(length, dtype=np.int64)
    tokens[0] = 0
    for i in range(1, length):
        tokens[i] = rng.choice(vocab, p=probs[tokens[i - 1]])
    return torch.from_numpy(tokens)


class Windows:
    """(tokens[i : i+L], tokens[i+1 : i+L+1]) for non-overlapping windows."""

    def __init__(self, text: torch.Tensor, seq_len: int) -> None:
        self.text = text
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.text) - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.seq_len
        chunk = self.text[start : start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


class TinyLm(nn.Module):
    def __init__(
        self, vocab: int, seq_len: int, *, d_model: int, heads: int, layers: int, dropout: float
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, 2 * d_model, dropout=dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        hidden = self.encoder(
            self.embed(tokens) + self.position[:length], mask=mask, is_causal=True
        )
        return self.head(hidden)  # type: ignore[no-any-return]


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build(config: dict[str, Any]) -> Job:
    vocab = int(config.get("vocab", 32))
    seq_len = int(config.get("seq_len", 16))
    text = synthetic_text(
        vocab, int(config.get("text_len", 20000)), int(config.get("text_seed", 1234))
    )
    model = TinyLm(
        vocab,
        seq_len,
        d_model=int(config.get("d_model", 32)),
        heads=int(config.get("heads", 4)),
        layers=int(config.get("layers", 2)),
        dropout=float(config.get("dropout", 0.1)),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config.get("lr", 3e-3)))
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, int(config.get("lr_step", 100)), float(config.get("lr_gamma", 0.5))
    )
    return Job(
        model=model,
        optimizer=optimizer,
        dataset=Windows(text, seq_len),
        loss=next_token_loss,
        lr_scheduler=scheduler,
    )
