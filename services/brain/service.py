"""The Brain's domain layer: what each RPC does, over the storage interface and the
plain-function algorithms (estimator, DLRover planner, EasyScale EST planner).

Inputs are validated plain data (gearshift.brain.convert builds them from
requests); errors are gearshift.common.errors exceptions.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from gearshift.brain import deeppool, dlrover, estimator, metrics, rubick
from gearshift.brain.deeppool.profiles import digest, graph_from_dict, graph_to_dict, rebatch
from gearshift.brain.estimator import Column, LowRankModel
from gearshift.brain.records import (
    Cursor,
    FinishedJob,
    History,
    JobEvent,
    JobFilter,
    JobPage,
    JobRow,
    ProfileRow,
    RubickFitRow,
    Sample,
    Subject,
)
from gearshift.brain.references import as_rows
from gearshift.brain.storage import BrainStore
from gearshift.common import estplan
from gearshift.common.errors import NotFoundError, PreconditionError, ValidationError
from gearshift.common.rubick import sensitivity
from gearshift.common.rubick.model import (
    GB,
    PARAM_NAMES,
    Config,
    Env,
    Params,
    Workload,
    fits,
    host_memory,
    iter_time,
    memory_per_gpu,
)
from gearshift.common.rubick.plans import Plan, Resources

log = logging.getLogger("gearshift.brain")

#: Recent samples of a job that its own estimate smooths.
OWN_SAMPLES = 20
#: Newest ended jobs of a model type that the history estimate pools.
HISTORY_JOBS = 50
#: Relative error declared for an entry of the reference table itself.
REFERENCE_ENTRY_ERROR = 0.05


class EstimateSource(StrEnum):
    """Where an estimate came from, most trusted first."""

    OWN_SAMPLES = "own_samples"
    MODEL_HISTORY = "model_history"
    MATRIX_COMPLETION = "matrix_completion"
    DEFAULT = "default"


@dataclass(frozen=True)
class EstimateResult:
    """An estimate, where it came from and its expected relative error."""

    value: float
    source: EstimateSource
    relative_error: float
    detail: str


class ReferenceCache:
    """The completed reference matrix, rebuilt when the reference table changes.

    The table's signature is checked at most every `refresh_seconds`; the
    error calibration (hiding entries, a few seconds of CPU) runs in a
    background thread and is swapped in when done.
    """

    def __init__(
        self,
        store: BrainStore,
        *,
        refresh_seconds: float = 5.0,
        calibrate: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._refresh = refresh_seconds
        self._calibrate = calibrate
        self._clock = clock
        self._lock = threading.Lock()
        self._model: LowRankModel | None = None
        self._signature: tuple[int, float] | None = None
        self._checked = -float("inf")
        self.calibrated = threading.Event()

    def model(self) -> LowRankModel | None:
        """The current model (None without references)."""
        with self._lock:
            now = self._clock()
            if now - self._checked < self._refresh:
                return self._model
            self._checked = now
            signature = self._store.reference_signature()
            if signature == self._signature:
                return self._model
            rows = as_rows(self._store.reference_rows())
            self._signature = signature
            self._model = estimator.build_model(rows, calibrate=False) if rows else None
            self.calibrated.clear()
            if self._model is not None and self._calibrate:
                threading.Thread(
                    target=self._calibrate_in_background,
                    args=(rows, signature),
                    name="brain-calibration",
                    daemon=True,
                ).start()
            else:
                self.calibrated.set()
            return self._model

    def _calibrate_in_background(
        self, rows: Mapping[str, Mapping[Column, float]], signature: tuple[int, float]
    ) -> None:
        started = time.perf_counter()
        model = estimator.build_model(rows, calibrate=True)
        with self._lock:
            if self._signature == signature:
                self._model = model
        self.calibrated.set()
        log.info(
            "reference model calibrated",
            extra={
                "references": len(rows),
                "seconds": round(time.perf_counter() - started, 2),
                "calibration": [[k, round(e, 3)] for k, e in model.calibration],
            },
        )


@dataclass(frozen=True)
class PlanRequest:
    """A validated PlanResources request."""

    job_id: str
    stage: dlrover.Stage
    budget: dlrover.Budget
    metrics: dlrover.PsMetrics
    current: dlrover.ResourcePlan | None
    oom_role: dlrover.Role | None


@dataclass(frozen=True)
class IssuedPlan:
    """A plan and the id it was recorded under."""

    plan_id: str
    plan: dlrover.ResourcePlan


@dataclass(frozen=True)
class EstPlanResult:
    """The EST plan, its proposals, and where each estimated capability came from."""

    plan: estplan.EstPlan
    proposals: list[estplan.ScaleOutProposal]
    estimated: dict[str, EstimateResult]


@dataclass(frozen=True)
class BurstRequest:
    """Validated settings of a PlanBurstParallel request (0: the profile's batch / devices)."""

    global_batch: int
    max_devices: int
    amp_limit: float
    network: deeppool.Network
    parallel_branches: bool


@dataclass(frozen=True)
class BurstResult:
    """A burst-parallel plan over `graph` (the profile at the planned batch) and beside it:
    each layer's amplification, plain data parallelism's time and the elastic count."""

    graph: deeppool.LayerGraph
    plan: deeppool.Plan
    layer_amplification: tuple[float, ...]
    data_parallel_seconds: float
    elastic_devices: int
    max_devices: int


@dataclass(frozen=True)
class RubickFitRequest:
    """A validated FitModel request (workload and runs inline may be None / empty)."""

    subject: Subject
    workload: Workload | None
    runs: tuple[rubick.Run, ...]
    env: Env
    include_runtime_samples: bool = False
    accelerator_type: str = ""
    gpus_per_node: int = 0


@dataclass(frozen=True)
class PlanPrediction:
    """Eq. 1's prediction of one plan on resources, and its memory estimate (bytes)."""

    plan: Plan
    iteration_ms: float
    samples_per_second: float
    gpu_memory: float
    gpu_memory_limit: float
    fits: bool
    host_memory: float


@dataclass(frozen=True)
class SensitivityRequest:
    """A validated GetSensitivity request (0 amounts: no such curve; no original: no minRes)."""

    subject: Subject
    max_gpus: int
    gpus_per_node: int
    cpus_per_gpu: int
    max_cpus_per_gpu: int
    cpu_curve_placement: tuple[int, ...]
    allow_3d: bool
    original: Config | None


@dataclass(frozen=True)
class SensitivityResult:
    """Curves (points with their slopes) and minRes; samples/s throughout."""

    gpu_curve: list[tuple[sensitivity.Point, float]]
    cpu_curve: list[tuple[sensitivity.Point, float]]
    min_res: sensitivity.MinRes | None


#: Most recent runtime samples of a job its adjust stage measures its use from.
PLAN_SAMPLES = 20

#: Most runtime samples of a job read when deriving profiled runs from them.
RUBICK_SAMPLES = 10_000


def _past_job(found: FinishedJob) -> dlrover.PastJob | None:
    """What a finished job ran with: its last plan, else its recorded nodes; a
    data-parallel job's device count from its samples."""
    plan = dlrover.plan_from_dict(found.last_plan) if found.last_plan is not None else None
    if plan is not None:
        workers, ps = plan.workers, plan.ps
    else:
        groups: dict[str, dlrover.NodeGroup] = {}
        for role in (dlrover.Role.WORKER, dlrover.Role.PS):
            nodes = [n for n in found.nodes if n.role == role.value]
            groups[role] = dlrover.NodeGroup(
                len(nodes),
                statistics.median(n.cpu_cores for n in nodes) if nodes else 0.0,
                max((n.memory_bytes for n in nodes), default=0),
            )
        workers, ps = groups[dlrover.Role.WORKER], groups[dlrover.Role.PS]
        if workers.count == 0 and found.device_count == 0:
            return None
    if found.device_count > 0 and _data_parallel(found, plan):
        # Its processes are not reported as nodes and its plans carry what it was asked
        # (the defaults' sampling plan has PS); its samples say the devices it ended on.
        workers = replace(workers, count=found.device_count)
        ps = dlrover.NodeGroup(0, 0.0, 0)
    return dlrover.PastJob(
        found.job.job_id,
        found.job.finished_at or found.job.submitted_at,
        workers,
        ps,
        found.memory_peak_by_role.get(dlrover.Role.WORKER.value, 0),
        found.memory_peak_by_role.get(dlrover.Role.PS.value, 0),
        found.steps_per_second,
    )


def _data_parallel(found: FinishedJob, plan: dlrover.ResourcePlan | None) -> bool:
    """No PS node recorded, and no PS in a plan measured for it (history or optimizer;
    only the defaults' sampling plan has PS for a job that never had one)."""
    if any(n.role == dlrover.Role.PS.value for n in found.nodes):
        return False
    return plan is None or plan.ps.count == 0 or plan.source is dlrover.Source.DEFAULT


class BrainService:
    """The Brain's operations, independent of gRPC."""

    def __init__(
        self,
        store: BrainStore,
        *,
        default_steps_per_second: float = 1.0,
        plan_defaults: dlrover.PlanDefaults | None = None,
        references: ReferenceCache | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.default_steps_per_second = default_steps_per_second
        self.plan_defaults = plan_defaults or dlrover.PlanDefaults()
        self.references = references or ReferenceCache(store)
        self.clock = clock

    # -- owners, for the authorization checks (gearshift.common.rpc_roles.Scopes) --

    def job_tenant(self, job_id: str) -> str | None:
        """The tenant of a job the Brain has recorded (None: unknown)."""
        try:
            return self.store.job(job_id).tenant
        except NotFoundError:
            return None

    # -- ingest and history -----------------------------------------------------

    def report_event(self, event: JobEvent) -> bool:
        if event.time == 0:
            event = replace(event, time=self.clock())
        new = self.store.record_event(event)
        metrics.event_recorded(new)
        return new

    def report_samples(self, batch_id: str, job_id: str, samples: Sequence[Sample]) -> int:
        job = self.store.job(job_id)
        for i, sample in enumerate(samples):
            if sample.ests_per_device and sum(sample.ests_per_device) != job.num_ests:
                raise ValidationError(
                    f"samples[{i}].ests_per_device",
                    f"sums to {sum(sample.ests_per_device)}, but job {job_id!r} has "
                    f"{job.num_ests} ESTs",
                )
        committed = self.store.add_samples(batch_id, job_id, samples, self.clock())
        metrics.samples_ingested(committed)
        return committed

    def history(self, job_id: str, since_step: int, max_samples: int) -> History:
        return self.store.history(job_id, since_step, max_samples)

    def list_jobs(self, where: JobFilter, limit: int, after: Cursor | None) -> JobPage:
        return self.store.list_jobs(where, limit, after)

    # -- estimates --------------------------------------------------------------

    def _job_and_model(self, job_id: str, model_type: str) -> tuple[JobRow | None, str]:
        if not job_id:
            return None, model_type
        try:
            job = self.store.job(job_id)
        except NotFoundError:
            if not model_type:
                raise
            return None, model_type
        return job, model_type or job.model_type

    def estimate(
        self, job_id: str, model_type: str, accelerator_type: str, device_count: int
    ) -> EstimateResult:
        """Steps/s of a job (or a model type) on `device_count` devices of one type."""
        job, model_type = self._job_and_model(job_id, model_type)
        if job is not None:
            own = estimator.smooth_samples(
                self.store.recent_throughputs(
                    job.job_id, accelerator_type, device_count, OWN_SAMPLES
                )
            )
            if own is not None:
                return EstimateResult(
                    own.steps_per_second, EstimateSource.OWN_SAMPLES, own.relative_error, own.detail
                )
        if model_type:
            pooled = estimator.pool_history(
                [
                    s
                    for s, _ in self.store.model_throughputs(
                        model_type, accelerator_type, device_count, HISTORY_JOBS
                    )
                ]
            )
            if pooled is not None:
                return EstimateResult(
                    pooled.steps_per_second,
                    EstimateSource.MODEL_HISTORY,
                    pooled.relative_error,
                    f"{pooled.detail} of model type {model_type!r}",
                )
        completed = self._complete(job, model_type, Column(accelerator_type, device_count))
        if completed is not None:
            return completed
        return EstimateResult(
            self.default_steps_per_second,
            EstimateSource.DEFAULT,
            estimator.DEFAULT_RELATIVE_ERROR,
            "nothing known: declared default (--default-steps-per-second)",
        )

    def _complete(
        self, job: JobRow | None, model_type: str, target: Column
    ) -> EstimateResult | None:
        """Matrix completion, with the model type's own reference row when it has one.

        The row is shifted to the level the job (or its model type's history)
        measured on columns they share (geometric mean of the ratios), so a
        job slower than its reference everywhere keeps its own scale.
        """
        model = self.references.model()
        if model is None:
            return None
        measured = self.store.fingerprint(model_type, job.job_id if job else "")
        reference: dict[Column, float] = {}
        if model_type in model.names:
            row = model.names.index(model_type)
            for j, column in enumerate(model.columns):
                value = float(model.observed[row, j])
                if math.isfinite(value):
                    reference[column] = math.exp(value)
        ratios = [math.log(measured[c] / reference[c]) for c in measured if c in reference]
        scale = math.exp(statistics.fmean(ratios)) if ratios else 1.0
        if target in reference:
            spread = (
                statistics.stdev(ratios)
                if len(ratios) > 1
                else estimator.SINGLE_MEASUREMENT_ERROR * len(ratios)
            )
            shifted = f", scaled x{scale:.3g} to {len(ratios)} measured column(s)" if ratios else ""
            return EstimateResult(
                reference[target] * scale,
                EstimateSource.MATRIX_COMPLETION,
                max(REFERENCE_ENTRY_ERROR, spread),
                f"reference table entry of {model_type!r}{shifted}",
            )
        known = {c: v * scale for c, v in reference.items()}
        known.update(measured)
        guess = model.predict(known, target)
        if guess is None:
            return None
        how = "interpolated in device count, " if guess.interpolated else ""
        return EstimateResult(
            guess.steps_per_second,
            EstimateSource.MATRIX_COMPLETION,
            guess.relative_error,
            f"{how}fingerprint of {guess.known} measured column(s); nearest references: "
            + ", ".join(guess.nearest),
        )

    def capability(self, job: JobRow, accelerator_type: str, num_ests: int) -> EstimateResult:
        """Mini-batches (one EST's local step) per second of one device of a type, for a job."""
        measured = [
            s.steps_per_second * max(s.ests_per_device)
            for s in self.store.capability_samples(job.job_id, accelerator_type, OWN_SAMPLES)
        ]
        own = estimator.smooth_samples(measured)
        if own is not None:
            return EstimateResult(
                own.steps_per_second,
                EstimateSource.OWN_SAMPLES,
                own.relative_error,
                f"{own.detail} (steps/s x ESTs on the busiest device)",
            )
        history = [
            b
            for _, b in self.store.model_throughputs(
                job.model_type, accelerator_type, None, HISTORY_JOBS
            )
        ]
        pooled = estimator.pool_history(history)
        if pooled is not None:
            return EstimateResult(
                pooled.steps_per_second,
                EstimateSource.MODEL_HISTORY,
                pooled.relative_error,
                f"{pooled.detail} of model type {job.model_type!r}",
            )
        one = self.estimate(job.job_id, job.model_type, accelerator_type, 1)
        return replace(
            one,
            value=one.value * num_ests,
            detail=f"{one.detail}; one device runs all {num_ests} ESTs, so x{num_ests}",
        )

    # -- resource plans ---------------------------------------------------------

    def plan_resources(self, request: PlanRequest) -> IssuedPlan:
        job = self.store.job(request.job_id)
        defaults = self.plan_defaults
        if request.oom_role is not None:
            assert request.current is not None
            plan = dlrover.handle_oom(request.current, request.oom_role, request.stage)
        elif request.stage is dlrover.Stage.INITIAL:
            match = f"model type {job.model_type!r}, dataset {job.dataset_name!r}"
            found = self.store.finished_similar(
                job.model_type, job.dataset_name, defaults.history_jobs
            )
            if not found:
                match = f"model type {job.model_type!r}"
                found = self.store.finished_similar(job.model_type, None, defaults.history_jobs)
            past = [p for p in (_past_job(f) for f in found if f.job.job_id != job.job_id) if p]
            plan = dlrover.initial_plan(request.budget, past, match, defaults)
        elif request.stage is dlrover.Stage.SAMPLE:
            busy = (
                dlrover.busy_ps_plan(request.budget, request.metrics, request.current, defaults)
                if request.current is not None
                else None
            )
            plan = busy or dlrover.sample_plan(request.budget, defaults)
        elif request.stage is dlrover.Stage.OPTIMIZE:
            plan = dlrover.optimize_plan(request.budget, request.metrics, request.current, defaults)
        elif request.current is not None and request.current.ps.count == 0:
            metrics = request.metrics
            if metrics.worker_cores_needed <= 0:  # measured here: the job's own samples
                metrics = self._process_metrics(job.job_id)
            plan = dlrover.data_parallel_adjust(request.budget, metrics, request.current, defaults)
        else:
            assert request.current is not None
            plan = dlrover.adjust_plan(request.budget, request.metrics, request.current, defaults)
        row = self.store.record_plan(
            job.job_id,
            plan.stage.value,
            plan.source.value,
            dlrover.plan_to_dict(plan),
            self.clock(),
        )
        return IssuedPlan(row.plan_id, plan)

    def _process_metrics(self, job_id: str) -> dlrover.PsMetrics:
        """A data-parallel job's measured use since its last plan was issued (samples under
        an older plan measured other resources)."""
        history = self.store.history(job_id, 0, PLAN_SAMPLES)
        since = history.plans[-1].issued_at if history.plans else 0.0
        return dlrover.metrics_from_samples(
            [
                dlrover.ProcessSample(s.cpu_cores_used, s.memory_bytes_used, s.steps_per_second)
                for s in history.samples
                if s.time >= since and s.steps_per_second > 0
            ]
        )

    # -- EST plans --------------------------------------------------------------

    def plan_ests(
        self,
        job_id: str,
        num_ests: int,
        offers: Sequence[estplan.DeviceOffer],
        current: Mapping[str, int],
        top_k: int,
    ) -> EstPlanResult:
        """EasyScale's intra-job planning: the best split (over the held devices when the job
        runs, else over the available ones) and the top-k homogeneous scale-outs.

        A capability of 0 is estimated for the job (gearshift.brain: capability()).
        """
        estimated: dict[str, EstimateResult] = {}
        if any(o.minibatches_per_second == 0 for o in offers):
            job = self.store.job(job_id)
            resolved = []
            for offer in offers:
                if offer.minibatches_per_second == 0:
                    guess = self.capability(job, offer.accelerator_type, num_ests)
                    estimated[offer.accelerator_type] = guess
                    resolved.append(replace(offer, minibatches_per_second=guess.value))
                else:
                    resolved.append(offer)
            offers = resolved
        capability = {o.accelerator_type: o.minibatches_per_second for o in offers}
        if current:
            plan = estplan.plan_on(num_ests, current, capability)
            base = dict(current)
            extra = list(offers)
        else:
            chosen = estplan.plan_ests(num_ests, offers)
            if chosen is None:
                raise PreconditionError("devices: no available device can run the job")
            plan = chosen
            base = plan.devices_by_type()
            extra = [
                replace(o, available=o.available - base.get(o.accelerator_type, 0)) for o in offers
            ]
        proposals = estplan.scale_out_proposals(num_ests, base, extra, top_k) if top_k else []
        return EstPlanResult(plan, proposals, estimated)

    # -- layer profiles and burst-parallel plans (DeepPool) ---------------------

    def store_profile(
        self, key: str, model_type: str, graph: deeppool.LayerGraph, device: str
    ) -> tuple[bool, bool]:
        """Store a profile under its key: (written, replaced); the same one again is a no-op."""
        data = graph_to_dict(graph, device)
        return self.store.put_profile(ProfileRow(key, model_type, self.clock(), digest(data), data))

    def layer_profile(self, key: str) -> ProfileRow:
        return self.store.profile(key)

    def plan_burst(self, source: str | deeppool.LayerGraph, request: BurstRequest) -> BurstResult:
        """DeepPool's Algorithm 1 over a stored (by key) or given profile.

        The global batch and device limit default to the profile's (the limit also to the
        batch, the most devices that each get a whole sample).
        """
        graph = (
            graph_from_dict(self.store.profile(source).profile)
            if isinstance(source, str)
            else source
        )
        batch = request.global_batch or graph.global_batch
        limit = request.max_devices or min(graph.device_counts[-1], batch)
        if limit > batch:
            raise ValidationError(
                "max_devices", f"{limit} devices would leave some without a sample of {batch}"
            )
        graph = rebatch(graph, batch, limit)
        costs = deeppool.build_costs(graph, request.network)
        best = deeppool.plan(
            graph,
            amp_limit=request.amp_limit,
            max_devices=limit,
            network=request.network,
            parallel_branches=request.parallel_branches,
            costs=costs,
        )
        amps = deeppool.evaluate(graph, best.counts, parallel=best.parallel, costs=costs)
        widest = max(d for d in graph.device_counts if d <= limit)
        data_parallel = deeppool.evaluate(graph, [widest] * graph.num_layers, costs=costs)
        elastic = deeppool.elastic_device_count(
            graph, amp_limit=request.amp_limit, max_devices=limit, network=request.network
        )
        return BurstResult(
            graph,
            best,
            amps.layer_amplification,
            data_parallel.iteration_time,
            elastic,
            widest,
        )

    # -- Rubick's performance model ---------------------------------------------

    def store_rubick(
        self, subject: Subject, workload: Workload | None, runs: Sequence[rubick.Run]
    ) -> tuple[int, int, bool]:
        """Store a subject's workload and runs: (runs written, runs stored, workload replaced)."""
        if workload is None and runs and self.store.rubick_profile(subject).workload is None:
            raise ValidationError("workload", f"is required with the first runs of {subject}")
        data = rubick.workload_to_dict(workload) if workload is not None else None
        return self.store.put_rubick(
            subject,
            (data, rubick.digest(data)) if data is not None else None,
            [rubick.run_row(r) for r in runs],
            self.clock(),
        )

    def fit_rubick(self, request: RubickFitRequest) -> RubickFitRow:
        """Fit Eq. 1 on the subject's stored runs, those given and (for a job, if asked) those
        of its runtime samples; store what was given and the fit in one transaction."""
        subject = request.subject
        stored = self.store.rubick_profile(subject)
        if request.workload is not None:
            data = rubick.workload_to_dict(request.workload)
            workload, digest_ = request.workload, rubick.digest(data)
        elif stored.workload is not None:
            workload, digest_ = rubick.workload_from_dict(stored.workload), stored.digest
        else:
            raise ValidationError("workload", f"none is stored for {subject}: give one")
        given = [rubick.run_row(r) for r in request.runs]
        rows = {r.run_key: r for r in stored.runs} | {r.run_key: r for r in given}
        runs = [rubick.run_from_row(r) for r in rows.values()]
        derived: list[rubick.Run] = []
        if request.include_runtime_samples:
            job = self.store.job(subject.key)
            derived = rubick.runs_from_samples(
                self.store.history(job.job_id, 0, RUBICK_SAMPLES).samples,
                num_ests=job.num_ests,
                accelerator_type=request.accelerator_type,
                gpus_per_node=request.gpus_per_node,
            )
        runs += derived
        need = len(PARAM_NAMES)
        if len(runs) < need:
            raise ValidationError(
                "runs",
                f"the fit needs >= {need} profiled runs; {subject} has {len(runs)} "
                f"({len(stored.runs)} stored, {len(given)} given, {len(derived)} from its "
                "runtime samples)",
            )
        started = time.perf_counter()
        try:
            fitted = rubick.fit_runs(workload, runs, request.env)
        except ValueError as exc:
            raise ValidationError("runs", str(exc)) from None
        row = RubickFitRow(
            params=dict(zip(PARAM_NAMES, fitted.params.array().tolist(), strict=True)),
            cluster=rubick.env_to_dict(request.env),
            workload_digest=digest_,
            rmsle=fitted.rmsle,
            run_count=len(runs),
            runs_from_samples=len(derived),
            offload_runs=rubick.offload_runs(runs),
            fit_seconds=time.perf_counter() - started,
            fitted_at=self.clock(),
        )
        workload_data = rubick.workload_to_dict(request.workload) if request.workload else None
        self.store.put_rubick(
            subject,
            (workload_data, digest_) if workload_data is not None else None,
            given,
            self.clock(),
            fit=row,
        )
        return row

    def rubick_model(self, subject: Subject) -> tuple[Workload, Params, Env]:
        """The subject's stored fit: its workload, parameters and cluster."""
        return self._rubick_model(subject)

    def _rubick_model(self, subject: Subject) -> tuple[Workload, Params, Env]:
        fit = self.store.rubick_fit(subject)
        if fit is None:
            raise PreconditionError(
                f"{subject} has no fitted Rubick model: store >= {len(PARAM_NAMES)} profiled "
                "runs and call FitModel first"
            )
        stored = self.store.rubick_profile(subject, with_runs=False)
        if stored.workload is None or stored.digest != fit.workload_digest:
            raise PreconditionError(
                f"{subject}: its workload changed since the fit; call FitModel again"
            )
        params = Params(**{k: fit.params[k] for k in PARAM_NAMES})
        return rubick.workload_from_dict(stored.workload), params, rubick.env_from_dict(fit.cluster)

    def predict_rubick(self, subject: Subject, plan: Plan, resources: Resources) -> PlanPrediction:
        """Eq. 1 and the memory estimate of one plan, from the subject's stored fit."""
        workload, params, env = self._rubick_model(subject)
        ms = iter_time(params, workload, Config(plan, resources), env)
        return PlanPrediction(
            plan,
            ms,
            workload.global_batch / ms * 1e3,
            memory_per_gpu(workload, plan),
            env.gpu_memory_gb * GB * env.usable_memory,
            fits(workload, plan, env),
            host_memory(workload, plan),
        )

    def rubick_sensitivity(self, request: SensitivityRequest) -> SensitivityResult:
        """Sensitivity curves over GPUs and CPU cores per GPU with their slopes, and minRes
        (gearshift.common.rubick.sensitivity), from the subject's stored fit."""
        workload, params, env = self._rubick_model(request.subject)
        allow_3d = request.allow_3d
        gpus: list[sensitivity.Point] = []
        cpus: list[sensitivity.Point] = []
        if request.max_gpus:
            gpus = sensitivity.gpu_curve(
                workload,
                params,
                request.max_gpus,
                cpus_per_gpu=request.cpus_per_gpu,
                gpus_per_node=request.gpus_per_node,
                env=env,
                allow_3d=allow_3d,
            )
        if request.max_cpus_per_gpu:
            cpus = sensitivity.cpu_curve(
                workload,
                params,
                request.cpu_curve_placement,
                request.max_cpus_per_gpu,
                env=env,
                allow_3d=allow_3d,
            )
        least = None
        if request.original is not None:
            least = sensitivity.min_res(
                workload,
                params,
                request.original,
                gpus_per_node=request.gpus_per_node,
                env=env,
                allow_3d=allow_3d,
            )
        return SensitivityResult(
            list(zip(gpus, sensitivity.slopes(gpus), strict=True)) if gpus else [],
            list(zip(cpus, sensitivity.slopes(cpus), strict=True)) if cpus else [],
            least,
        )
