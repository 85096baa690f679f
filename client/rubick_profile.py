"""`gearshift profile --rubick JOB.yaml`: Rubick's profiling run by hand.

Runs `python -m gearshift.worker.profiling.rubick_run` (the client imports no service
package; torch is the worker extra's) over a grid of per-EST batch sizes, ESTs per process,
GC off/on and intra-op thread counts, prints each configuration's iteration time, and
(unless --no-store) stores the runs in the Brain (StoreRubickProfile) for --job-id or a
model key, then fits Rubick's model on them there (FitModel) and prints the fit.

The model key defaults to the job spec's fingerprint (gearshift.common.profiles.profile_key)
with `:tT` for the thread count T: Eq. 1 has no thread term outside ZeRO-Offload, so each
thread count is fitted as a device of its own. A job id takes one thread count.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from google.protobuf import json_format

from gearshift.client import render
from gearshift.client.options import brain_channel, client_tls
from gearshift.client.profiler_run import run_profiler
from gearshift.client.spec import JobFile, load_job
from gearshift.common.errors import ValidationError, typed_call
from gearshift.common.profiles import profile_key
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2

RUBICK_MODULE = "gearshift.worker.profiling.rubick_run"
GC_CHOICES = ("off", "on", "both")


def add_rubick_options(parser: argparse.ArgumentParser) -> None:
    """The options `gearshift profile --rubick` adds (the others are shared with profile)."""
    group = parser.add_argument_group("--rubick: Rubick's profiling run")
    group.add_argument(
        "--rubick",
        action="store_true",
        help="time the job's training step in several execution plans and fit Rubick's "
        "performance model on them, instead of the layer profile",
    )
    group.add_argument(
        "--batches", default="", help="per-EST batch sizes (default: b/2,b,2b for b = B/N)"
    )
    group.add_argument("--ests", default="", help="ESTs per process (default: 1,2 and N up to 4)")
    group.add_argument("--gc", choices=GC_CHOICES, default="both", help="GC off, on or both")
    group.add_argument("--threads", default="1", help="intra-op thread counts, e.g. 1,2")
    group.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    group.add_argument("--job-id", default="", help="store the runs for this job")
    group.add_argument(
        "--model-key", default="", help="store them under this key (default: the spec's, :tT)"
    )


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValidationError(flag, f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values):
        raise ValidationError(flag, f"want one or more values >= 1, got {text!r}")
    return values


def _defaults(spec: common_pb2.JobSpec, batch: int) -> tuple[str, str]:
    n = max(1, spec.num_ests or 1)
    b = max(1, batch // n)
    batches = sorted({max(1, b // 2), b, 2 * b})
    ests = sorted({1, 2, min(n, 4)})
    return ",".join(map(str, batches)), ",".join(map(str, ests))


def _run(args: argparse.Namespace, job: JobFile, batch: int, batches: str, ests: str) -> Any:
    options = [
        "--global-batch", str(batch),
        "--batches", batches, "--ests", ests, "--gc", args.gc, "--threads", args.threads,
        "--steps", str(args.steps),
    ]  # fmt: skip
    text = run_profiler(
        RUBICK_MODULE,
        job,
        options,
        flag="--rubick",
        source=str(args.file),
        what="the profiling run",
    )
    return json.loads(text)


def _store_and_fit(
    stub: brain_pb2_grpc.BrainStub, runs: dict[str, Any], *, job_id: str, model_key: str
) -> brain_pb2.FittedModel:
    """Store one thread count's runs for the subject, then fit the model on them there."""
    request = json_format.ParseDict(runs, brain_pb2.StoreRubickProfileRequest())
    fit_request = brain_pb2.FitModelRequest()
    if job_id:
        request.job_id = fit_request.job_id = job_id
    else:
        request.model_key = fit_request.model_key = model_key
    typed_call(lambda: stub.StoreRubickProfile(request))
    return typed_call(lambda: stub.FitModel(fit_request))


def cmd_profile_rubick(args: argparse.Namespace) -> int:
    job = load_job(args.file)  # a bad file raises before anything runs
    spec = job.spec
    batch = args.global_batch or spec.global_batch_size
    if batch < 1:
        raise ValidationError("--global-batch", "must be >= 1 (the job file gives none)")
    default_batches, default_ests = _defaults(spec, batch)
    batches, ests = args.batches or default_batches, args.ests or default_ests
    _ints(batches, "--batches")
    _ints(ests, "--ests")
    threads = sorted(set(_ints(args.threads, "--threads")))
    if args.steps < 1:
        raise ValidationError("--steps", "must be >= 1")
    if args.job_id and args.model_key:
        raise ValidationError("--job-id", "give --job-id or --model-key, not both")
    if args.job_id and len(threads) > 1:
        raise ValidationError("--threads", "a job's runs are at one thread count (see --help)")
    tls = client_tls(args)
    result = _run(args, job, batch, batches, ests)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    fits: dict[str, brain_pb2.FittedModel] = {}
    if not args.no_store:
        key = args.model_key or profile_key(spec, "cpu")
        with brain_channel(args, tls) as ch:
            stub = brain_pb2_grpc.BrainStub(ch)
            for t in threads:
                one_key = len(threads) == 1 and bool(args.model_key)
                fits[str(t)] = _store_and_fit(
                    stub,
                    result["profiles"]["wall"][str(t)],
                    job_id=args.job_id,
                    model_key="" if args.job_id else key if one_key else f"{key}:t{t}",
                )
    if args.json:
        render.print_json(
            {"runs": result["runs"], "fits": {t: render.as_dict(f) for t, f in fits.items()}}
        )
        return 0
    rows = [
        (
            f"{r['batch_per_est']}",
            f"{r['ests']}",
            "on" if r["gc"] else "off",
            f"{r['threads']}",
            f"{r['iteration_ms']:.2f}",
            f"{r['cpu_ms']:.2f}",
        )
        for r in result["runs"]
    ]
    print(render.table(rows, ("BATCH/EST", "ESTS", "GC", "THREADS", "WALL MS", "CPU MS")))
    print(f"{len(rows)} runs of {spec.entrypoint.module}, {result['params']:,} parameters")
    if args.no_store:
        print("not stored (--no-store)")
    for count, fitted in fits.items():
        who = f"job {fitted.job_id}" if fitted.job_id else f"model key {fitted.model_key}"
        p, f = fitted.params, fitted
        print(
            f"{count} thread(s): stored and fitted for {who} at {args.brain} on {f.run_count} "
            f"runs: "
            f"RMSLE {f.rmsle:.3f}; k_bwd {p.k_bwd:.3f}, k_opt {p.k_opt:.4g}, "
            f"k_const {p.k_const:.3f} ms ({f.fit_seconds:.2f} s)"
        )
    return 0
