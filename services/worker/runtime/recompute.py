"""Gradient checkpointing (Rubick's GC plan dimension) that keeps the bits of a run without it.

Each segment of the model — its top-level children; the members of a ModuleList or
ModuleDict, which are never called themselves — runs under
`torch.utils.checkpoint.checkpoint(use_reentrant=False, preserve_rng_state=True)`: its
activations are dropped after the forward pass and recomputed in the backward pass.
The recomputation sees the same inputs and the same RNG state (dropout draws the same
masks) and `fork_rng` puts the generator back afterwards, so each EST's random stream
advances exactly as without GC.

One thing would still differ: a norm layer that tracks running statistics (BatchNorm)
updates them on every training-mode forward, so the recomputation would update them a
second time. The segment's buffers are therefore put back after its recomputation as the
forward pass left them. (Turning the tracking off during the recomputation instead would
save other tensors than the forward pass did, which checkpoint refuses.)

The wrapping sets an instance `forward`, so the model's state_dict and parameters are
unchanged: a checkpoint taken with GC on resumes with it off and the other way round.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_ORIGINAL = "_gearshift_forward"


def segments(model: nn.Module) -> list[nn.Module]:
    """The modules checkpointed one by one: top-level children, through containers."""
    found: list[nn.Module] = []
    for child in model.children():
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            found.extend(segments(child))
        else:
            found.append(child)
    return found


@contextlib.contextmanager
def _kept_buffers(module: nn.Module) -> Iterator[None]:
    """The buffers of `module` (running statistics) are put back as they were on exit."""
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _checkpointed(module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
    def contexts() -> tuple[
        contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]
    ]:
        return contextlib.nullcontext(), _kept_buffers(module)

    def run(*args: Any, **kwargs: Any) -> Any:
        if not (module.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        return checkpoint(
            forward,
            *args,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=contexts,
            **kwargs,
        )

    return run


def enable(model: nn.Module) -> int:
    """Checkpoint every segment of `model` in training; returns how many were wrapped."""
    wrapped = 0
    for module in segments(model):
        if _ORIGINAL in vars(module):
            continue
        forward = module.forward
        object.__setattr__(module, _ORIGINAL, forward)
        object.__setattr__(module, "forward", _checkpointed(module, forward))
        wrapped += 1
    return wrapped


def disable(model: nn.Module) -> None:
    """Undo `enable`: every segment runs its own forward again."""
    for module in segments(model):
        if _ORIGINAL in vars(module):
            del module.__dict__["forward"]
            del module.__dict__[_ORIGINAL]
