"""The Brain's fitted Rubick models (Eq. 1, FitModel) of live jobs, shared by the `rubick`
allocator (rubick_live.py) and Rubick's plan choice beside another objective
(plan_choice.py): what they copy of a job, how a fit is read and kept, and the plans the
runtime executes.

- Fits: per job, the Brain's fit on the runs it holds for the job, else for its model key
  (the spec's model_type); asked outside the scheduler's lock (`FitBook.refresh`), kept,
  asked again every `refresh_seconds` (what the Brain learns reaches running jobs) and every
  `retry_seconds` while the job has no fit of its own (a profiling run may store its runs at
  any time). A fit the Brain gave stays when it cannot answer.
- Memory: a device's is its group's registered memory, else its worker's memory over its
  devices (a CPU slot's share). The smallest among live workers replaces the fit's GPU
  memory for the `rubick` allocator (one fit prices every type alike); the plan choice
  reads the smallest on the workers a job was placed on (`FitBook.memory_of`). The
  bandwidths are the fit's.
- Plans: only what the runtime executes (gearshift.common.rubick.perf.Runtime): data
  parallel over the ESTs, gradient checkpointing where the spec allows it, optimizer
  offload (ZeRO-Offload) where it allows it and the devices are GPUs; never TP, PP or
  ZeRO-DP.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gearshift.common.rubick.model import A800, Env, ForwardSample, Params, Workload
from gearshift.common.rubick.perf import ModelPerf, Runtime
from gearshift.common.rubick.plans import Plan, Zero
from gearshift.scheduler.round.brain import BrainAdvisor
from gearshift.scheduler.state.records import JobRecord, WorkerRecord
from gearshift.v1 import brain_pb2, common_pb2

GB = 1e9
UNFITTED_MS = 1000.0  # any value: a job's speeds are normalised by its request's


@dataclass(frozen=True)
class JobFacts:
    """What Rubick needs of a job, copied under the scheduler's lock."""

    job_id: str
    model_key: str
    num_ests: int
    min_devices: int
    max_devices: int
    gc: bool
    offload: bool
    plan: common_pb2.ExecutionPlan

    @classmethod
    def of(cls, job: JobRecord) -> JobFacts:
        spec = job.spec
        n = max(spec.num_ests, 1)
        most = max(1, min(spec.elastic.max_devices or n, n))
        plan = common_pb2.ExecutionPlan()
        plan.CopyFrom(job.plan)
        return cls(
            job_id=job.job_id,
            model_key=spec.model_type,
            num_ests=n,
            min_devices=min(max(spec.elastic.min_devices, 1), most),
            max_devices=most,
            gc=spec.plan_dimensions.gradient_checkpointing,
            offload=spec.plan_dimensions.offload_optimizer,
            plan=plan,
        )


@dataclass(frozen=True)
class Fitted:
    """A fitted model: Eq. 1's parameters, the workload and cluster they were fitted for."""

    subject: str
    workload: Workload
    params: Params
    env: Env
    runs: int = 0  # configurations fitted on
    own: bool = False  # fitted on the job's own runs (not its model key's)


def fitted_from_message(reply: brain_pb2.FittedModel, subject: str) -> Fitted | None:
    """The fit in a FittedModel; None when it lacks the workload (an older Brain)."""
    w = reply.workload
    if w.global_batch < 1 or w.layers < 1 or w.params_millions <= 0 or not w.forward:
        return None
    try:
        workload = Workload(
            name=subject,
            params_m=w.params_millions,
            global_batch=w.global_batch,
            seq_hid_layers=w.seq_hid_layers,
            layers=w.layers,
            forward=tuple(ForwardSample(f.samples_per_gpu, f.milliseconds) for f in w.forward),
        )
    except ValueError:  # a profile the model cannot read: as good as none
        return None
    p = reply.params
    params = Params(p.k_bwd, p.k_sync, p.k_opt, p.k_opt_off, p.k_off, p.k_swap, p.k_const)
    c = reply.cluster
    env = Env(
        b_intra=c.intra_node_gbps or A800.b_intra,
        b_inter=c.inter_node_gbps or A800.b_inter,
        b_pcie=c.pcie_gbps or A800.b_pcie,
        gpu_memory_gb=c.gpu_memory_gb or A800.gpu_memory_gb,
    )
    return Fitted(subject, workload, params, env, reply.run_count, bool(reply.job_id))


