"""BatchNorm buffers follow DDP: each EST's forward starts from the step's buffers; EST 0's win."""

from __future__ import annotations

import torch

from gearshift.worker.runtime.buffers import BufferKeeper
from gearshift.worker.runtime.digest import tensor_bytes


def buffers_bytes(model: torch.nn.Module) -> list[bytes]:
    return [tensor_bytes(b) for b in model.buffers()]


def test_est_zeros_buffers_win_and_every_est_starts_from_the_same() -> None:
    torch.manual_seed(0)
    batches = [torch.randn(8, 3) * (i + 1) for i in range(3)]
    alone = torch.nn.BatchNorm1d(3)
    start = buffers_bytes(alone)
    alone(batches[0])
    expected = buffers_bytes(alone)

    model = torch.nn.BatchNorm1d(3)
    seen_at_forward = []
    model.register_forward_pre_hook(lambda m, _: seen_at_forward.append(buffers_bytes(m)))
    keeper = BufferKeeper(model, holder_of_first=0, rank=0, procs=1)
    keeper.begin_step()
    for est, batch in enumerate(batches):
        keeper.before_est()
        model(batch)
        keeper.after_est(est)
    assert keeper.messages() == ([], [])
    keeper.end_step()
    assert buffers_bytes(model) == expected
    assert seen_at_forward == [start, start, start]
    assert expected != start


def test_steps_after_steps_keep_ddps_semantics_in_the_reused_tensors() -> None:
    """The step's and EST 0's buffers live in tensors kept from step to step (a float and an
    int64 group, BatchNorm's num_batches_tracked): each step still starts every EST from
    that step's buffers and ends with its EST 0's, as a lone model fed EST 0's batches."""
    torch.manual_seed(1)
    steps = [[torch.randn(8, 3) * (s + e + 1) for e in range(3)] for s in range(3)]
    alone = torch.nn.BatchNorm1d(3)
    model = torch.nn.BatchNorm1d(3)
    seen_at_forward: list[list[bytes]] = []
    model.register_forward_pre_hook(lambda m, _: seen_at_forward.append(buffers_bytes(m)))
    keeper = BufferKeeper(model, holder_of_first=0, rank=0, procs=1)
    for batches in steps:
        start = buffers_bytes(model)
        seen_at_forward.clear()
        keeper.begin_step()
        for est, batch in enumerate(batches):
            keeper.before_est()
            model(batch)
            keeper.after_est(est)
        keeper.end_step()
        alone(batches[0])
        assert seen_at_forward == [start, start, start]
        assert buffers_bytes(model) == buffers_bytes(alone)
    assert model.num_batches_tracked is not None
    assert int(model.num_batches_tracked) == len(steps)
