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


class GradTaker:
    """Takes each EST's gradient off the parameters, knowing which ones its loss reached.

    A parameter the loss did not reach counts as a zero gradient, in every EST and
    every placement alike: when the backward accumulated into a partial sum (see
    `Reducer.accumulate_into`), such a parameter gets +0.0 added, which is what
    adding a zero gradient later would have done (-0.0 + 0.0 = +0.0).

    Autograd accumulates into an existing .grad in place, which bumps the tensor's
    version counter (or, where it cannot, replaces .grad): comparing versions tells
    which parameters were reached without a Python hook per parameter per backward.
    """

    def __init__(self, layout: GradLayout) -> None:
        self.layout = layout
        self._into: Grads | None = None
        self._versions: list[int] = []

    def prepare(self, into: Grads | None) -> None:
        """Before a backward: start from nothing, or accumulate into `into`."""
        self._into = into
        if into is None:
            for p in self.layout.params:
                p.grad = None
            return
        self._versions = [grad._version for grad in into]
        for p, grad in zip(self.layout.params, into, strict=True):
            p.grad = grad

    def take(self) -> Grads:
        """The gradients of the backward just run; the parameters are cleared."""
        out = []
        into = self._into
        for i, p in enumerate(self.layout.params):
            grad = p.grad
            if grad is None:
                grad = torch.zeros_like(p)
            elif into is not None and grad is into[i] and grad._version == self._versions[i]:
                grad.add_(0.0)  # not reached: the partial sum plus a zero gradient
            out.append(grad)
            p.grad = None
        self._into = None
        return out


def add_(left: Grads, right: Grads) -> Grads:
    """left += right, element by element (the only arithmetic of the reduction)."""
    torch._foreach_add_(left, right)
    return left
