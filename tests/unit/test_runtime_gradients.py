"""Taking EST gradients: accumulating into a partial sum gives the bytes of adding later."""

from __future__ import annotations

import torch

from gearshift.worker.runtime.digest import tensor_bytes
from gearshift.worker.runtime.gradients import GradLayout, GradTaker, add_


class TwoBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))
        self.u = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor, branch: str) -> torch.Tensor:
        return (self.w * x).sum() if branch == "w" else (self.u * x).sum()


def backward(model: TwoBranches, branch: str) -> None:
    # d/dw (w * x).sum() = x, so the gradient holds a -0.0.
    model(torch.tensor([-0.0, 1.0]), branch).backward()


def test_a_parameter_the_loss_did_not_reach_gets_plus_zero_either_way() -> None:
    model = TwoBranches()
    taker = GradTaker(GradLayout(list(model.parameters())))
    taker.prepare(None)
    backward(model, "w")
    first = taker.take()
    assert tensor_bytes(first[0]) == tensor_bytes(torch.tensor([-0.0, 1.0]))
    assert tensor_bytes(first[1]) == tensor_bytes(torch.zeros(2))  # u was not reached

    taker.prepare(None)
    backward(model, "u")
    later = add_([g.clone() for g in first], taker.take())

    taker.prepare([g.clone() for g in first])
    backward(model, "u")
    fused = taker.take()
    assert [tensor_bytes(g) for g in fused] == [tensor_bytes(g) for g in later]
    assert tensor_bytes(fused[0]) == tensor_bytes(torch.tensor([0.0, 1.0]))  # -0.0 + 0.0
    assert all(p.grad is None for p in model.parameters())


def test_a_reached_parameter_is_not_added_to_again() -> None:
    """The version counter, not the value, says whether the backward reached a parameter:
    a reached gradient of -0.0 added into -0.0 stays -0.0 (a second +0.0 would flip it)."""
    model = TwoBranches()
    taker = GradTaker(GradLayout(list(model.parameters())))
    into = [torch.tensor([-0.0, 0.0]), torch.tensor([-0.0, 0.0])]
    taker.prepare(into)
    backward(model, "w")
    fused = taker.take()
    assert fused[0] is into[0]
    assert tensor_bytes(fused[0]) == tensor_bytes(torch.tensor([-0.0, 1.0]))
    assert tensor_bytes(fused[1]) == tensor_bytes(torch.tensor([0.0, 0.0]))  # not reached
