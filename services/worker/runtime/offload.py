"""Optimizer-state offload (Rubick's ZeRO-Offload dimension, for one process): on a GPU the
optimizer's state and its step live in host memory, so the device holds only parameters,
gradients and activations.

The job's optimizer is kept, but its param groups are pointed at pinned host copies of
the parameters: each step copies the gradients to the host, steps there, and copies the
parameters back. The state_dict keeps its layout (state by parameter index), so a
checkpoint taken with offload resumes without it and the other way round (PyTorch's
`load_state_dict` moves the state to its parameters' device).

The optimizer's arithmetic then runs on the CPU instead of the GPU: the bits of an
offloaded step are those of a CPU step, not of the same step on the GPU. On the CPU
the optimizer steps on the host anyway, and offload does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class HostOptimizer:
    """Steps `optimizer` on pinned host copies of `params` (which live on a GPU)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        self.optimizer = optimizer
        self.params = list(params)
        self.host: list[torch.nn.Parameter] = []
        by_id: dict[int, torch.nn.Parameter] = {}
        for param in params:
            copy = torch.empty(param.shape, dtype=param.dtype, pin_memory=True)
            copy.copy_(param.detach())
            host = torch.nn.Parameter(copy, requires_grad=param.requires_grad)
            self.host.append(host)
            by_id[id(param)] = host
        for group in optimizer.param_groups:
            group["params"] = [by_id.get(id(p), p) for p in group["params"]]
        # State a resumed optimizer already holds goes to the host with its parameters.
        for param, host in zip(params, self.host, strict=True):
            if param in optimizer.state:
                state = optimizer.state.pop(param)
                optimizer.state[host] = {
                    k: v.to("cpu") if isinstance(v, torch.Tensor) else v for k, v in state.items()
                }

    def step(self) -> None:
        for param, host in zip(self.params, self.host, strict=True):
            host.grad = None if param.grad is None else param.grad.to("cpu")
        self.optimizer.step()
        with torch.no_grad():
            for param, host in zip(self.params, self.host, strict=True):
                param.copy_(host, non_blocking=True)
                host.grad = None
        torch.cuda.current_stream().synchronize()
