"""Loaders for Rubick's measured data (shared/data/rubick; see its README.md).

- profile/<model>/config.csv + data.csv: the profiled runs (one node each), times in ms;
  zero_type 0/1/2 = plain DP / ZeRO-Offload / ZeRO-DP; forward_time is a GPU's whole
  forward pass in the iteration.
- profile/history.csv: the artifact's own fitted parameters (a reference, not an oracle),
  for the artifact's form of Eq. 1 (`artifact_model`: k_off and k_swap are additive ms
  there, not overlap degrees).
- placements/<file>.csv: iteration time (seconds; converted to ms here) per plan code and
  placement. Plan codes: 'ga' (DP, GA allowed), 'gc', 'zero-dp', 'zero-offload',
  'zero-offload+gc', 'tp+ga', and 3-digit 'ptd' (PP, TP, DP sizes). Their component
  columns mix units between files, so only iter_time is read.

The data do not give the global batch, the GA steps, the PP micro-batch count or the number
of layers. Layers are the models' published ones (MODELS); the global batch is 8 x the
profile's batch_size (one node's worth); GA steps are 1. For the DP family this changes
nothing (T_fwd comes from the profile at the same per-GPU work); TP and PP volumes scale
with b, so 3D predictions rest on that guess (the bench reports them apart).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.rubick.model import Config, ForwardSample, Params, Workload
from gearshift.common.rubick.plans import Plan, Resources, Zero

# Published layer counts (the data's seq_hid is sequence x hidden x layers).
MODELS: dict[str, int] = {
    "vit": 12,
    "roberta": 24,
    "bert": 24,
    "t5": 32,
    "gpt2": 48,
    "llama7b": 32,
    "llama30b": 60,
}
# placements/ file per profiled model (the 3B T5 and the batch-16 LLaMA files have no profile).
PLACEMENT_FILES: dict[str, str] = {
    "vit": "vit.csv",
    "roberta": "roberta.csv",
    "bert": "bert.csv",
    "t5": "t5.csv",
    "gpt2": "gpt2.csv",
    "llama7b": "llama7.csv",
    "llama30b": "llama30.csv",
}
HISTORY_COLUMNS = ("k_bwd", "k_sync", "k_opt", "k_os_offload", "k_off", "k_swap", "k_const")
# CPU cores per GPU where a placements file gives none: the profiles' own (4 under
# ZeRO-Offload, 1 otherwise; only ZeRO-Offload's T_opt reads it).
OFFLOAD_CPUS = 4


@dataclass(frozen=True)
class Measurement:
    """One measured run: a config and its iteration time in ms."""

    config: Config
    iter_ms: float
    source: str  # 'profile' or 'placements'
    # The profile's parts (ms), for the artifact's joint fit: this run's own forward pass,
    # T_cc (backward and gradient sync, after the forward) and T_opt. None in placements.
    forward_ms: float | None = None
    tcc_ms: float | None = None
    topt_ms: float | None = None


@dataclass(frozen=True)
class ModelData:
    """A model's profile (its workload and profiled runs) and its placement runs."""

    workload: Workload
    profiled: tuple[Measurement, ...]
    placements: tuple[Measurement, ...]
    skipped: tuple[str, ...]  # placement rows that could not be read, with the reason


def _zero(code: str) -> Zero:
    return {"0": Zero.NONE, "1": Zero.OFFLOAD, "2": Zero.DP}[code]


