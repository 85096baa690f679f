"""Sia's workloads (SOSP'23 artifact, `sia-simulator/`) as a Gavel-style workload and throughput
table for `gearshift simulate --trace-format sia --sia-data DIR`.

The artifact has no licence: it is read from a fetched copy at run time, never copied. Read:
- `workloads/<name>.csv`: name, time (arrival, s), application, num_replicas, batch_size;
- `traces/<model>/placements-<type>.csv`, `scalability-<type>.csv`, `validation-<batch>.csv`;
- `simulator_config.py`: the cluster (nodes per type, GPUs per node) and the per-model
  calibration factors (SLOWDOWNS); `applications.py`: the epochs to train per model and the
  restart delay per model (its `rescale_time`). Both are read as data (`ast`), never run.

Each job becomes a trace job of type "<model> (batch B, N GPUs)" with N ESTs (its num_replicas)
and the global batch B fixed: Gearshift keeps the global batch (determinism), so Sia's
batch-size tuning has no counterpart and the artifact is compared at `--disable_bsz_tuning`.
Its work is the steps at B from no progress to the model's target (`sia_model.work_steps`); its
rate on n <= N GPUs of a type is that work over the artifact's time alone there
(`sia_model.completion_seconds`), so one job alone on n GPUs finishes when the artifact says.
The table entry at n is scaled by n * ceil(N / n) / N, which cancels the EST model's imbalance on
counts that do not divide N: the simulator then runs the job at exactly the artifact's rate on
any n (Sia's jobs split the batch per replica, not per EST). Jobs never span two types at once
(`TraceJob.one_type`), as Sia's allocations do; they may move between types, paying a restart.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.errors import ValidationError
from gearshift.common.gavel import JobKey, ThroughputTable
from gearshift.scheduler.sim.sia_model import (
    EpochStats,
    StepRow,
    StepTable,
    completion_seconds,
    work_steps,
)
from gearshift.scheduler.sim.trace import TraceJob, csv_rows

WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
STEP_COLUMNS = ("local_bsz", "step_time", "sync_time")
GRID_COLUMNS = ("num_nodes", "num_replicas")
VALIDATION_COLUMNS = ("progress", "grad_sqr", "grad_var")
DEFAULT_WORKLOAD = "philly/workload-1"


@dataclass(frozen=True)
class SiaJob:
    """One row of a Sia workload."""

    name: str
    arrival_time: float
    application: str
    num_replicas: int
    batch_size: int

    @property
    def job_type(self) -> str:
        return f"{self.application} (batch {self.batch_size}, {self.num_replicas} GPUs)"


@dataclass(frozen=True)
class Constants:
    """What the artifact's two Python files say: GPUs per node and nodes per type (the simulated
    cluster), calibration slowdowns, epochs and restart seconds per model."""

    per_node: Mapping[str, int]
    nodes: Mapping[str, int]
    slowdowns: Mapping[str, float]
    epochs: Mapping[str, int]
    restart: Mapping[str, float]
    default_restart: float

    @property
    def cluster(self) -> dict[str, int]:
        return {t: self.per_node[t] * n for t, n in self.nodes.items()}


@dataclass(frozen=True)
class SiaWorkload:
    """A Sia workload ready for `simulate_pipeline`."""

    name: str
    jobs: list[TraceJob]
    table: ThroughputTable
    cluster: dict[str, int]
    restart_prior: dict[str, float]


def _rows(path: Path, needed: Sequence[str]) -> list[dict[str, float]]:
    """A CSV's rows as numbers; ValidationError names the file, line and column."""
    reader = csv_rows(path, needed, "table")
    out = []
    for row in reader:
        values = {}
        for column in needed:
            try:
                values[column] = float(row[column])
            except (TypeError, ValueError):
                raise ValidationError(
                    f"{path}:{reader.line_num} column {column}", f"not a number: {row[column]!r}"
                ) from None
            if not math.isfinite(values[column]) or values[column] < 0:
                raise ValidationError(
                    f"{path}:{reader.line_num} column {column}", f"must be >= 0: {row[column]!r}"
                )
        out.append(values)
    if not out:
        raise ValidationError(str(path), "has no rows")
    return out


def read_workload(path: Path) -> list[SiaJob]:
    """A workload CSV; arrivals must not decrease."""
    jobs: list[SiaJob] = []
    reader = csv_rows(path, WORKLOAD_COLUMNS, "workload")
    for row in reader:
        where = f"{path}:{reader.line_num}"
        try:
            arrival = float(row["time"])
        except (TypeError, ValueError):
            raise ValidationError(
                f"{where} column time", f"not a number: {row['time']!r}"
            ) from None
        ints = {}
        for column in ("num_replicas", "batch_size"):
            text_value = (row[column] or "").strip()
            if not text_value.isdigit() or int(text_value) < 1:
                raise ValidationError(
                    f"{where} column {column}", f"must be an integer >= 1: {row[column]!r}"
                )
            ints[column] = int(text_value)
        if not math.isfinite(arrival) or arrival < 0:
            raise ValidationError(f"{where} column time", f"must be >= 0: {row['time']!r}")
        if jobs and arrival < jobs[-1].arrival_time:
            raise ValidationError(f"{where} column time", "arrival times must not decrease")
        jobs.append(SiaJob(row["name"], arrival, row["application"].strip(), **ints))
    if not jobs:
        raise ValidationError(str(path), "the workload has no jobs")
    return jobs


