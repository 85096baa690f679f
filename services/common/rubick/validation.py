"""The paper's model validation (section 7.1, Table 2) over the shared measurements.

Per model: fit on 7 single-node runs (the paper profiles 7 runs on one 8-GPU server, >= 3 of
them ZeRO-Offload), predict every other measured (plan, placement), and report the mean and
max relative error per plan family. The 7 runs are the profile's; a profile with fewer is
completed from the placements file's single-node runs: ZeRO-Offload ones until there are 3,
then one run of each plan family the profile lacks, most GPUs first (deterministic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gearshift.common.rubick.data import Measurement, ModelData
from gearshift.common.rubick.model import A800, Env, Fit, fit, relative_errors
from gearshift.common.rubick.plans import Plan, Zero

FIT_RUNS = 7
MIN_OFFLOAD = 3

# Table 2 (avg, max) per model and plan family, as fractions; None = OOM in the paper.
TABLE2: dict[str, dict[str, tuple[float, float] | None]] = {
    "vit": {"dp": (0.0363, 0.0683), "gc": (0.0259, 0.0619), "zero-dp": (0.0423, 0.0667),
            "zero-offload": (0.0300, 0.0832)},
    "roberta": {"dp": (0.0221, 0.0437), "gc": (0.0336, 0.0429), "zero-dp": (0.0359, 0.0671),
                "zero-offload": (0.0742, 0.1044)},
    "bert": {"dp": (0.0527, 0.0832), "gc": (0.0490, 0.0727), "zero-dp": (0.037, 0.0690),
             "zero-offload": (0.0637, 0.0862)},
    "t5": {"tp+pp": (0.0318, 0.0824), "dp+tp+pp": (0.0241, 0.0955),
           "zero-dp": (0.0671, 0.0955), "zero-offload": (0.0437, 0.0634)},
    "gpt2": {"tp+pp": (0.0239, 0.0308), "dp+tp+pp": (0.0280, 0.0415),
             "zero-dp": (0.0252, 0.0386), "zero-offload": (0.0552, 0.0890)},
    "llama7b": {"tp+pp": (0.0190, 0.0290), "dp+tp+pp": (0.0470, 0.0945), "zero-dp": None,
                "zero-offload": (0.0409, 0.0638)},
    "llama30b": {"tp+pp": (0.0429, 0.0852), "dp+tp+pp": (0.0615, 0.0969), "zero-dp": None,
                 "zero-offload": None},
}  # fmt: skip


def family(plan: Plan) -> str:
    """Table 2's column for a plan."""
    if plan.tp > 1 or plan.pp > 1:
        return "dp+tp+pp" if plan.dp > 1 else "tp+pp"
    if plan.zero is Zero.OFFLOAD:
        return "zero-offload"
    if plan.zero is Zero.DP:
        return "zero-dp"
    return "gc" if plan.gc else "dp"


def fit_runs(data: ModelData) -> list[Measurement]:
    """The 7 runs to fit on (see the module docstring); fewer when the data hold fewer."""
    chosen = list(data.profiled)
    seen = {m.config for m in chosen}
    single = sorted(
        (m for m in data.placements if len(m.config.resources.placement) == 1),
        key=lambda m: -m.config.resources.gpus,
    )

    def add(m: Measurement) -> None:
        if len(chosen) < FIT_RUNS and m.config not in seen:
            chosen.append(m)
            seen.add(m.config)

    for m in single:
        if sum(c.config.plan.zero is Zero.OFFLOAD for c in chosen) >= MIN_OFFLOAD:
            break
        if m.config.plan.zero is Zero.OFFLOAD:
            add(m)
    for m in single:
        if family(m.config.plan) not in {family(c.config.plan) for c in chosen}:
            add(m)
    for m in single:
        add(m)
    return chosen[:FIT_RUNS]


@dataclass(frozen=True)
class ModelReport:
    """One model's fit and its errors per plan family (fractions)."""

    model: str
    fit: Fit | None
    errors: dict[str, np.ndarray]
    note: str = ""


def validate(data: ModelData, env: Env = A800, *, families: Sequence[str] = ()) -> ModelReport:
    """Fit on 7 runs, predict the rest of the placements file (only `families` if given)."""
    model = data.workload.name
    runs = fit_runs(data)
    offload = sum(m.config.plan.zero is Zero.OFFLOAD for m in runs)
    if len(runs) < FIT_RUNS or offload < MIN_OFFLOAD:
        note = f"{len(runs)} runs ({offload} ZeRO-Offload) to fit: the model needs 7 (3)"
        return ModelReport(model, None, {}, note)
    fitted = fit(data.workload, [m.config for m in runs], [m.iter_ms for m in runs], env)
    seen = {m.config for m in runs}
    rest = [m for m in data.placements if m.config not in seen]
    if families:
        rest = [m for m in rest if family(m.config.plan) in families]
    errs = relative_errors(
        fitted.params, data.workload, [m.config for m in rest], [m.iter_ms for m in rest], env
    )
    by_family: dict[str, list[float]] = {}
    for m, e in zip(rest, errs, strict=True):
        by_family.setdefault(family(m.config.plan), []).append(float(e))
    return ModelReport(model, fitted, {k: np.array(v) for k, v in by_family.items()})