def plan_from_code(code: str, gpus: int) -> Plan:
    """A placements file's plan code on `gpus` GPUs."""
    named = {
        "ga": Plan(dp=gpus),
        "gc": Plan(dp=gpus, gc=True),
        "zero-dp": Plan(dp=gpus, zero=Zero.DP),
        "zero-offload": Plan(dp=gpus, zero=Zero.OFFLOAD),
        "zero-offload+gc": Plan(dp=gpus, zero=Zero.OFFLOAD, gc=True),
        "tp+ga": Plan(tp=gpus),
    }
    if code in named:
        return named[code]
    if len(code) == 3 and code.isdigit():
        p, t, d = (int(c) for c in code)
        if p * t * d != gpus:
            raise ValueError(f"plan {code} needs {p * t * d} GPUs, placement has {gpus}")
        return Plan(dp=d, tp=t, pp=p, micro_batches=p if p > 1 else 1)
    raise ValueError(f"unknown plan code {code!r}")


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def load_history(root: Path) -> dict[str, Params]:
    """The artifact's fitted parameters per model (names lower-cased, e.g. 'llama7b')."""
    out = {}
    for row in _read(Path(root) / "profile" / "history.csv"):
        out[row["model"].lower()] = Params(*(float(row[c]) for c in HISTORY_COLUMNS))
    return out


def load_profile(root: Path, model: str) -> tuple[Workload, tuple[Measurement, ...]]:
    """A model's workload (forward samples from every profiled run) and its profiled runs."""
    folder = Path(root) / "profile" / model
    cfgs, data = _read(folder / "config.csv"), _read(folder / "data.csv")
    if len(cfgs) != len(data):
        raise ValueError(f"{folder}: {len(cfgs)} configs but {len(data)} measurements")
    layers = MODELS[model]
    batch = 8 * int(cfgs[0]["batch_size"])
    runs, forward = [], []
    for c, m in zip(cfgs, data, strict=True):
        gpus, nodes = int(c["gpus"]), int(c["nodes"])
        if c["is_tp"] != "0" or c["is_pp"] != "0" or nodes != 1:
            raise ValueError(f"{folder}: only single-node DP-family profiles are read")
        plan = Plan(dp=gpus, zero=_zero(c["zero_type"]))
        res = Resources((gpus,), int(c["num_cpu_threads"]))
        parts = (float(m["forward_time"]), float(m["Tcc"]), float(m["Topt"]))
        runs.append(Measurement(Config(plan, res), float(m["iter_time"]), "profile", *parts))
        forward.append(ForwardSample(batch / gpus, float(m["forward_time"])))
    c0 = cfgs[0]
    workload = Workload(
        name=model,
        params_m=float(c0["parameter_size"]),
        global_batch=batch,
        seq_hid_layers=float(c0["seq_hid"]),
        layers=layers,
        forward=tuple(forward),
    )
    return workload, tuple(runs)


def load_placements(root: Path, model: str) -> tuple[tuple[Measurement, ...], tuple[str, ...]]:
    """A model's placement runs (iteration times in ms); unreadable or zero rows are skipped."""
    path = Path(root) / "placements" / PLACEMENT_FILES[model]
    runs, skipped = [], []
    for row in _read(path):
        placement = tuple(int(ch) for ch in row["placement"])
        secs = float(row["iter_time"])
        try:
            plan = plan_from_code(row["exec_plan"], sum(placement))
        except ValueError as exc:
            skipped.append(f"{row['exec_plan']}@{row['placement']}: {exc}")
            continue
        default_cpus = OFFLOAD_CPUS if plan.zero is Zero.OFFLOAD else 1
        cpus = int(row.get("cpu_threads") or default_cpus)
        if secs <= 0:
            skipped.append(f"{row['exec_plan']}@{row['placement']}: no time (OOM)")
            continue
        cfg = Config(plan, Resources(placement, cpus))
        runs.append(Measurement(cfg, secs * 1e3, "placements"))
    return tuple(runs), tuple(skipped)


def load_model(root: Path, model: str) -> ModelData:
    """Profile and placement runs of one model."""
    workload, profiled = load_profile(root, model)
    placements, skipped = load_placements(root, model)
    return ModelData(workload, profiled, placements, skipped)


def profiled_models(root: Path) -> list[str]:
    """Models with a profile folder, in a stable order."""
    return sorted(p.name for p in (Path(root) / "profile").iterdir() if p.is_dir())
