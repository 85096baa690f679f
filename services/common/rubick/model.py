"""Rubick's performance model (Eq. 1), its memory estimate, and its fit by RMSLE.

Paper: ../shared/papers/rubick-*.txt, section 4; notes: ../shared/notes/rubick.md.

    T_iter = T_cc + T_oo + k_const                                         (Eq. 1)
    T_cc   = a*T_fwd + (a-1)*T_bwd + f_{k_sync}(T_bwd, T_dp) + T_tp + T_pp
    T_oo   = f_{k_off}(T_dp, T_off) + f_{k_swap}(T_opt, T_off)   (ZeRO-Offload)
           = T_opt                                                  (otherwise)
    f_k(x, y) = (x^k + y^k)^(1/k)

T_cc is the paper's GA formula; with a = 1 it is exactly its 3D formula, so one expression
covers DP, GA, GC, ZeRO-DP, ZeRO-Offload, TP, PP and 3D. T_fwd is one GA step's forward
pass, from the job's profiled forward times scaled linearly to the per-GPU work (samples
per GPU over the TP shard); with PP, t_p*g_p/p*(m+p-1) where t_p*g_p is one micro-batch
through the whole model. T_bwd = k_bwd*T_fwd (+ T_fwd with GC). T = V/B for each of
V_dp = P*2(d-1)/(d*t*p), V_tp = 8(t-1)*b*s*h*l/(d*t), V_pp = 2p*b*s*h/(d*t), with B the
bottleneck link of the group (NVLink inside a node, the network across nodes). T_opt =
k_opt*P/x (x = t*p, times d under ZeRO-DP), k_opt_off*P/(d*c) under ZeRO-Offload with c
CPU cores per GPU; T_off = P/(d*B_pcie).

Where the paper is silent we chose, and say so:
- Units: times in ms, P in millions of parameters, bandwidths in GB/s; a volume of V
  million values costs V*comm_bytes/B ms (comm_bytes = 2: fp16 gradients/activations).
  The paper gives P/(d*B_pcie) "without mixed precision"; we price it with the same bytes.
- Under ZeRO-Offload T_dp appears in both T_cc and T_oo: that is what the paper (and the
  notes) write, and we follow it literally.
- The paper's memory estimate is DeepSpeed's/Megatron's; ours (memory_per_gpu) is the ZeRO
  paper's model-state accounting (16 bytes per parameter with mixed-precision Adam) plus
  34*s*h bytes of activations per sample and layer (Korthikanti et al., no attention
  scores), 2*s*h per layer under GC.
- Profiled forward times: a profile may hold several samples at one per-GPU work; we take
  the largest, and drop work levels whose forward time is below that of a smaller work
  level (a forward pass cannot get faster with more work per GPU). t5's profile has such a
  sample (4 ms on 4 GPUs against 54 ms on 8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field, fields

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares

from gearshift.common.rubick.plans import Plan, Resources, Zero, group_spans_nodes

FloatArray = npt.NDArray[np.float64]
GB = 1e9


@dataclass(frozen=True)
class Env:
    """A cluster's links and devices. Defaults: the paper's A800 testbed (section 7):
    400 GB/s NVLink, 100 GB/s RDMA, 80 GB GPUs; PCIe 4.0 x16 (the paper gives none)."""

    b_intra: float = 400.0
    b_inter: float = 100.0
    b_pcie: float = 32.0
    comm_bytes: float = 2.0
    gpu_memory_gb: float = 80.0
    usable_memory: float = 0.9  # headroom for the framework's buffers and fragmentation


A800 = Env()  # the default environment: the paper's testbed


@dataclass(frozen=True)
class Params:
    """The 7 fitted parameters of Table 1 (times in ms, P in millions)."""

    k_bwd: float
    k_sync: float
    k_opt: float
    k_opt_off: float
    k_off: float
    k_swap: float
    k_const: float

    def array(self) -> FloatArray:
        return np.array(astuple(self), dtype=np.float64)

    @classmethod
    def from_array(cls, x: Sequence[float] | FloatArray) -> Params:
        return cls(*(float(v) for v in x))


PARAM_NAMES = tuple(f.name for f in fields(Params))
# Fit bounds. Overlap degrees k >= 1 (k = 1: no overlap; large k: perfect overlap).
LOWER = Params(0.1, 1.0, 0.0, 1e-3, 1.0, 1.0, 0.0)
UPPER = Params(10.0, 100.0, 10.0, 1e3, 100.0, 100.0, 1e4)


@dataclass(frozen=True)
class ForwardSample:
    """A profiled forward pass: `work` samples per GPU (over the TP shard) took `ms`."""

    work: float
    ms: float


@dataclass(frozen=True)
class Workload:
    """A job's model: P (millions), global batch b, s*h*l, layers l, profiled forwards."""

    name: str
    params_m: float
    global_batch: int
    seq_hid_layers: float
    layers: int
    forward: tuple[ForwardSample, ...]
    _curve: tuple[tuple[float, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.forward:
            raise ValueError(f"workload {self.name!r} needs at least one profiled forward")
        by_work: dict[float, float] = {}
        for s in self.forward:
            if s.work <= 0 or s.ms <= 0:
                raise ValueError(f"forward samples need work > 0 and ms > 0, got {s}")
            by_work[s.work] = max(by_work.get(s.work, 0.0), s.ms)
        curve: list[tuple[float, float]] = []
        for w, ms in sorted(by_work.items()):
            if not curve or ms >= curve[-1][1]:
                curve.append((w, ms))
        object.__setattr__(self, "_curve", tuple(curve))

    @property
    def seq_hid(self) -> float:
        return self.seq_hid_layers / self.layers

    def forward_ms(self, work: float) -> float:
        """Forward time at `work` samples per GPU: the nearest profiled work, scaled linearly."""
        w, ms = min(self._curve, key=lambda c: abs(math.log(c[0] / work)))
        return ms * work / w


def overlap(k: float | FloatArray, x: float | FloatArray, y: float | FloatArray) -> FloatArray:
    """f_k(x, y) = (x^k + y^k)^(1/k), computed without overflow for large k."""
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    hi = np.maximum(xa, ya)
    safe = np.where(hi > 0, hi, 1.0)
    return np.where(hi > 0, hi * ((xa / safe) ** k + (ya / safe) ** k) ** (1.0 / k), 0.0)


@dataclass(frozen=True)
class Config:
    """A plan on resources: what Eq. 1 predicts an iteration time for."""

    plan: Plan
    resources: Resources

    def __post_init__(self) -> None:
        if self.plan.gpus != self.resources.gpus:
            raise ValueError(
                f"plan {self.plan.label} needs {self.plan.gpus} GPUs, "
                f"placement {self.resources.placement} has {self.resources.gpus}"
            )


@dataclass(frozen=True)
class Terms:
    """Everything in Eq. 1 that does not depend on the fitted parameters, per config."""

    fwd: FloatArray  # one GA step's forward pass
    ga: FloatArray
    gc: FloatArray  # 1.0 with GC
    t_dp: FloatArray
    t_tp_pp: FloatArray
    p_over_x: FloatArray  # P / x for T_opt
    p_over_dc: FloatArray  # P / (d*c) for ZeRO-Offload's T_opt
    t_off: FloatArray
    offload: FloatArray  # 1.0 under ZeRO-Offload


def _bandwidth(plan: Plan, placement: tuple[int, ...], kind: str, env: Env) -> float:
    return env.b_inter if group_spans_nodes(plan, placement, kind) else env.b_intra


def terms(workload: Workload, configs: Sequence[Config], env: Env) -> Terms:
    """The parameter-free parts of Eq. 1, once per config (the fit reuses them)."""
    rows = []
    P, b = workload.params_m, workload.global_batch
    for cfg in configs:
        pl, place = cfg.plan, cfg.resources.placement
        d, t, p, a, m = pl.dp, pl.tp, pl.pp, pl.ga, pl.micro_batches
        micro = workload.forward_ms(b / (d * t * a * m))
        fwd = micro / p * (m + p - 1)
        v_dp = P * 2 * (d - 1) / (d * t * p)
        t_dp = v_dp * env.comm_bytes / _bandwidth(pl, place, "dp", env) if d > 1 else 0.0
        sample_m = b / 1e6  # V_tp and V_pp count values; P is already in millions
        t_tp = pp_t = 0.0
        if t > 1:
            v_tp = 8 * (t - 1) * sample_m * workload.seq_hid_layers / (d * t)
            t_tp = v_tp * env.comm_bytes / _bandwidth(pl, place, "tp", env)
        if p > 1:
            v_pp = 2 * p * sample_m * workload.seq_hid / (d * t)
            pp_t = v_pp * env.comm_bytes / _bandwidth(pl, place, "pp", env)
        x = t * p * (d if pl.zero is Zero.DP else 1)
        c = cfg.resources.cpus_per_gpu
        off = pl.zero is Zero.OFFLOAD
        t_off = P * env.comm_bytes / (d * env.b_pcie) if off else 0.0
        rows.append((fwd, a, float(pl.gc), t_dp, t_tp + pp_t, P / x, P / (d * c), t_off, off))
    cols = np.array(rows, dtype=np.float64).reshape(len(rows), 9).T
    return Terms(*cols)


def iter_time_from_terms(params: Params | FloatArray, tm: Terms) -> FloatArray:
    """Eq. 1 over precomputed terms: iteration times in ms."""
    k = params.array() if isinstance(params, Params) else params
    k_bwd, k_sync, k_opt, k_opt_off, k_off, k_swap, k_const = k
    bwd = k_bwd * tm.fwd + tm.gc * tm.fwd
    t_cc = tm.ga * tm.fwd + (tm.ga - 1) * bwd + overlap(k_sync, bwd, tm.t_dp) + tm.t_tp_pp
    t_opt = np.where(tm.offload > 0, k_opt_off * tm.p_over_dc, k_opt * tm.p_over_x)
    t_oo_off = overlap(k_off, tm.t_dp, tm.t_off) + overlap(k_swap, t_opt, tm.t_off)
    t_oo = np.where(tm.offload > 0, t_oo_off, t_opt)
    return np.asarray(t_cc + t_oo + k_const, dtype=np.float64)


def iter_time(params: Params, workload: Workload, config: Config, env: Env = A800) -> float:
    """Predicted iteration time (ms) of one plan on one set of resources."""
    return float(iter_time_from_terms(params, terms(workload, [config], env))[0])


def throughput(params: Params, workload: Workload, config: Config, env: Env = A800) -> float:
    """Samples per second: b / T_iter."""
    return workload.global_batch / iter_time(params, workload, config, env) * 1e3


def memory_per_gpu(workload: Workload, plan: Plan) -> float:
    """Bytes a GPU needs: model states (mixed-precision Adam, 16 bytes/parameter, split by
    TP*PP; ZeRO-2 keeps fp16 weights whole and splits the other 14 bytes over d; ZeRO-Offload
    keeps only fp16 weights on the GPU) plus the activations in flight."""
    P = workload.params_m * 1e6
    d, t, p = plan.dp, plan.tp, plan.pp
    if plan.zero is Zero.OFFLOAD:
        states = 2 * P
    elif plan.zero is Zero.DP:
        states = (2 + 14 / d) * P
    else:
        states = 16 * P / (t * p)
    layers_here = workload.layers / p
    samples = workload.global_batch / (d * plan.ga * plan.micro_batches)
    in_flight = min(p, plan.micro_batches) if p > 1 else 1
    sh = workload.seq_hid
    per_sample = (2 * layers_here + 34) * sh if plan.gc else 34 * sh * layers_here
    return states + per_sample * samples * in_flight / t


def host_memory(workload: Workload, plan: Plan) -> float:
    """Host bytes a job needs beyond its processes: ZeRO-Offload's fp16 gradients and fp32
    optimizer states (14 bytes/parameter); other plans keep model states on the GPUs."""
    return 14 * workload.params_m * 1e6 if plan.zero is Zero.OFFLOAD else 0.0


def fits(workload: Workload, plan: Plan, env: Env = A800) -> bool:
    """Whether the plan fits in GPU memory (an OOM plan is infeasible)."""
    return memory_per_gpu(workload, plan) <= env.gpu_memory_gb * GB * env.usable_memory


def rmsle(predicted: FloatArray, measured: FloatArray) -> float:
    """Root mean squared logarithmic error, the paper's fit objective."""
    return float(np.sqrt(np.mean((np.log1p(predicted) - np.log1p(measured)) ** 2)))


@dataclass(frozen=True)
class Fit:
    params: Params
    rmsle: float


def concat_terms(parts: Sequence[Terms]) -> Terms:
    """One Terms of several (e.g. runs of one model at different global batches)."""
    return Terms(*(np.concatenate([getattr(t, f.name) for t in parts]) for f in fields(Terms)))


def fit(
    workload: Workload,
    configs: Sequence[Config],
    measured_ms: Sequence[float] | FloatArray,
    env: Env = A800,
    *,
    starts: int = 8,
    seed: int = 0,
) -> Fit:
    """The 7 parameters minimizing RMSLE against measured iteration times (section 4.3).

    Bounded trust-region least squares on log1p residuals, from `starts` starting points
    (one mid-range, the others drawn with `seed`): the objective is not convex in the
    overlap degrees, so one start can stall. The paper asks for >= 7 runs, >= 3 of them
    ZeRO-Offload (k_opt_off, k_off and k_swap only show there); fewer is refused."""
    if len(configs) != len(measured_ms):
        raise ValueError(f"{len(configs)} configs but {len(measured_ms)} measurements")
    if len(configs) < len(PARAM_NAMES):
        raise ValueError(f"fit needs >= {len(PARAM_NAMES)} measurements, got {len(configs)}")
    return fit_terms(terms(workload, configs, env), measured_ms, starts=starts, seed=seed)


def fit_terms(
    tm: Terms,
    measured_ms: Sequence[float] | FloatArray,
    *,
    starts: int = 8,
    seed: int = 0,
    min_runs: int = len(PARAM_NAMES),
) -> Fit:
    """`fit` over precomputed terms (one row per measured run). `min_runs` below 7 is for
    reproducing the authors' set-up only (roberta's profile holds 6 runs)."""
    y = np.asarray(measured_ms, dtype=np.float64)
    if len(y) != len(tm.fwd):
        raise ValueError(f"{len(tm.fwd)} configs but {len(y)} measurements")
    if len(y) < min_runs:
        raise ValueError(f"fit needs >= {min_runs} measurements, got {len(y)}")
    if np.any(~(y > 0)):
        raise ValueError("measured iteration times must be > 0")
    log_y = np.log1p(y)
    lo, hi = LOWER.array(), UPPER.array()

    def residuals(x: FloatArray) -> FloatArray:
        return np.log1p(iter_time_from_terms(x, tm)) - log_y

    rng = np.random.default_rng(seed)
    # Log-uniform draws between the bounds (k_opt and k_const start from a small floor).
    floor = np.maximum(lo, np.array([0.1, 1.0, 1e-3, 1e-2, 1.0, 1.0, 1e-1]))
    mid = np.exp((np.log(floor) + np.log(hi)) / 2)
    guesses = [np.array([2.0, 2.0, 0.05, 3.0, 2.0, 2.0, float(np.min(y)) / 10])]
    guesses += [mid] + [np.exp(rng.uniform(np.log(floor), np.log(hi))) for _ in range(starts - 2)]
    best: FloatArray | None = None
    best_cost = math.inf
    for x0 in guesses:
        res = least_squares(residuals, np.clip(x0, lo, hi), bounds=(lo, hi), method="trf")
        if res.cost < best_cost:
            best, best_cost = res.x, float(res.cost)
    assert best is not None
    return Fit(Params.from_array(best), rmsle(iter_time_from_terms(best, tm), y))


def relative_errors(
    params: Params,
    workload: Workload,
    configs: Sequence[Config],
    measured_ms: Sequence[float] | FloatArray,
    env: Env = A800,
) -> FloatArray:
    """|predicted - measured| / measured per config (Table 2's error)."""
    y = np.asarray(measured_ms, dtype=np.float64)
    pred = iter_time_from_terms(params, terms(workload, configs, env))
    return np.asarray(np.abs(pred - y) / y, dtype=np.float64)
