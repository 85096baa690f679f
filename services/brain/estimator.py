"""Throughput estimation as plain functions over plain data (no storage, no gRPC).

Three ways to know how fast a job runs on (accelerator type, device count),
most trusted first; the Brain's service layer tries them in this order:

1. the job's own recent samples on that type and count, smoothed
   (`smooth_samples`);
2. completed jobs of the same model type (`pool_history`);
3. matrix completion against reference jobs, Gavel section 4.4 / Quasar
   (`LowRankModel`): the job's partial *fingerprint* (whatever it or its model
   type was measured at) is folded into a low-rank model of the reference
   throughput matrix, and the estimate blends the low-rank completion with the
   nearest reference jobs (cosine distance between completed rows), shifted to
   the job's own scale;
4. else a declared default.

Throughputs are modelled in log space: rows differ mostly by a scale (a model
is k times slower everywhere) and the low-rank part captures how each model
responds to device types and counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.spatial import distance

FloatArray = npt.NDArray[np.float64]

#: Relative error declared when an estimate rests on a single measurement.
SINGLE_MEASUREMENT_ERROR = 0.2
#: Relative error floor: no measurement is better than this.
MIN_RELATIVE_ERROR = 0.01
#: Relative error of the declared default (nothing is known).
DEFAULT_RELATIVE_ERROR = 1.0
#: Known-entry counts at which a model measures its own error (LowRankModel.calibration).
CALIBRATION_COUNTS = (1, 2, 4, 8, 16)
#: Inflation of the error when a device count is inter- or extrapolated.
COUNT_INTERPOLATION_PENALTY = 1.5


@dataclass(frozen=True, order=True)
class Column:
    """One column of the throughput matrix: an accelerator type at a device count."""

    accelerator_type: str
    device_count: int


@dataclass(frozen=True)
class Estimate:
    """An estimated throughput (global steps/s) with its expected relative error."""

    steps_per_second: float
    relative_error: float
    detail: str


# --- 1. own samples ---------------------------------------------------------


def smooth_samples(values: Sequence[float], alpha: float = 0.3) -> Estimate | None:
    """Exponentially weighted mean of recent throughputs, oldest first (the newest weighs most).

    The error is the weighted coefficient of variation of the samples (how far
    one interval strays from the mean), floored at MIN_RELATIVE_ERROR; a
    single sample gets SINGLE_MEASUREMENT_ERROR. None when there is no
    positive value.
    """
    data = np.asarray([v for v in values if v > 0 and math.isfinite(v)], dtype=np.float64)
    if data.size == 0:
        return None
    weights = (1.0 - alpha) ** np.arange(data.size - 1, -1, -1, dtype=np.float64)
    mean = float(np.average(data, weights=weights))
    if data.size == 1:
        error = SINGLE_MEASUREMENT_ERROR
    else:
        spread = math.sqrt(float(np.average((data - mean) ** 2, weights=weights)))
        error = max(spread / mean, MIN_RELATIVE_ERROR)
    return Estimate(mean, error, f"EWMA of {data.size} recent samples")


# --- 2. history of the same model type ---------------------------------------


def pool_history(per_job: Sequence[float]) -> Estimate | None:
    """Mean of the throughputs completed jobs of one model type reached (one value per job).

    The error is the coefficient of variation across jobs (SINGLE_MEASUREMENT_ERROR
    for one job). None when no job measured anything.
    """
    data = np.asarray([v for v in per_job if v > 0 and math.isfinite(v)], dtype=np.float64)
    if data.size == 0:
        return None
    mean = float(data.mean())
    if data.size == 1:
        error = SINGLE_MEASUREMENT_ERROR
    else:
        error = max(float(data.std(ddof=1)) / mean, MIN_RELATIVE_ERROR)
    return Estimate(mean, error, f"mean of {data.size} completed jobs")


# --- 3. matrix completion -----------------------------------------------------


def complete_matrix(
    observed: FloatArray,
    rank: int,
    *,
    start: FloatArray | None = None,
    tol: float = 1e-5,
    max_iter: int = 500,
) -> FloatArray:
    """Fill the NaN entries of `observed` with a rank-`rank` approximation (hard impute).

    Alternates a truncated SVD of the filled matrix with putting the observed
    entries back, until the filled matrix moves less than `tol` (relative).
    Missing entries start from `start` when given (a warm start), else from
    column mean plus row offset.
    """
    mask = np.isfinite(observed)
    if start is None:
        col_mean = np.nanmean(np.where(mask, observed, np.nan), axis=0)
        col_mean = np.where(np.isfinite(col_mean), col_mean, np.nanmean(observed))
        row_off = np.nanmean(np.where(mask, observed - col_mean, np.nan), axis=1)
        row_off = np.where(np.isfinite(row_off), row_off, 0.0)
        start = col_mean[None, :] + row_off[:, None]
    filled = np.where(mask, observed, start)
    rank = max(1, min(rank, *filled.shape))
    for _ in range(max_iter):
        u, s, vt = np.linalg.svd(filled, full_matrices=False)
        low = (u[:, :rank] * s[:rank]) @ vt[:rank]
        moved = np.where(mask, observed, low)
        change = float(np.linalg.norm(moved - filled)) / max(float(np.linalg.norm(filled)), 1e-12)
        filled = moved
        if change < tol:
            break
    return filled


@dataclass(frozen=True)
class Completion:
    """A matrix-completion estimate: steps/s, the nearest reference jobs and the error."""

    steps_per_second: float
    nearest: tuple[str, ...]
    relative_error: float
    known: int
    interpolated: bool


@dataclass(frozen=True)
class LowRankModel:
    """The reference throughput matrix, completed, with its column factors.

    `observed` holds log throughputs (NaN where a reference job was not
    measured or cannot run); `completed` fills those; `factors` (columns x
    rank) span the rows' variation around their mean level; `calibration`
    maps a number of known entries to the mean relative error measured by
    hiding reference entries.
    """

    names: tuple[str, ...]
    columns: tuple[Column, ...]
    observed: FloatArray
    completed: FloatArray
    factors: FloatArray
    ridge: float
    neighbours: int
    calibration: tuple[tuple[int, float], ...] = ()

    @property
    def index(self) -> dict[Column, int]:
        return {c: j for j, c in enumerate(self.columns)}

    def fold_in(self, known: Mapping[int, float]) -> FloatArray:
        """The completed log row of a new job from its known log entries (column index -> value).

        Ridge regression of the known entries on [1, factors]: a free level
        plus a regularized low-rank shape (PMF's fold-in). With one entry only
        the level is fitted.
        """
        cols = np.fromiter(known, dtype=np.int64)
        values = np.fromiter(known.values(), dtype=np.float64)
        r = min(self.factors.shape[1], max(cols.size - 1, 0))
        design = np.hstack([np.ones((cols.size, 1)), self.factors[cols, :r]])
        penalty = np.diag([0.0] + [self.ridge] * r)
        gram = design.T @ design + penalty + 1e-9 * np.eye(r + 1)
        coef = np.linalg.solve(gram, design.T @ values)
        out: FloatArray = coef[0] + self.factors[:, :r] @ coef[1:]
        return out

    def _predict_column(
        self, known: Mapping[int, float], row: FloatArray, target: int
    ) -> tuple[float, tuple[str, ...]]:
        centered = self.completed - self.completed.mean(axis=1, keepdims=True)
        distances = distance.cdist((row - row.mean())[None, :], centered, "cosine")[0]
        has_target = np.isfinite(self.observed[:, target])
        pool = np.flatnonzero(has_target) if has_target.any() else np.arange(len(self.names))
        nearest = pool[np.argsort(distances[pool], kind="stable")[: self.neighbours]]
        cols = np.fromiter(known, dtype=np.int64)
        values = np.fromiter(known.values(), dtype=np.float64)
        shifted = [
            (
                self.observed[k, target]
                if np.isfinite(self.observed[k, target])
                else self.completed[k, target]
            )
            + float(np.mean(values - self.completed[k, cols]))
            for k in nearest
        ]
        # Blend the low-rank completion with the scale-matched nearest references.
        log_value = 0.5 * (float(row[target]) + float(np.mean(shifted)))
        return log_value, tuple(self.names[k] for k in nearest)

    def calibrated_error(self, known: int) -> float:
        """Mean relative error measured with `known` entries of a row known (interpolated)."""
        if not self.calibration:
            return SINGLE_MEASUREMENT_ERROR * 2
        counts = np.array([c for c, _ in self.calibration], dtype=np.float64)
        errors = np.array([e for _, e in self.calibration], dtype=np.float64)
        return float(np.interp(known, counts, errors))

    def predict(self, known: Mapping[Column, float], target: Column) -> Completion | None:
        """Estimate steps/s at `target` from a job's measured throughputs elsewhere (steps/s).

        None when no known entry falls on a reference column or the target's
        accelerator type is not in the references. A device count missing from
        the references is interpolated (log-log) between the nearest counts
        of the type, or scaled linearly beyond them, with a larger error.
        """
        index = self.index
        logs = {index[c]: math.log(v) for c, v in known.items() if c in index and v > 0}
        if not logs:
            return None
        row = self.fold_in(logs)
        error = self.calibrated_error(len(logs))
        if target in index:
            value, nearest = self._predict_column(logs, row, index[target])
            return Completion(math.exp(value), nearest, error, len(logs), False)
        counts = sorted(
            c.device_count for c in self.columns if c.accelerator_type == target.accelerator_type
        )
        if not counts:
            return None
        n = target.device_count
        lower = max((c for c in counts if c < n), default=None)
        upper = min((c for c in counts if c > n), default=None)
        if lower is not None and upper is not None:
            lo, names = self._predict_column(
                logs, row, index[Column(target.accelerator_type, lower)]
            )
            hi, more = self._predict_column(
                logs, row, index[Column(target.accelerator_type, upper)]
            )
            w = (math.log(n) - math.log(lower)) / (math.log(upper) - math.log(lower))
            value = (1 - w) * lo + w * hi
            names = tuple(dict.fromkeys(names + more))
        else:
            edge = lower if lower is not None else upper
            assert edge is not None
            value, names = self._predict_column(
                logs, row, index[Column(target.accelerator_type, edge)]
            )
            value += math.log(n / edge)  # linear scaling in the device count
        return Completion(
            math.exp(value), names, error * COUNT_INTERPOLATION_PENALTY, len(logs), True
        )


def reference_matrix(
    rows: Mapping[str, Mapping[Column, float]],
) -> tuple[tuple[str, ...], tuple[Column, ...], FloatArray]:
    """Names, columns and the log-throughput matrix (NaN where unknown or zero) of references."""
    names = tuple(sorted(rows))
    columns = tuple(sorted({c for row in rows.values() for c, v in row.items() if v > 0}))
    index = {c: j for j, c in enumerate(columns)}
    matrix = np.full((len(names), len(columns)), np.nan)
    for i, name in enumerate(names):
        for column, value in rows[name].items():
            if value > 0 and math.isfinite(value):
                matrix[i, index[column]] = math.log(value)
    return names, columns, matrix


def _factors(completed: FloatArray, rank: int) -> FloatArray:
    centered = completed - completed.mean(axis=1, keepdims=True)
    _, s, vt = np.linalg.svd(centered, full_matrices=False)
    r = max(1, min(rank, s.size))
    out: FloatArray = vt[:r].T * s[:r] / math.sqrt(completed.shape[0])
    return out


def build_model(
    rows: Mapping[str, Mapping[Column, float]],
    *,
    rank: int = 5,
    ridge: float = 0.05,
    neighbours: int = 3,
    calibrate: bool = True,
) -> LowRankModel:
    """Complete the reference matrix and, if asked, calibrate its errors by hiding entries."""
    names, columns, observed = reference_matrix(rows)
    if not names or not columns:
        raise ValueError("no reference throughputs")
    completed = complete_matrix(observed, rank)
    model = LowRankModel(
        names, columns, observed, completed, _factors(completed, rank), ridge, neighbours
    )
    if not calibrate or len(names) < 3:
        return model
    _, by_count = hidden_entry_errors(model, counts=CALIBRATION_COUNTS, rank=rank, seeds=1)
    calibration = tuple(
        (k, e.mean) for k, e in sorted(by_count.items()) if e.count and math.isfinite(e.mean)
    )
    return LowRankModel(
        names, columns, observed, completed, model.factors, ridge, neighbours, calibration
    )


@dataclass(frozen=True)
class HiddenEvaluation:
    """Errors of predicting hidden reference entries: mean and median relative error."""

    mean: float
    median: float
    count: int


def _evaluation(errors: list[float]) -> HiddenEvaluation:
    if not errors:
        return HiddenEvaluation(math.nan, math.nan, 0)
    data = np.asarray(errors)
    return HiddenEvaluation(float(data.mean()), float(np.median(data)), int(data.size))


def hidden_entry_errors(
    model: LowRankModel,
    *,
    fractions: Sequence[float] = (),
    counts: Sequence[int] = (),
    rank: int = 5,
    seeds: int = 3,
) -> tuple[dict[float, HiddenEvaluation], dict[int, HiddenEvaluation]]:
    """Leave one reference row out at a time, show the estimator a `fraction` of its entries
    (or `count` of them), predict the hidden ones from the other rows, and measure the
    relative errors; one evaluation per fraction and per count.

    With a fraction, every row shows at least one entry and hides at least one;
    with a count, only rows with more entries than that take part. The model of
    the other rows is completed from scratch, so a
    row never helps predict itself.
    """
    by_fraction: dict[float, list[float]] = {f: [] for f in fractions}
    by_count: dict[int, list[float]] = {k: [] for k in counts}
    everyone = np.arange(len(model.names))
    for i in everyone:
        present = np.flatnonzero(np.isfinite(model.observed[i]))
        if present.size < 2:
            continue
        others = np.delete(everyone, i)
        observed = model.observed[others]
        completed = complete_matrix(observed, rank)
        sub = LowRankModel(
            tuple(model.names[k] for k in others),
            model.columns,
            observed,
            completed,
            _factors(completed, rank),
            model.ridge,
            model.neighbours,
        )
        plans = [(by_fraction[f], round(f * present.size)) for f in fractions]
        plans += [(by_count[k], k) for k in counts if k < present.size]
        for sink, wanted in plans:
            keep = min(max(wanted, 1), present.size - 1)
            for seed in range(seeds):
                order = np.random.default_rng([seed, int(i), keep]).permutation(present)
                shown = {model.columns[j]: math.exp(model.observed[i, j]) for j in order[:keep]}
                for j in order[keep:]:
                    guess = sub.predict(shown, model.columns[j])
                    if guess is not None:
                        truth = math.exp(model.observed[i, j])
                        sink.append(abs(guess.steps_per_second - truth) / truth)
    return (
        {f: _evaluation(e) for f, e in by_fraction.items()},
        {k: _evaluation(e) for k, e in by_count.items()},
    )
