"""`gearshift profile` and `gearshift plan --burst`: a job's layer profile and DeepPool's
burst-parallel plan over it.

`profile` runs the torch.fx profiler on the job's model as a subprocess
(`python -m gearshift.worker.profiling.profile_job`: the client imports no service package,
and torch is the worker extra's) and stores the profile in the Brain under the job spec's
fingerprint (gearshift.common.profiles.profile_key). `plan --burst` asks the Brain to plan
over the profile stored for the same job file (PlanBurstParallel) and prints the per-layer
device counts. The runtime executes data-parallel plans only: the plan decides how many
devices a job should hold, not how its layers run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from google.protobuf import json_format

from gearshift.client import render
from gearshift.client.options import add_brain_options, brain_channel, client_tls
from gearshift.client.profiler_run import run_profiler
from gearshift.client.rubick_profile import add_rubick_options, cmd_profile_rubick
from gearshift.client.spec import JobFile, load_job
from gearshift.common import codepkg
from gearshift.common.errors import NotFoundError, ValidationError, typed_call
from gearshift.common.model_identity import model_type_of
from gearshift.common.profiles import profile_key
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2

PROFILER_MODULE = "gearshift.worker.profiling.profile_job"
DEVICES = ("cpu", "cuda")


def _brain_options(parser: argparse.ArgumentParser) -> None:
    add_brain_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_profile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="job YAML (the model is its entrypoint's build(config))")
    parser.add_argument(
        "--global-batch", type=int, default=0, help="B (default: the job's global batch)"
    )
    parser.add_argument(
        "--max-devices",
        type=int,
        default=0,
        help="profile per-device batches B/g for g = 1, 2, 4, ... this (a power of two "
        "dividing B; default: the largest such up to the job's elastic max or ESTs)",
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where to measure")
    parser.add_argument("--repeats", type=int, default=3, help="timings per layer (least counts)")
    parser.add_argument("--out", type=Path, help="also write the profile's JSON here")
    parser.add_argument("--no-store", action="store_true", help="do not store it in the Brain")
    _brain_options(parser)
    add_rubick_options(parser)


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="job YAML, profiled before with `gearshift profile`")
    parser.add_argument(
        "--burst", action="store_true", required=True, help="DeepPool's burst-parallel plan"
    )
    parser.add_argument(
        "--amp-limit",
        type=float,
        default=2.0,
        help="each layer's device-seconds over its one-device seconds at most this "
        "(>= 1; default %(default)s)",
    )
    parser.add_argument(
        "--devices", type=int, default=0, help="most devices a layer may use (default: profiled)"
    )
    parser.add_argument(
        "--global-batch", type=int, default=0, help="B (default: the job's global batch)"
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="the profile's device")
    parser.add_argument(
        "--parallel-branches", action="store_true", help="side branches may use extra devices"
    )
    parser.add_argument(
        "--free-network", action="store_true", help="communication costs nothing (a bound)"
    )
    _brain_options(parser)


def _spec_with_code(job: JobFile) -> common_pb2.JobSpec:
    """The spec as submitted: a job of the user's own code names its package's digest."""
    spec = common_pb2.JobSpec()
    spec.CopyFrom(job.spec)
    if job.code is not None:
        spec.entrypoint.code_sha256 = codepkg.package(job.code).sha256
    return spec


def _default_max_devices(spec: common_pb2.JobSpec, batch: int) -> int:
    """The largest power of two up to the job's device bound that divides the batch."""
    bound = max(1, spec.elastic.max_devices or spec.num_ests or 1)
    g = 1
    while g * 2 <= bound and batch % (g * 2) == 0:
        g *= 2
    return g


def _run_profiler(
    args: argparse.Namespace, job: JobFile, batch: int, devices: int
) -> brain_pb2.LayerProfile:
    options = [
        "--global-batch", str(batch),
        "--max-devices", str(devices),
        "--device", args.device,
        "--repeats", str(args.repeats),
    ]  # fmt: skip
    text = run_profiler(
        PROFILER_MODULE, job, options, flag="--device", source=str(args.file), what="the profiler"
    )
    return json_format.Parse(text, brain_pb2.LayerProfile())


