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
