"""Rubick's performance model: fit time per job, and prediction errors next to Table 2.

    python bench/rubick.py [--data ../shared/data/rubick] [--repeat 5]
    python bench/rubick.py --table2     # only Table 2 in the authors' set-up

1. Fit time: `fit` on a model's 7 profiled runs (8 starts of bounded least squares),
   the median of --repeat runs per model. Target: < 1 s per job.
   The same through the Brain's FitModel RPC handler (the servicer over an SQLite store,
   in-process: validation, the stored runs read back, the fit, the fit stored) - the
   time per job a FitModel call costs the Brain, without the network.
2. Check (b): per model, fit on 7 single-node runs and predict every other run of its
   placements file (gearshift.common.rubick.validation); mean and max relative error per
   plan family, Table 2's figures beside them, and the single-node runs alone (which do
   not depend on the inter-node bandwidth that the data do not give).
3. Algorithm 1's decision time at 1,000 jobs on 64 nodes (512 A800 GPUs): 1,000 jobs drawn
   from workload-base.csv's mix (generated, seeded), all queued, one `allocate` call; then
   the same snapshot again with the first decision's jobs running (the allocator's memory
   holds their placements). Median of --repeat. Target: < 1 s. Curves are cached per
   (model, plan, CPUs); the first call fills the cache and is reported apart.

4. Check (c), `--real` (only that part runs): on this machine, Rubick's profiling run
   (gearshift.worker.profiling.rubick_run, the real runtime loop) over the digits CNN and
   the tiny LM: per-EST batch 8/16/32 (--batches) x ESTs per process 1/2/4 x GC off/on at 1
   thread (18 configurations) and x ESTs 1/2 x GC at 2 threads (12) (--threads 1,2). Each
   configuration's iteration time is the median of --steps timed steps after 2 warm-up
   steps, and of --repeat passes over the grid. Per thread count (Eq. 1 has no thread
   term outside ZeRO-Offload: a thread count is another device), fit on 7 configurations
   spread evenly over the grid, predict the rest; mean and max error beside Table 2's
   worst figures (mean <= 7.4%, max <= 10.4%). The load average is printed with them.

5. `--table2` (only that part runs): Table 2 in the authors' set-up
   (gearshift.common.rubick.table2): per model and variant (Eq. 1 as built; the artifact's
   form and joint fit), fit on the profile rows, the 16 single-node points' mean and max
   error per plan family beside Table 2's, and apart, labelled, the same fit's error on the
   multi-node rows the paper never tested.

The CPU is shared: figures are what one run measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shared import shared_data
from gearshift.brain import rubick_messages
from gearshift.brain.rubick import fit_runs as fit_brain_runs
from gearshift.brain.rubick import run_terms
from gearshift.brain.service import BrainService
from gearshift.brain.servicer import BrainServicer
from gearshift.brain.storage import SqlBrainStore
from gearshift.common.db import create_engine, open_database
from gearshift.common.rubick.data import Measurement, load_model, profiled_models
from gearshift.common.rubick.model import A800, Env, Fit, fit, iter_time_from_terms, relative_errors
from gearshift.common.rubick.perf import load_perf
from gearshift.common.rubick.plans import Zero
from gearshift.common.rubick.validation import TABLE2, family, fit_runs, validate
from gearshift.scheduler.plugins.rubick.rubick_policy import make_rubick
from gearshift.scheduler.sim.rubick_sim import rubick_devices
from gearshift.scheduler.sim.rubick_trace import generate_rubick_workload
from gearshift.scheduler.types import JobSnapshot, Snapshot
from gearshift.v1 import brain_pb2

if TYPE_CHECKING:
    from gearshift.worker.profiling.rubick_run import RubickProfile

DEFAULT_DATA = shared_data("rubick")


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def fit_times(root: Path, repeat: int, env: Env) -> None:
    print("1. fit time per job (7 runs, median of", repeat, "runs; target < 1 s)")
    for model in profiled_models(root):
        data = load_model(root, model)
        runs = fit_runs(data)
        if len(runs) < 7:
            print(f"   {model:9s} -  ({len(runs)} runs: cannot fit 7 parameters)")
            continue
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fit(data.workload, [m.config for m in runs], [m.iter_ms for m in runs], env)
            times.append(time.perf_counter() - t0)
        print(f"   {model:9s} {statistics.median(times):6.3f} s")


def _run_message(m: Measurement) -> brain_pb2.RubickRun:
    p, res = m.config.plan, m.config.resources
    zero: dict[Zero, brain_pb2.ZeroMode.ValueType] = {
        Zero.NONE: brain_pb2.ZERO_MODE_UNSPECIFIED,
        Zero.DP: brain_pb2.ZERO_MODE_DP,
        Zero.OFFLOAD: brain_pb2.ZERO_MODE_OFFLOAD,
    }
    return brain_pb2.RubickRun(
        plan=brain_pb2.RubickPlan(
            dp=p.dp, tp=p.tp, pp=p.pp, ga=p.ga, gc=p.gc, zero=zero[p.zero],
            micro_batches=p.micro_batches,
        ),
        resources=brain_pb2.RubickResources(
            placement=list(res.placement), cpus_per_gpu=res.cpus_per_gpu
        ),
        iteration_seconds=m.iter_ms / 1e3,
    )  # fmt: skip


def fit_rpc_times(root: Path, repeat: int) -> None:
    print("   FitModel through the Brain's handler (SQLite store, in-process), median:")
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(open_database(f"sqlite:///{tmp}/brain.db", migrate_first=True))
        servicer = BrainServicer(BrainService(SqlBrainStore(engine)))
        for model in profiled_models(root):
            data = load_model(root, model)
            runs = fit_runs(data)
            if len(runs) < 7:
                continue
            w = data.workload
            request = brain_pb2.FitModelRequest(
                model_key=model,
                workload=brain_pb2.RubickWorkload(
                    params_millions=w.params_m, global_batch=w.global_batch,
                    seq_hid_layers=w.seq_hid_layers, layers=w.layers,
                    forward=[
                        brain_pb2.RubickForward(samples_per_gpu=f.work, milliseconds=f.ms)
                        for f in w.forward
                    ],
                ),
                runs=[_run_message(m) for m in runs],
            )  # fmt: skip
            times, fitted = [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                reply = servicer.FitModel(request, None)  # type: ignore[arg-type]
                times.append(time.perf_counter() - t0)
                fitted.append(reply.fit_seconds)
            print(
                f"   {model:9s} {statistics.median(times):6.3f} s "
                f"(of which the fit {statistics.median(fitted):.3f} s)"
            )
        engine.dispose()


def table(root: Path, env: Env) -> None:
    print("\n2. check (b): mean / max error per plan family (ours | Table 2)")
    print(
        f"   env: B_intra {env.b_intra} GB/s, B_inter {env.b_inter} GB/s, B_pcie {env.b_pcie} GB/s"
    )
    for model in profiled_models(root):
        data = load_model(root, model)
        report = validate(data, env)
        if report.fit is None:
            print(f"   {model:9s} not fitted: {report.note}")
            continue
        print(f"   {model:9s} fit RMSLE {report.fit.rmsle:.3f}")
        for fam, errs in sorted(report.errors.items()):
            paper = TABLE2.get(model, {}).get(fam)
            ref = f"{_pct(paper[0])} / {_pct(paper[1])}" if paper else "   -  /   -"
            print(
                f"     {fam:13s} n={len(errs):3d}  {_pct(errs.mean())} / {_pct(errs.max())}"
                f"  | {ref}"
            )
        all_errs = np.concatenate(list(report.errors.values()))
        seen = {m.config for m in fit_runs(data)}
        single = [
            m
            for m in data.placements
            if len(m.config.resources.placement) == 1
            and m.config not in seen
            and family(m.config.plan) in ("dp", "gc", "zero-dp", "zero-offload")
        ]
        e1 = relative_errors(
            report.fit.params,
            data.workload,
            [m.config for m in single],
            [m.iter_ms for m in single],
            env,
        )
        print(
            f"     {'all':13s} n={len(all_errs):3d}  {_pct(all_errs.mean())} / "
            f"{_pct(all_errs.max())}  | <= 7.4% / <= 10.4%"
        )
        print(f"     {'single-node':13s} n={len(e1):3d}  {_pct(e1.mean())} / {_pct(e1.max())}")


def decision_time(root: Path, repeat: int) -> None:
    print("\n3. Algorithm 1 decision time, 1,000 jobs on 64 nodes (target < 1 s)")
    perf = load_perf(root)
    jobs = generate_rubick_workload(perf, 1000, 30.0, tenants={"A": 256, "B": 0}, seed=0)
    devices = rubick_devices(64, 8)
    snaps = tuple(
        JobSnapshot(
            job_id=str(i), num_ests=j.gpus, min_devices=j.gpus, max_devices=j.gpus,
            types=("a800",), capability={}, throughputs={}, steps_remaining=float(j.steps),
            arrival_time=0.0, entity=j.tenant, request=j.request(),
        )
        for i, j in enumerate(jobs)
    )  # fmt: skip
    for variant in ("rubick", "rubick_n"):
        times = []
        first = 0.0
        for k in range(repeat + 1):
            policy = make_rubick(perf, variant, quotas={"A": 256})
            t0 = time.perf_counter()
            targets = policy.allocate(Snapshot(0.0, devices, snaps))
            took = time.perf_counter() - t0
            if k == 0:
                first = took
                continue
            running = tuple(
                replace(s, current=(("a800", targets[s.job_id].size),))
                if s.job_id in targets
                else s
                for s in snaps
            )
            t0 = time.perf_counter()
            policy.allocate(Snapshot(60.0, devices, running))
            times.append(max(took, time.perf_counter() - t0))
        print(
            f"   {variant:9s} {statistics.median(times):6.3f} s "
            f"(first call, filling the curve cache: {first:.3f} s; {len(targets)} jobs placed)"
        )


FIT_COUNT = 7
# Check (c)'s jobs: (name, module, config, the job's global batch).
REAL_JOBS: tuple[tuple[str, str, dict[str, object], int], ...] = (
    ("digits-cnn", "gearshift.examples.digits_cnn", {"lr": 0.05}, 64),
    ("tiny-lm", "gearshift.examples.tiny_lm", {}, 32),
)
REAL_BATCHES = (8, 16, 32)  # per-EST batches (--batches)


def real_grids(
    batches: tuple[int, ...], threads: tuple[int, ...]
) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
    """(per-EST batches, ESTs per process, threads) per thread count; GC off and on in each:
    ESTs 1/2/4 at 1 thread, 1/2 at more (the grid stays under the profiler's bound)."""
    return [(batches, (1, 2, 4) if t == 1 else (1, 2), t) for t in threads]


def fit_indices(n: int, count: int = FIT_COUNT) -> list[int]:
    """`count` configurations spread evenly over a grid of n (first and last included)."""
    return sorted({int(i) for i in np.linspace(0, n - 1, count).round()})


def holdout(
    request: brain_pb2.StoreRubickProfileRequest, count: int = FIT_COUNT
) -> tuple[Fit, np.ndarray, list[int]]:
    """Fit Eq. 1 on `count` of the request's runs as the Brain does (its validation, its
    per-run global batches), and the relative errors on the others."""
    workload = rubick_messages.workload(request.workload)
    runs = rubick_messages.runs(request.runs)
    chosen = fit_indices(len(runs), count)
    fitted = fit_brain_runs(workload, [runs[i] for i in chosen], A800)
    rest = [r for i, r in enumerate(runs) if i not in chosen]
    measured = np.array([r.iteration_ms for r in rest])
    predicted = iter_time_from_terms(fitted.params, run_terms(workload, rest, A800))
    return fitted, np.abs(predicted - measured) / measured, chosen


def gc_over_forward(profile: RubickProfile, clock: str) -> list[float]:
    """Per (per-EST batch, ESTs, threads): (T with GC - T without) / (ESTs x T_fwd), which
    Eq. 1 fixes at 1 (T_bwd gains one T_fwd under GC)."""
    by = {(t.point.batch_per_est, t.point.ests, t.point.threads, t.point.gc): t.ms(clock)
          for t in profile.runs}  # fmt: skip
    forward = profile.forward_cpu_ms if clock == "cpu" else profile.forward_ms
    return [
        (by[(b, k, th, True)] - ms) / (k * forward[(b, th)])
        for (b, k, th, gc), ms in by.items()
        if not gc and (b, k, th, True) in by and forward.get((b, th), 0) > 0
    ]


def real(
    repeat: int,
    steps: int,
    batches: tuple[int, ...] = REAL_BATCHES,
    thread_counts: tuple[int, ...] = (1, 2),
) -> None:
    """Check (c): see the module docstring."""
    import os

    from gearshift.worker.profiling.rubick_run import Timed, grid, measure

    print("4. check (c): real profiling runs here, fit on 7, error on the rest")
    print(f"   load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, module, config, batch in REAL_JOBS:
        grids = real_grids(batches, thread_counts)
        points = [p for b, k, t in grids for p in grid(b, k, [False, True], [t])]
        passes = []
        t0 = time.perf_counter()
        for _ in range(repeat):
            passes.append(measure(module, config, points, global_batch=batch, steps=steps))
        took = time.perf_counter() - t0
        # The median over passes of each configuration's (and each forward's) median.
        first = passes[0]
        runs = tuple(
            Timed(
                r.point,
                statistics.median(p.runs[i].iteration_ms for p in passes),
                (),
                statistics.median(p.runs[i].cpu_ms for p in passes),
            )
            for i, r in enumerate(first.runs)
        )
        forward = {k: statistics.median(p.forward_ms[k] for p in passes) for k in first.forward_ms}
        forward_cpu = {
            k: statistics.median(p.forward_cpu_ms[k] for p in passes) for k in first.forward_ms
        }
        profile = replace(first, runs=runs, forward_ms=forward, forward_cpu_ms=forward_cpu)
        print(
            f"   {name}: {len(points)} configurations x {repeat} passes in {took:.0f} s, "
            f"{first.params:,} parameters"
        )
        for clock in ("wall", "cpu"):
            all_errs = []
            for threads in profile.thread_counts:
                fitted, errs, chosen = holdout(profile.request(threads, clock))
                all_errs.append(errs)
                n = len(errs) + len(chosen)
                p = fitted.params
                rest = [
                    t.point
                    for i, t in enumerate(r for r in profile.runs if r.point.threads == threads)
                    if i not in chosen
                ]
                by_gc = "; ".join(
                    f"GC {'on' if gc else 'off'} {_pct(e.mean())} / {_pct(e.max())}"
                    for gc in (False, True)
                    if len(e := errs[[pt.gc is gc for pt in rest]])
                )
                print(
                    f"     {clock:4s} clock, {threads} thread(s): fit on {len(chosen)} of {n} "
                    f"(RMSLE {fitted.rmsle:.3f}; k_bwd {p.k_bwd:.2f}, k_const {p.k_const:.2f} ms)"
                    f", error on {len(errs)}: mean {_pct(errs.mean())}, max {_pct(errs.max())} "
                    f"({by_gc})"
                )
            errs = np.concatenate(all_errs)
            verdict = "within" if errs.mean() <= 0.074 and errs.max() <= 0.104 else "outside"
            print(
                f"     {clock:4s} clock, all: n={len(errs)} mean {_pct(errs.mean())} / max "
                f"{_pct(errs.max())}  | Table 2: <= 7.4% / <= 10.4% ({verdict})"
            )
        for clock in ("wall", "cpu"):
            ratios = gc_over_forward(profile, clock)
            if ratios:
                print(
                    f"     {clock:4s} clock: GC adds {statistics.median(ratios):.1f} x T_fwd per "
                    f"EST (median of {len(ratios)} pairs, {min(ratios):.1f}-{max(ratios):.1f}); "
                    "Eq. 1 says 1 x (one more forward in the backward pass)"
                )
        print("       configuration       wall ms   cpu ms")
        for timed in profile.runs:
            print(f"       {timed.point.label:18s} {timed.iteration_ms:8.2f} {timed.cpu_ms:8.2f}")
    print(f"   load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def table2_authors(root: Path) -> None:
    """Part 5: Table 2 in the authors' set-up, both variants."""
    from gearshift.common.rubick.table2 import AUTHORS_ENV, PAPER_MAX, PAPER_MEAN, Variant, table2

    print("Table 2, the authors' set-up: fit on the profile rows, 16 single-node points")
    print(f"  target: mean <= {PAPER_MEAN:.2%}, max <= {PAPER_MAX:.2%} per model")
    for variant in Variant:
        for model in AUTHORS_ENV:
            started = time.perf_counter()
            r = table2(load_model(root, model), variant)
            secs = time.perf_counter() - started
            ok = r.errors.mean() <= PAPER_MEAN and r.errors.max() <= PAPER_MAX
            print(
                f"  {variant.value:8s} {model:8s} mean {r.errors.mean():6.2%} max "
                f"{r.errors.max():6.2%} {'within' if ok else 'MISSES'}  (fit+predict {secs:.1f} s)"
            )
            for fam, (mean, most) in r.by_family().items():
                paper = TABLE2[model].get(fam)
                ref = f"{paper[0]:.2%} / {paper[1]:.2%}" if paper else "-"
                print(f"      {fam:13s} {mean:6.2%} / {most:6.2%}   Table 2: {ref}")
            m = r.multi_node_errors
            print(
                f"      beyond the paper, {len(m)} multi-node rows (100 GB/s network): "
                f"mean {m.mean():.1%} max {m.max():.1%}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--b-inter", type=float, default=Env().b_inter, help="GB/s across nodes")
    ap.add_argument("--real", action="store_true", help="only check (c): profile here")
    ap.add_argument("--table2", action="store_true", help="only Table 2, the authors' set-up")
    ap.add_argument("--steps", type=int, default=15, help="--real: timed steps per config")
    ap.add_argument("--batches", default="8,16,32", help="--real: per-EST batches, comma-separated")
    ap.add_argument("--threads", default="1,2", help="--real: thread counts, comma-separated")
    args = ap.parse_args()
    if args.real:
        try:
            batches = tuple(int(b) for b in args.batches.split(","))
            threads = tuple(int(t) for t in args.threads.split(","))
        except ValueError:
            ap.error("--batches and --threads take comma-separated integers, e.g. 8,16,32")
        real(args.repeat, args.steps, batches, threads)
        return
    if not (args.data / "profile").is_dir():
        sys.exit(f"Rubick data not found at {args.data} (set GEARSHIFT_SHARED_DIR or --data)")
    if args.table2:
        table2_authors(args.data)
        return
    env = Env(b_inter=args.b_inter)
    fit_times(args.data, args.repeat, env)
    fit_rpc_times(args.data, args.repeat)
    table(args.data, env)
    decision_time(args.data, args.repeat)


if __name__ == "__main__":
    main()
