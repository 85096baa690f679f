"""The job page's loss curve: every step of the job's step log, or the progress events'
points when the log cannot be read (said so on the page)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gearshift.client.dashboard.series import DRAW_BUCKETS, LossPoint, envelope, json_number
from gearshift.client.timeline import ProgressPoint

Json = dict[str, Any]


def loss_curve(
    steps: Sequence[LossPoint] | str,
    progress: Sequence[ProgressPoint],
    buckets: int = DRAW_BUCKETS,
) -> Json:
    """Loss by step as [step, loss] pairs to draw (an envelope of the step log: see
    series.envelope), with where they came from; `steps` is the step log or why it could
    not be read. The progress events stand in when the log has no step."""
    if isinstance(steps, str) or not steps:
        note = (
            f"from progress events (the step log: {steps})"
            if isinstance(steps, str)
            else "from progress events (no step log yet)"
        )
        points = [LossPoint(p.step, p.time, p.loss) for p in progress]
        return {
            "source": "progress",
            "note": note if points else "",
            "steps": len(points),
            "points": [[p.step, json_number(p.loss)] for p in points],
        }
    drawn = envelope(steps, buckets)
    return {
        "source": "steps",
        "note": f"every step of the step log ({len(steps)}; {len(drawn)} points drawn)",
        "steps": len(steps),
        "last": [steps[-1].step, json_number(steps[-1].loss)],
        "points": [[p.step, json_number(p.loss)] for p in drawn],
    }
