"""Per-EST gradients: taking them off the parameters, and the flat index space they are cut in.

A gradient is a list of tensors, one per trainable parameter (in model order).
For exchange, the parameters are laid end to end in that order and the flat
range is split into one contiguous chunk per process. The layout depends only on
the model, so there is no bucket layout to persist across restarts (EasyScale's
D1 has to keep DDP's), and every sum is element-wise, so cutting changes no bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gearshift.common.errors import ValidationError

Grads = list[torch.Tensor]


class GradLayout:
    """The trainable parameters' flat index space."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        if not params:
            raise ValidationError("job.model", "has no parameter that requires a gradient")
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) > 1:
            raise ValidationError(
                "job.model",
                "trainable parameters must share one dtype and device "
                f"(found {sorted(map(str, kinds))})",
            )
        self.params = list(params)
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.total = sum(self.numels)

    @property
    def nbytes(self) -> int:
        return self.total * self.params[0].element_size()

    def chunks(self, procs: int) -> list[tuple[int, int]]:
        """[start, end) of each process's chunk."""
        return [(p * self.total // procs, (p + 1) * self.total // procs) for p in range(procs)]

    def segments(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(parameter, lo, hi) pieces of the flat range [start, end)."""
        out = []
        for i, (offset, numel) in enumerate(zip(self.offsets, self.numels, strict=True)):
            lo, hi = max(start, offset), min(end, offset + numel)
            if lo < hi:
                out.append((i, lo - offset, hi - offset))
        return out

    def pack(self, grads: Grads, start: int, end: int) -> torch.Tensor:
        """A new contiguous tensor holding the flat range [start, end) of `grads`."""
        pieces = [grads[i].reshape(-1)[lo:hi] for i, lo, hi in self.segments(start, end)]
        if not pieces:
            return torch.empty(0, dtype=self.dtype, device=self.device)
        return torch.cat(pieces)

    def views(self, flat: torch.Tensor) -> Grads:
        """Per-parameter views of a flat tensor of the whole space."""
        return [
            flat[offset : offset + numel].view_as(p)
            for p, offset, numel in zip(self.params, self.offsets, self.numels, strict=True)
        ]


def take_grads(layout: GradLayout) -> Grads:
    """The gradients the last backward left on the parameters, which are cleared.

    A parameter the loss did not reach counts as a zero gradient, in every EST
    and every placement alike.
    """
    out = []
    for p in layout.params:
        grad = p.grad
        out.append(torch.zeros_like(p) if grad is None else grad)
        p.grad = None
    return out


def add_(left: Grads, right: Grads) -> Grads:
    """left += right, element by element (the only arithmetic of the reduction)."""
    torch._foreach_add_(left, right)
    return left