def _assignments(path: Path) -> tuple[ast.Module, dict[str, object]]:
    """A Python file's module-level literal assignments (the last one of a name wins)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError) as exc:
        raise ValidationError(str(path), f"cannot read: {exc}") from None
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    try:
                        out[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        continue
    return tree, out


def _epochs(tree: ast.Module) -> dict[tuple[str, str], int]:
    """(type, model) -> max_epochs of every `Application(join(DIR, "model"), cluster_suffix=...,
    max_epochs=...)` call."""
    out = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith("Application")
        ):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        names = [
            n.value
            for a in node.args[:1]
            for n in ast.walk(a)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        suffix, epochs = keywords.get("cluster_suffix"), keywords.get("max_epochs")
        if (
            names
            and isinstance(suffix, ast.Constant)
            and isinstance(epochs, ast.Constant)
            and isinstance(epochs.value, int)
        ):
            out[(str(suffix.value), names[-1])] = epochs.value
    return out


def _restarts(tree: ast.Module) -> tuple[dict[str, float], float | None]:
    """`if self.name == "model": self.rescale_time = S` ... `else: self.rescale_time = S`."""

    def seconds(body: Sequence[ast.stmt]) -> float | None:
        for stmt in body:
            if (
                isinstance(stmt, ast.Assign)
                and any(getattr(t, "attr", "") == "rescale_time" for t in stmt.targets)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, int | float)
            ):
                return float(stmt.value.value)
        return None

    out: dict[str, float] = {}
    default = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and getattr(test.left, "attr", "") == "name"
            and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and seconds(node.body) is not None
        ):
            out[str(test.comparators[0].value)] = seconds(node.body) or 0.0
            if node.orelse and not isinstance(node.orelse[0], ast.If):
                default = seconds(node.orelse)
    return out, default


def _numbers(values: Mapping[str, object], name: str, path: Path) -> dict[str, float]:
    """A literal dict of numbers in the artifact's config, by name."""
    found = values.get(name)
    if not isinstance(found, dict) or not all(
        isinstance(v, int | float) and v >= 0 for v in found.values()
    ):
        raise ValidationError(str(path), f"no literal dict of numbers {name}")
    return {str(k): float(v) for k, v in found.items()}


def read_constants(data: Path) -> Constants:
    """The cluster, calibration, epochs and restart delays from the artifact's Python files."""
    config = data / "simulator_config.py"
    _, values = _assignments(config)
    per_node = {t: int(n) for t, n in _numbers(values, "cluster_ngpus_per_node", config).items()}
    nodes = {t: int(n) for t, n in _numbers(values, "cluster_nnodes", config).items()}
    slowdowns = _numbers(values, "SLOWDOWNS", config)
    unknown = sorted(set(nodes) - set(per_node))
    if unknown:
        raise ValidationError(str(config), f"cluster_nnodes names types of no node size: {unknown}")
    apps = data / "applications.py"
    tree, _ = _assignments(apps)
    epochs = _epochs(tree)
    restart, default = _restarts(tree)
    if not epochs:
        raise ValidationError(str(apps), "no Application(..., cluster_suffix=, max_epochs=) call")
    if not restart:
        raise ValidationError(str(apps), 'no `if self.name == "model": self.rescale_time = S`')
    return Constants(
        per_node=per_node,
        nodes=nodes,
        slowdowns=slowdowns,
        epochs={f"{t}/{m}": e for (t, m), e in epochs.items()},
        restart=restart,
        default_restart=30.0 if default is None else default,
    )


def _step_rows(path: Path, grid: bool) -> list[tuple[int, StepRow]]:
    """(placement id, row) of a placements CSV (its placement digits give nodes and replicas),
    or (0, row) of a scalability CSV."""
    rows = _rows(path, (*GRID_COLUMNS, *STEP_COLUMNS) if grid else ("placement", *STEP_COLUMNS))
    out = []
    for r in rows:
        key = 0 if grid else int(r["placement"])
        if grid:
            nodes, replicas = int(r["num_nodes"]), int(r["num_replicas"])
        else:
            nodes, replicas = len(str(key)), sum(map(int, str(key)))
        out.append((key, StepRow(nodes, replicas, r["local_bsz"], r["step_time"], r["sync_time"])))
    return out


