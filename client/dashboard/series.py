"""Long series made short enough to draw, without hiding what matters.

A job's step log holds one loss per global step (thousands). A chart a few hundred
pixels wide shows them through a min/max envelope per bucket of steps: every spike
stays visible, the first and the last step are always kept, and a step whose loss
is not a number (NaN, inf) is kept as a gap rather than dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DRAW_BUCKETS = 500  # about the loss chart's width in pixels


@dataclass(frozen=True)
class LossPoint:
    step: int
    time: float
    loss: float


def envelope(points: Sequence[LossPoint], buckets: int = DRAW_BUCKETS) -> list[LossPoint]:
    """`points` (in step order) as at most about 2 x `buckets` points: per equal span of
    steps, the lowest and the highest loss in step order, and the first non-finite one;
    the first and last points always. Short series come back whole."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1 (got {buckets})")
    if len(points) <= 2 * buckets:
        return list(points)
    first, span = points[0].step, points[-1].step - points[0].step + 1
    groups: dict[int, list[int]] = {}
    for i, point in enumerate(points):
        groups.setdefault((point.step - first) * buckets // span, []).append(i)
    kept: set[int] = {0, len(points) - 1}
    for group in groups.values():
        finite = [i for i in group if math.isfinite(points[i].loss)]
        if finite:
            kept.add(min(finite, key=lambda i: points[i].loss))
            kept.add(max(finite, key=lambda i: points[i].loss))
        if len(finite) < len(group):
            kept.add(next(i for i in group if not math.isfinite(points[i].loss)))
    return [points[i] for i in sorted(kept)]


def json_number(value: float) -> float | None:
    """A float JSON can carry (None for NaN and infinities, which it cannot)."""
    return value if math.isfinite(value) else None
