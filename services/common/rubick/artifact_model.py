"""Eq. 1 as Rubick's artifact computes it, and its joint fit: a named variant of `model`.

The paper's Eq. 1 (`gearshift.common.rubick.model`) is what the scheduler uses. The authors'
validation scripts (artifact/71_performance_model, `pred_throughput.py` at the data's
commit, see shared/data/rubick/README.md) compute something else, and Table 2's errors are
that code's. Written here from its formulas, not copied:

    T_iter = a_f*T_fwd + T_cc + T_opt' + k_const
    T_cc   = f_{k_sync}(T_bwd, T_dp) [+ k_off + T_off under ZeRO-Offload]     (additive)
    T_opt' = T_opt + k_swap + T_off                                            (additive)

- k_off and k_swap are constants in ms added to the offload's overlap, not overlap degrees;
  k_swap is added to every plan's optimizer step, offloaded or not.
- Gradient checkpointing recomputes the forward pass outside the backward's overlap with
  the all-reduce (a_f = 2), where the paper's form adds T_fwd to T_bwd inside it.
- The fit is joint: the profile's T_cc, T_opt and iteration time, each by RMSLE, summed
  (the artifact minimises the sum of the three root-mean-square log errors).

Bandwidths and byte counts are the caller's `Env` (the scripts use per-model ones and
4-byte volumes: `table2.AUTHORS_ENV`). The parameters keep `Params`' names and order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from gearshift.common.rubick.model import Fit, FloatArray, Params, Terms, overlap, rmsle

# Bounds: k_bwd, k_sync as the artifact's (>= 1); the additive constants >= 0 (ms).
ARTIFACT_LOWER = Params(1.0, 1.0, 1e-8, 1e-8, 0.0, 0.0, 1e-8)
ARTIFACT_UPPER = Params(10.0, 100.0, 10.0, 1e3, 1e4, 1e4, 1e4)


@dataclass(frozen=True)
class Parts:
    """Predicted T_cc, T_opt' and iteration time (ms) per config."""

    tcc: FloatArray
    topt: FloatArray
    iter_ms: FloatArray


def parts(params: Params | FloatArray, tm: Terms) -> Parts:
    """The artifact's Eq. 1 over precomputed terms (see the module docstring)."""
    k = params.array() if isinstance(params, Params) else np.asarray(params, dtype=np.float64)
    k_bwd, k_sync, k_opt, k_opt_off, k_off, k_swap, k_const = k
    bwd = k_bwd * tm.fwd
    fwd_part = tm.ga * tm.fwd * (1.0 + tm.gc)
    tcc = (tm.ga - 1) * bwd + overlap(k_sync, bwd, tm.t_dp) + tm.offload * (k_off + tm.t_off)
    t_opt = np.where(tm.offload > 0, k_opt_off * tm.p_over_dc, k_opt * tm.p_over_x)
    topt = t_opt + k_swap + tm.t_off
    total = fwd_part + tcc + topt + tm.t_tp_pp + k_const
    return Parts(np.asarray(tcc), np.asarray(topt), np.asarray(total, dtype=np.float64))


def iter_time_from_terms(params: Params | FloatArray, tm: Terms) -> FloatArray:
    """Iteration times in ms (the artifact's Eq. 1)."""
    return parts(params, tm).iter_ms


def _rmse_log(pred: FloatArray, true: FloatArray) -> float:
    return float(np.sqrt(np.mean((np.log(pred) - np.log(true)) ** 2)))


def fit_joint(
    tm: Terms,
    iter_ms: Sequence[float] | FloatArray,
    tcc_ms: Sequence[float] | FloatArray,
    topt_ms: Sequence[float] | FloatArray,
    *,
    starts: int = 1,
    seed: int = 0,
    min_runs: int = 6,
) -> Fit:
    """The 7 parameters minimising RMSLE(T_cc) + RMSLE(T_opt) + RMSLE(T_iter) together.

    Bounded L-BFGS-B from the artifact's own starting point, plus `starts - 1` drawn
    log-uniformly with `seed` (the objective is not convex in the overlap degree). From
    the artifact's start alone it recovers profile/history.csv's parameters within 0.5%
    on roberta, vit and bert, so one start is the default."""
    y, cc, op = (np.asarray(v, dtype=np.float64) for v in (iter_ms, tcc_ms, topt_ms))
    if not len(y) == len(cc) == len(op) == len(tm.fwd):
        raise ValueError(
            f"{len(tm.fwd)} configs but {len(y)} iteration times, {len(cc)} T_cc, {len(op)} T_opt"
        )
    if len(y) < min_runs:  # each run gives 3 measurements; roberta's profile has 6 runs
        raise ValueError(f"fit needs >= {min_runs} runs, got {len(y)}")
    if np.any(~(y > 0)) or np.any(~(cc > 0)) or np.any(~(op > 0)):
        raise ValueError("measured iteration times, T_cc and T_opt must be > 0")
    lo, hi = ARTIFACT_LOWER.array(), ARTIFACT_UPPER.array()

    def objective(x: FloatArray) -> float:
        p = parts(x, tm)
        if np.any(~(p.tcc > 0)) or np.any(~(p.topt > 0)) or np.any(~(p.iter_ms > 0)):
            return math.inf
        return _rmse_log(p.tcc, cc) + _rmse_log(p.topt, op) + _rmse_log(p.iter_ms, y)

    rng = np.random.default_rng(seed)
    floor = np.maximum(lo, np.array([1.0, 1.0, 1e-4, 1e-2, 1e-1, 1e-1, 1e-1]))
    guesses = [np.array([1.5, 1.0, 1e-3, 1.0, 1.0, 1.0, 1.0])]
    guesses += [np.exp(rng.uniform(np.log(floor), np.log(hi))) for _ in range(starts - 1)]
    best: FloatArray | None = None
    best_cost = math.inf
    for x0 in guesses:
        res = minimize(
            objective, np.clip(x0, lo, hi), method="L-BFGS-B", bounds=list(zip(lo, hi, strict=True))
        )
        if res.fun < best_cost:
            best, best_cost = np.asarray(res.x, dtype=np.float64), float(res.fun)
    assert best is not None
    return Fit(Params.from_array(best), rmsle(iter_time_from_terms(best, tm), y))