def read_step_table(folder: Path, kind: str) -> StepTable:
    """A model's placements-<kind>.csv and scalability-<kind>.csv."""
    placements: dict[int, list[StepRow]] = {}
    for key, row in _step_rows(folder / f"placements-{kind}.csv", False):
        placements.setdefault(key, []).append(row)
    for rows in placements.values():
        rows.sort(key=lambda r: r.local_bsz)
    scalability = [row for _, row in _step_rows(folder / f"scalability-{kind}.csv", True)]
    return StepTable(placements, scalability)


def read_validation(folder: Path, epochs: int) -> dict[int, list[EpochStats]]:
    """validation-<batch>.csv per validated batch size; each needs `epochs` rows."""
    tables = {}
    for path in sorted(folder.glob("validation-*.csv")):
        size = path.stem.rpartition("-")[2]
        if not size.isdigit():
            raise ValidationError(str(path), "name is not validation-<batch size>.csv")
        rows = _rows(path, VALIDATION_COLUMNS)
        if len(rows) < epochs:
            raise ValidationError(str(path), f"{len(rows)} epochs, the model trains {epochs}")
        tables[int(size)] = [EpochStats(r["progress"], r["grad_sqr"], r["grad_var"]) for r in rows]
    if not tables:
        raise ValidationError(str(folder), "no validation-<batch size>.csv")
    return tables


def load_sia_workload(
    data: Path, workload: str, cluster: Mapping[str, int] | None = None
) -> SiaWorkload:
    """`workload` (a name under DIR/workloads, e.g. philly/workload-1, or a CSV path) with
    its throughput table on the artifact's cluster (or `cluster`, GPUs per type); see the
    module docstring."""
    data = Path(data)
    if not (data / "traces").is_dir() or not (data / "workloads").is_dir():
        raise ValidationError("--sia-data", f"{data} holds no traces/ and workloads/ folders")
    constants = read_constants(data)
    given = Path(workload)
    path = given if given.suffix == ".csv" else data / "workloads" / f"{workload}.csv"
    jobs = read_workload(path)
    devices = dict(cluster) if cluster is not None else constants.cluster
    for kind in devices:
        if kind not in constants.per_node:
            raise ValidationError("--cluster", f"{kind!r}: the artifact knows no such GPU type")
    isolated: dict[str, dict[JobKey, float]] = {t: {} for t in devices}
    trace: list[TraceJob] = []
    tables: dict[tuple[str, str], StepTable] = {}
    models: dict[str, tuple[int, dict[int, list[EpochStats]]]] = {}
    for number, job in enumerate(jobs, start=2):
        where = f"{path}:{number}"
        folder = data / "traces" / job.application
        if job.application not in models:
            if not folder.is_dir():
                raise ValidationError(
                    f"{where} column application", f"no traces/{job.application}/ in {data}"
                )
            epochs = _model_epochs(constants, job.application, devices, where)
            models[job.application] = epochs, read_validation(folder, epochs)
        epochs, validation = models[job.application]
        if not min(validation) <= job.batch_size <= max(validation):
            raise ValidationError(
                f"{where} column batch_size",
                f"{job.batch_size} is outside the validated batch sizes {sorted(validation)}",
            )
        steps = max(1, round(work_steps(validation, epochs, job.batch_size)))
        slowdown = constants.slowdowns.get(job.application, 1.0)
        for kind in devices:
            key = (job.application, kind)
            if key not in tables:
                tables[key] = read_step_table(folder, kind)
            for n in range(1, min(job.num_replicas, devices[kind]) + 1):
                if JobKey(job.job_type, n) in isolated[kind]:
                    continue
                seconds = completion_seconds(
                    tables[key],
                    validation,
                    epochs,
                    devices=n,
                    per_node=constants.per_node[kind],
                    batch_size=job.batch_size,
                    slowdown=slowdown,
                )
                if math.isfinite(seconds) and seconds > 0:
                    imbalance = n * math.ceil(job.num_replicas / n) / job.num_replicas
                    isolated[kind][JobKey(job.job_type, n)] = steps / seconds * imbalance
        trace.append(
            TraceJob(
                job_type=job.job_type,
                total_steps=steps,
                scale_factor=job.num_replicas,
                arrival_time=job.arrival_time,
                command=job.name,
                one_type=True,
            )
        )
    prior = dict(constants.restart)
    for job in jobs:
        prior.setdefault(job.application, constants.default_restart)
    return SiaWorkload(
        name=workload,
        jobs=trace,
        table=ThroughputTable(isolated, {t: {} for t in devices}),
        cluster=devices,
        restart_prior=prior,
    )


def _model_epochs(constants: Constants, model: str, kinds: Mapping[str, int], where: str) -> int:
    """The epochs a model trains (the artifact gives them per type; they must agree)."""
    found = {constants.epochs[f"{t}/{model}"] for t in kinds if f"{t}/{model}" in constants.epochs}
    if not found:
        raise ValidationError(
            f"{where} column application", f"applications.py gives no max_epochs for {model!r}"
        )
    if len(found) > 1:
        raise ValidationError(f"{where} column application", f"{model}: epochs differ by type")
    return found.pop()