def model_note(fit: Fitted | None, variant: str) -> str:
    """Which model a job's plans come from, for its events."""
    if variant == "rubick_n":
        return "rubick_n: the job's own plan on its request (no model)"
    if fit is None:
        return "rubick model: none fitted yet; the job runs its own plan on its request"
    source = "the job's own runs" if fit.own else fit.subject
    return f"rubick model: Eq. 1 fitted on {fit.runs} configurations of {source}"


def wants_profile(fit: Fitted | None, variant: str) -> bool:
    """Whether a job's first placement should run Rubick's profiling run: the policy reads
    a model (not rubick_n) and the Brain has no fit of the job's own runs."""
    return variant != "rubick_n" and (fit is None or not fit.own)


# Mapping between the runtime's execution plans and Rubick's plans ----------------------------
def original_plan(facts: JobFacts, devices: int) -> Plan:
    """The job's current execution plan as Rubick's plan on `devices` devices: DP over them,
    ESTs per device as GA (rounded down when they do not divide), its GC and offload."""
    plan = facts.plan
    return Plan(
        dp=devices,
        ga=max(1, facts.num_ests // devices),
        gc=plan.gradient_checkpointing,
        zero=Zero.OFFLOAD if plan.offload_optimizer else Zero.NONE,
    )


def runtime_limits(facts: JobFacts, *, gpus: bool, fitted: bool) -> Runtime:
    """The plans the job's runtime executes (offload only on GPUs)."""
    return Runtime(
        facts.num_ests,
        gc=facts.gc,
        offload=facts.offload and gpus,
        fixed_ms=0.0 if fitted else UNFITTED_MS,
        min_devices=facts.min_devices,
        max_devices=facts.max_devices,
    )


def worker_memory_gb(workers: Sequence[WorkerRecord]) -> dict[str, float]:
    """Each live worker's smallest device memory, GB (workers with none known left out);
    see the module docstring."""
    out: dict[str, float] = {}
    for worker in workers:
        if not worker.alive:
            continue
        count = sum(g.count for g in worker.devices)
        sizes: list[float] = []
        for group in worker.devices:
            if group.memory_bytes > 0:
                sizes.append(group.memory_bytes / GB)
            elif worker.memory_bytes > 0 and count > 0:
                sizes.append(worker.memory_bytes / count / GB)
        if sizes:
            out[worker.worker_id] = min(sizes)
    return out


def device_memory_gb(workers: Sequence[WorkerRecord]) -> float:
    """The smallest memory of a live worker's device, GB (0: none known)."""
    return min(worker_memory_gb(workers).values(), default=0.0)


def model_perf(facts: JobFacts, fit: Fitted | None, memory_gb: float, gpus: bool) -> ModelPerf:
    """The job's model for PerfSource: its fit on the live devices' memory (`memory_gb`, 0:
    the fit's), limited to the plans its runtime executes; without a fit, the runtime's
    fixed_ms answers (its own plan on its request only)."""
    limits = runtime_limits(facts, gpus=gpus, fitted=fit is not None)
    if fit is None:  # never priced: the runtime's fixed_ms answers
        workload = Workload(facts.job_id, 1.0, facts.num_ests, 0.0, 1, (ForwardSample(1, 1),))
        return ModelPerf(workload, Params(1, 1, 0, 1, 1, 1, 0), {}, limits)
    env = dataclasses.replace(fit.env, gpu_memory_gb=memory_gb) if memory_gb > 0 else fit.env
    return ModelPerf(fit.workload, fit.params, {}, limits, env)


def brain_fits(
    brain: BrainAdvisor,
) -> tuple[Callable[[str], Fitted | None], Callable[[str], Fitted | None]]:
    """The Brain's fit (FitModel) of a job, and of a model key (RPCs; None: no fit)."""

    def of_job(job_id: str) -> Fitted | None:
        reply = brain.fit_model(job_id=job_id)
        return fitted_from_message(reply, f"job {job_id}") if reply is not None else None

    def of_key(key: str) -> Fitted | None:
        reply = brain.fit_model(model_key=key)
        return fitted_from_message(reply, f"model {key}") if reply is not None else None

    return of_job, of_key


@dataclass
class FitBook:
    """The live jobs' facts and fits (see the module docstring); `fit_job` and `fit_key` ask
    for the fit of a job and of a model key (brain_fits)."""

    fit_job: Callable[[str], Fitted | None]
    fit_key: Callable[[str], Fitted | None] = lambda key: None
    refresh_seconds: float = 60.0
    retry_seconds: float = 5.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _facts: dict[str, JobFacts] = field(default_factory=dict)
    _fits: dict[str, Fitted] = field(default_factory=dict)
    _asked: dict[str, float] = field(default_factory=dict)
    _memory_gb: float = 0.0
    _worker_memory: dict[str, float] = field(default_factory=dict)  # worker -> GB
    _notes: dict[str, str] = field(default_factory=dict)  # job -> the model note last given

    def refresh(
        self, facts: Sequence[JobFacts], workers: Sequence[WorkerRecord], now: float
    ) -> None:
        """Keep the jobs' facts, and ask the Brain for the fits that are due (RPCs)."""
        with self._lock:
            self._facts = {f.job_id: f for f in facts}
            self._worker_memory = worker_memory_gb(workers)
            self._memory_gb = min(self._worker_memory.values(), default=0.0)
            for gone in [j for j in self._asked if j not in self._facts]:
                self._asked.pop(gone, None)
                self._fits.pop(gone, None)
                self._notes.pop(gone, None)
            due = [f for f in facts if self._due(f.job_id, now)]
        by_key: dict[str, Fitted | None] = {}  # a model key's fit: asked once per pass
        for f in due:
            fit = self.fit_job(f.job_id)
            if fit is None and f.model_key:
                if f.model_key not in by_key:
                    by_key[f.model_key] = self.fit_key(f.model_key)
                fit = by_key[f.model_key]
            with self._lock:
                self._asked[f.job_id] = now
                if fit is not None:  # none now (the Brain is down?): a fit it gave stays
                    self._fits[f.job_id] = fit

    def _due(self, job_id: str, now: float) -> bool:
        """Whether to ask again: every refresh_seconds for a job with a fit of its own, every
        retry_seconds for one without (its profiling run may store its runs any time)."""
        at = self._asked.get(job_id)
        fit = self._fits.get(job_id)
        wait = self.refresh_seconds if fit is not None and fit.own else self.retry_seconds
        return at is None or now - at >= wait

    def fitted(self, job_id: str) -> Fitted | None:
        with self._lock:
            return self._fits.get(job_id)

    def view(self) -> tuple[dict[str, JobFacts], dict[str, Fitted], float]:
        """Copies of the facts and fits, and the live devices' least memory (GB)."""
        with self._lock:
            return dict(self._facts), dict(self._fits), self._memory_gb

    def take(
        self, facts: Mapping[str, JobFacts], fits: Mapping[str, Fitted], memory_gb: float
    ) -> None:
        """Another copy's `view` (a decision process's book: it asks no Brain itself)."""
        with self._lock:
            self._facts, self._fits, self._memory_gb = dict(facts), dict(fits), memory_gb

    def memory_of(self, worker_ids: Iterable[str]) -> float:
        """The smallest device memory on these workers, GB; the smallest of any live
        worker's where none of them is known (0: none known at all)."""
        with self._lock:
            known = [self._worker_memory[w] for w in worker_ids if w in self._worker_memory]
            return min(known, default=self._memory_gb)

    def facts_of(self, job_id: str) -> JobFacts | None:
        with self._lock:
            return self._facts.get(job_id)

    def new_notes(
        self, job_ids: Sequence[str], note_of: Callable[[Fitted | None], str]
    ) -> dict[str, str]:
        """The model notes (`note_of` a job's fit) of these jobs that changed since last
        asked (their events); only of the jobs whose facts were kept."""
        out: dict[str, str] = {}
        with self._lock:
            for job_id in job_ids:
                if job_id not in self._facts:
                    continue
                note = note_of(self._fits.get(job_id))
                if self._notes.get(job_id) != note:
                    self._notes[job_id] = out[job_id] = note
        return out