def cmd_profile(args: argparse.Namespace) -> int:
    if args.rubick:
        return cmd_profile_rubick(args)
    job = load_job(args.file)  # a bad file raises before anything runs
    spec = _spec_with_code(job)
    batch = args.global_batch or spec.global_batch_size
    if batch < 1:
        raise ValidationError("--global-batch", "must be >= 1 (the job file gives none)")
    devices = args.max_devices or _default_max_devices(spec, batch)
    if devices < 1 or devices & (devices - 1) or batch % devices:
        raise ValidationError(
            "--max-devices", f"{devices}: want a power of two dividing the global batch {batch}"
        )
    if args.repeats < 1:
        raise ValidationError("--repeats", "must be >= 1")
    tls = client_tls(args)
    profile = _run_profiler(args, job, batch, devices)
    key = profile_key(spec, args.device)
    if args.out:
        args.out.write_text(json_format.MessageToJson(profile, indent=1) + "\n")
    outcome = "not stored (--no-store)"
    if not args.no_store:
        request = brain_pb2.StoreLayerProfileRequest(
            key=key, model_type=model_type_of(spec), profile=profile
        )
        with brain_channel(args, tls) as ch:
            reply = typed_call(lambda: brain_pb2_grpc.BrainStub(ch).StoreLayerProfile(request))
        what = "replaced" if reply.replaced else "stored" if reply.written else "unchanged"
        outcome = f"{what} in the Brain at {args.brain}"
    if args.json:
        render.print_json({"key": key, "stored": outcome, "profile": render.as_dict(profile)})
    else:
        print(profile_table(profile))
        print(
            f"profile {key}: {len(profile.layers)} layers, {len(profile.edges)} edges, global "
            f"batch {profile.global_batch}, devices "
            f"{','.join(map(str, profile.device_counts))}, on {profile.device}; {outcome}"
        )
    return 0


def profile_table(profile: brain_pb2.LayerProfile) -> str:
    counts = list(profile.device_counts)
    header = ("LAYER", *(f"g={g} ms" for g in counts), "OUT B/SAMPLE", "PARAM B")
    rows = [
        (
            layer.name,
            *(f"{t * 1e3:.3f}" for t in layer.seconds),
            f"{layer.output_bytes_per_sample:.0f}",
            str(layer.parameter_bytes),
        )
        for layer in profile.layers
    ]
    return render.table(rows, header)


def cmd_plan(args: argparse.Namespace) -> int:
    job = load_job(args.file)
    spec = _spec_with_code(job)
    if not args.amp_limit >= 1:
        raise ValidationError("--amp-limit", f"must be >= 1, got {args.amp_limit}")
    if args.devices < 0:
        raise ValidationError("--devices", "must be >= 1")
    key = profile_key(spec, args.device)
    request = brain_pb2.PlanBurstParallelRequest(
        profile_key=key,
        global_batch=args.global_batch or spec.global_batch_size,
        max_devices=args.devices,
        amp_limit=args.amp_limit,
        network=brain_pb2.NetworkSettings(free=args.free_network),
        parallel_branches=args.parallel_branches,
    )
    tls = client_tls(args)
    with brain_channel(args, tls) as ch:
        try:
            plan = typed_call(lambda: brain_pb2_grpc.BrainStub(ch).PlanBurstParallel(request))
        except NotFoundError as exc:
            raise NotFoundError(
                f"{exc.message}: run `gearshift profile {args.file}"
                f"{' --device ' + args.device if args.device != 'cpu' else ''}` first"
            ) from None
    if args.json:
        render.print_json({"key": key, **render.as_dict(plan)})
    else:
        print(plan_text(plan, args.amp_limit))
    return 0


def plan_text(plan: brain_pb2.BurstParallelPlan, amp_limit: float) -> str:
    """The per-layer table, then what the plan predicts beside plain data parallelism."""
    rows = [
        (
            layer.name,
            str(layer.device_count) + (" +" if layer.on_extra_devices else ""),
            f"{layer.amplification:.2f}",
        )
        for layer in plan.layers
    ]
    speedup = plan.data_parallel_seconds / plan.iteration_seconds if plan.iteration_seconds else 0
    lines = [
        render.table(rows, ("LAYER", "DEVICES", "AMP")),
        f"burst-parallel plan, amplification limit {amp_limit:g}, global batch "
        f"{plan.global_batch}, at most {plan.max_devices} devices:",
        f"  iteration {plan.iteration_seconds * 1e3:.3f} ms; data parallel on "
        f"{plan.max_devices}: {plan.data_parallel_seconds * 1e3:.3f} ms (x{speedup:.2f}); one "
        f"device: {plan.single_device_seconds * 1e3:.3f} ms",
        f"  device-seconds {plan.device_seconds:.6g}, amplification {plan.amplification:.2f}, "
        f"peak {plan.peak_devices} devices; an elastic job should ask for "
        f"{plan.elastic_devices}",
    ]
    if any(layer.on_extra_devices for layer in plan.layers):
        lines.append("  + the first layer of a branch that runs on extra devices")
    return "\n".join(lines)
