"""Gradient checkpointing keeps every byte: gradients, BatchNorm buffers, the RNG stream."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gearshift.worker.runtime import recompute
from gearshift.worker.runtime.digest import differences


class Net(nn.Module):
    """Dropout, BatchNorm, and a ModuleList whose members are the segments."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3))
        self.blocks = nn.ModuleList([nn.Linear(16, 16)])
        self.last = nn.Sequential(nn.Dropout(0.3), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.blocks[0](self.first(x)))  # type: ignore[no-any-return]


def model() -> Net:
    torch.manual_seed(3)
    return Net()


def step(net: Net) -> dict[str, object]:
    """One training forward and backward from a fixed RNG state; what it leaves behind."""
    torch.manual_seed(11)
    x = torch.randn(32, 8)
    net(x).square().mean().backward()
    grads = [p.grad for p in net.parameters()]
    return {"state": net.state_dict(), "grads": grads, "rng": torch.get_rng_state()}


def test_segments_go_through_containers() -> None:
    net = model()
    assert recompute.segments(net) == [net.first, net.blocks[0], net.last]


def test_checkpointed_training_step_is_bitwise_the_plain_one() -> None:
    plain = model()
    gc = copy.deepcopy(plain)
    assert recompute.enable(gc) == 3
    assert recompute.enable(gc) == 0  # already wrapped
    assert differences(step(plain), step(gc)) == []
    recompute.disable(gc)
    assert "forward" not in vars(gc.first)


def test_without_putting_buffers_back_the_recomputation_counts_batchnorm_twice() -> None:
    """What recompute.py guards against: plain checkpointing updates running stats again."""
    plain = model()
    naive = copy.deepcopy(plain)
    inner = naive.first.forward
    naive.first.forward = lambda x: checkpoint(inner, x, use_reentrant=False)  # type: ignore[method-assign]
    found = differences(step(plain), step(naive))
    assert "/state/first.1.num_batches_tracked: bytes differ" in found


def test_evaluation_runs_without_checkpointing() -> None:
    net = model()
    recompute.enable(net)
    net.eval()
    with torch.no_grad():
        out = net(torch.randn(4, 8))
    assert out.shape == (4, 4)
