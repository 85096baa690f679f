"""The reference runner's flags, turned into the TrainingTask a worker daemon would write.

`python -m gearshift.worker.run` is run by hand (`--job ...` or `--spec FILE`, with any
flag given after it winning) and by a daemon (`--task FILE --rank R`). Both end in one
message, read by training_task.resolve, so a local run of a spec is the daemon's job.
Every flag defaults to None here, so that a flag given explicitly can be told from its
default and override the spec; the defaults are applied in `task_from_args`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TypeVar

from google.protobuf import json_format

from gearshift.common.errors import ValidationError
from gearshift.common.facts import DETERMINISM_NAMES
from gearshift.common.jobspec import validate_job_spec, with_defaults
from gearshift.v1 import common_pb2, training_pb2, worker_pb2
from gearshift.worker.command import DEFAULT_CHECKPOINT_EVERY
from gearshift.worker.runtime.backend import BACKENDS
from gearshift.worker.runtime.settings import (
    Determinism,
    RunSettings,
    check_procs,
    even_mapping,
    parse_mapping,
    placement,
)
from gearshift.worker.training_task import parse_config

T = TypeVar("T")
LEVELS = {name: level for level, name in DETERMINISM_NAMES.items() if level}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gearshift.worker.run",
        description="Train a job with N ESTs on P processes, bitwise identical for any P.",
    )
    job = parser.add_argument_group("job")
    job.add_argument(
        "--task",
        type=Path,
        help="a TrainingTask file (what a worker daemon writes); with --rank only",
    )
    job.add_argument(
        "--spec",
        type=Path,
        help="a JobSpec as JSON: sets --job, --config, --ests, --batch-size, --steps, --seed, "
        "--shard-size, --data-size, --determinism, --checkpoint-every as the worker daemon would",
    )
    job.add_argument("--job", help="module defining build(config) -> Job")
    job.add_argument(
        "--code-dir",
        type=Path,
        help="folder put first on the import path (a user's code package, unpacked)",
    )
    job.add_argument("--config", help="job config as a JSON object (default {})")
    job.add_argument("--config-file", type=Path, help="job config from a JSON file")
    job.add_argument("--ests", type=int, help="N, the number of ESTs")
    job.add_argument("--batch-size", type=int, help="global batch size B (default 8·N)")
    job.add_argument("--steps", type=int, help="total global steps")
    job.add_argument("--seed", type=int, help="(default 0)")
    job.add_argument("--shard-size", type=int, help="samples per data shard (default 32)")
    job.add_argument("--loader-workers", type=int, help="logical loader workers per EST (2)")
    job.add_argument("--determinism", choices=[d.value for d in Determinism], help="(D1)")
    job.add_argument("--d2-threads", type=int, help="intra-op threads under D2 (1)")
    job.add_argument(
        "--tree",
        choices=["balanced", "fold"],
        help="canonical summation order (fold: only to show that the order matters)",
    )
    job.add_argument(
        "--no-est-rng-contexts",
        action="store_true",
        default=None,
        help="share one RNG stream among a process's ESTs (breaks determinism; for tests)",
    )
    place = parser.add_argument_group("placement")
    place.add_argument("--procs", type=int, help="P, processes (default: from --mapping, else 1)")
    place.add_argument("--mapping", help="ESTs per process, e.g. 2,1,1 (default: even)")
    place.add_argument(
        "--threads",
        help="intra-op threads per process, one value or one per process (e.g. 2,1; default 1)",
    )
    place.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        default=None,
        help="plan: recompute activations in the backward pass (same bits as without)",
    )
    place.add_argument(
        "--offload-optimizer",
        action="store_true",
        default=None,
        help="plan: on GPU keep the optimizer state in host memory and step there (no-op on CPU)",
    )
    place.add_argument("--loader-procs", type=int, help="loader processes per process (0)")
    place.add_argument("--device", choices=["cpu", "cuda"], help="(cpu)")
    ckpt = parser.add_argument_group("checkpoints and output")
    ckpt.add_argument("--checkpoint-dir", type=Path)
    ckpt.add_argument(
        "--resume", action="store_true", default=None, help="continue from the latest checkpoint"
    )
    ckpt.add_argument("--checkpoint-every", type=int, help="every K steps (0: never; default 0)")
    ckpt.add_argument("--keep-checkpoints", type=int, help="(2)")
    ckpt.add_argument("--log-every", type=int, help="progress every K steps (10)")
    ckpt.add_argument(
        "--loss-log", type=Path, help="append each step's EST losses and time (JSON lines)"
    )
    ckpt.add_argument("--stats-dir", type=Path, help="write rank<R>.json run statistics here")
    one = parser.add_argument_group("one process of a job (set by the launcher or a daemon)")
    one.add_argument("--rank", type=int, help="run only this process")
    one.add_argument("--world-size", type=int, help="P, with --rank")
    one.add_argument("--master-addr", help="HOST:PORT where rank 0 listens")
    one.add_argument(
        "--rendezvous-group",
        help="the placement's name at the rendezvous: processes of another placement that "
        "reach the port do not join (default: --job-id)",
    )
    one.add_argument("--timeout", type=float, help="process group timeout (s; 600)")
    one.add_argument(
        "--membership-file",
        type=Path,
        help="in-place membership changes (JSON): read at every global step and applied by "
        "all the job's processes at one step boundary, without a restart",
    )
    one.add_argument(
        "--join-generation",
        type=int,
        help="join the running job at this generation of --membership-file (with --rank, "
        "--mapping and --master-addr of that generation); the state comes from a process "
        "that stays",
    )
    one.add_argument(
        "--local-device",
        type=int,
        help="with --device cuda: this process's GPU, an index among the visible ones "
        "(CUDA_VISIBLE_DEVICES); default: rank mod the number visible; needs --backend",
    )
    one.add_argument(
        "--backend",
        choices=BACKENDS,
        help="the process group's backend; auto (the default): gloo on CPU, and on CUDA nccl "
        "when the processes, all on this machine with rank r on visible GPU r mod their "
        "number, each get a GPU of their own, gloo (host copies) when some share one",
    )
    svc = parser.add_argument_group(
        "services (set by a worker daemon; the token comes from GEARSHIFT_TOKEN)"
    )
    svc.add_argument("--job-id", help="the job's id in the scheduler")
    svc.add_argument("--task-id", help="the task this process belongs to")
    svc.add_argument(
        "--generation",
        type=int,
        help="the placement's generation (the scheduler's, gN in the task id), sent with every "
        "dynamic-mode shard call so a newer placement fences this one out (0: unfenced)",
    )
    svc.add_argument("--brain", help="HOST:PORT: rank 0 reports runtime samples there")
    svc.add_argument("--shard-manager", help="HOST:PORT of the shard manager")
    svc.add_argument("--dataset-id", help="dataset id in the shard manager")
    svc.add_argument(
        "--data-mode",
        choices=["local", "deterministic", "dynamic"],
        help="local (the default): shard plan computed here; deterministic: the same plan read "
        "from the shard manager (GetShardsAt); dynamic: shards pulled as they are needed (not "
        "reproducible)",
    )
    svc.add_argument("--data-size", type=int, help="samples to use, 0..N-1 (0: the whole dataset)")
    svc.add_argument("--accelerator-type", help="device type, for the Brain (cpu)")
    svc.add_argument(
        "--profile-key",
        help="rank 0 first measures the job's layer profile (DeepPool) and stores it in the "
        "Brain (--brain) under this key; a failure is logged and training goes on",
    )
    svc.add_argument(
        "--profile-rubick",
        action="store_true",
        default=None,
        help="rank 0 first runs Rubick's profiling run (a few steps in a few execution plans, "
        "gearshift.worker.profiling.rubick_run) and stores the runs in the Brain (--brain) "
        "for --job-id; a failure is logged and training goes on",
    )
    svc.add_argument("--model-type", help="the job's model type, for the Brain")
    svc.add_argument(
        "--report-interval", type=float, help="seconds between samples sent to the Brain (1)"
    )
    svc.add_argument(
        "--progress-file",
        type=Path,
        help="rank 0 keeps its latest progress here (the worker daemon's heartbeats carry it)",
    )
    svc.add_argument(
        "--timing-file",
        type=Path,
        help="this process keeps its latest compute time per step here (every rank; the worker "
        "daemon's heartbeats carry it to the scheduler's straggler detection)",
    )
    svc.add_argument(
        "--step-delay",
        type=float,
        help="FOR TESTS: sleep this many seconds in each global step's compute, making this "
        "process a straggler on purpose (the values computed do not change)",
    )
    svc.add_argument(
        "--index-log-dir",
        type=Path,
        help="dynamic mode: append every shard this process reads (step, EST, epoch, sample "
        "indices), and its releases and covers, to a file of its own in this folder (tests "
        "count samples with it)",
    )
    mux = parser.add_argument_group(
        "multiplexing (set by a worker daemon for a background task, DeepPool's)"
    )
    mux.add_argument(
        "--background",
        action="store_true",
        default=None,
        help="run at the lowest CPU priority (SCHED_IDLE, else nice 19) with one intra-op "
        "thread, so a foreground job on the same devices keeps its speed",
    )
    mux.add_argument(
        "--pause-file",
        type=Path,
        help="wait before each global step while this file exists (the daemon pauses the "
        "task so); a stop request still ends the wait",
    )
    return parser


def given(args: argparse.Namespace) -> set[str]:
    """The flags given on the command line (their dests)."""
    return {name for name, value in vars(args).items() if value is not None}


def load_spec_file(path: Path) -> common_pb2.JobSpec:
    """A JobSpec from a JSON file (the message's JSON form), validated, defaults filled in."""
    try:
        spec = json_format.Parse(path.read_text(), common_pb2.JobSpec())
    except OSError as exc:
        raise ValidationError("--spec", f"cannot read {path}: {exc.strerror}") from None
    except json_format.ParseError as exc:
        raise ValidationError("--spec", f"{path} is not a JobSpec in JSON: {exc}") from None
    validate_job_spec(spec, "spec")
    return with_defaults(spec)


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def _spec(args: argparse.Namespace) -> tuple[common_pb2.JobSpec, int]:
    """The job's spec (--spec, then the flags given over it) and the checkpoint interval for
    a spec that says 0."""
    spec = load_spec_file(args.spec) if args.spec else common_pb2.JobSpec()
    every_default = DEFAULT_CHECKPOINT_EVERY if args.spec else 0
    missing = [f"--{n}" for n in ("job", "ests", "steps") if getattr(args, n) is None]
    if missing and not args.spec:
        raise ValidationError(missing[0], "is required (or --spec)")
    entry, data = spec.entrypoint, spec.dataset
    entry.module = _or(args.job, entry.module)
    if args.config_file is not None:
        try:
            text = args.config_file.read_text()
        except OSError as exc:
            raise ValidationError("--config-file", f"cannot read it: {exc.strerror}") from None
        entry.config_json = json.dumps(parse_config(text, "--config-file"))
    elif args.config is not None or not args.spec:
        entry.config_json = json.dumps(parse_config(_or(args.config, "{}"), "--config"))
    spec.num_ests = _or(args.ests, spec.num_ests)
    batch = spec.global_batch_size if args.spec else 8 * spec.num_ests
    spec.global_batch_size = _or(args.batch_size, batch)
    if args.steps is not None:
        spec.total_steps = args.steps
    data.seed = _or(args.seed, data.seed)
    data.shard_size = _or(args.shard_size, data.shard_size if args.spec else 32)
    data.size = _or(args.data_size, data.size)
    if data.size < 0:
        raise ValidationError("--data-size", f"must be >= 0 (got {data.size})")
    dynamic = args.data_mode == "dynamic"
    data.mode = common_pb2.DATA_MODE_DYNAMIC if dynamic else common_pb2.DATA_MODE_DETERMINISTIC
    if args.determinism is not None:
        spec.determinism = LEVELS[args.determinism]
    if args.checkpoint_every is not None:
        spec.checkpoint_every_steps = every_default = args.checkpoint_every
    spec.model_type = _or(args.model_type, spec.model_type)
    return spec, every_default


def _threads(text: str, procs: int) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValidationError("--threads", f"{text!r} is not a number or a list") from None
    if len(values) == 1:
        values *= procs
    if len(values) != procs or min(values) < 1:
        raise ValidationError(
            "--threads", f"{text!r}: give one count >= 1, or one per process ({procs})"
        )
    return values


def _placement(args: argparse.Namespace, num_ests: int) -> common_pb2.Placement:
    procs: int | None = args.world_size if args.world_size is not None else args.procs
    if args.mapping:
        counts = parse_mapping(args.mapping, num_ests, procs)
    else:
        counts = even_mapping(num_ests, 1 if procs is None else procs)
    check_procs(num_ests, len(counts))
    return common_pb2.Placement(
        processes=[
            common_pb2.ProcessAssignment(rank=rank, est_ids=ests)
            for rank, ests in enumerate(placement(counts))
        ]
    )


def _str(path: Path | None) -> str:
    return "" if path is None else str(path)


def task_from_args(args: argparse.Namespace) -> training_pb2.TrainingTask:
    """The TrainingTask the flags describe (not --task); ValidationError names a bad flag."""
    if args.checkpoint_dir is None:
        raise ValidationError("--checkpoint-dir", "is required")
    if args.local_device is not None and args.rank is None:
        raise ValidationError("--local-device", "is for one process of a job (--rank)")
    if args.code_dir is not None and not args.code_dir.is_dir():
        raise ValidationError("--code-dir", f"{args.code_dir} is not a folder")
    mode = args.data_mode or "local"
    if mode != "local" and not args.shard_manager:
        raise ValidationError("--shard-manager", f"is required by --data-mode {mode}")
    generation = args.generation or 0
    if generation < 0:
        raise ValidationError("--generation", f"must be >= 0 (got {generation})")
    spec, every_default = _spec(args)
    task = training_pb2.TrainingTask(
        spec=spec,
        plan=common_pb2.ExecutionPlan(
            gradient_checkpointing=bool(args.gradient_checkpointing),
            offload_optimizer=bool(args.offload_optimizer),
        ),
        placement=_placement(args, spec.num_ests),
        job_id=args.job_id or "",
        task_id=args.task_id or "",
        dataset_id=args.dataset_id or "",
        generation=generation,
        rendezvous_address=args.master_addr or "",
        rendezvous_group=args.rendezvous_group or "",
        process_group_timeout_seconds=_or(args.timeout, 600.0),
        checkpoint_dir=str(args.checkpoint_dir),
        resume=bool(args.resume),
        default_checkpoint_every=every_default,
        keep_checkpoints=_or(args.keep_checkpoints, RunSettings.keep_checkpoints),
        endpoints=worker_pb2.ServiceEndpoints(
            brain=args.brain or "", shard_manager=args.shard_manager if mode != "local" else ""
        ),
        accelerator_type=args.accelerator_type or "cpu",
        report_interval_seconds=_or(args.report_interval, 1.0),
        code_dir=_str(args.code_dir),
        loader_procs=args.loader_procs or 0,
        pause_file=_str(args.pause_file),
        membership_file=_str(args.membership_file),
        join_generation=args.join_generation or 0,
        device=args.device or "cpu",
        backend=args.backend or "auto",
        log_every=_or(args.log_every, 10),
        loss_log=_str(args.loss_log),
        stats_dir=_str(args.stats_dir),
        progress_file=_str(args.progress_file),
        index_log_dir=_str(args.index_log_dir),
        profile_key=args.profile_key or "",
        profile_rubick=bool(args.profile_rubick),
        step_delay_seconds=args.step_delay or 0.0,
        loader_workers=_or(args.loader_workers, RunSettings.loader_workers),
        d2_threads=_or(args.d2_threads, RunSettings.d2_threads),
        tree_shape=args.tree or RunSettings.tree_shape,
        shared_rng_stream=bool(args.no_est_rng_contexts),
    )
    if args.background:
        task.collocation.role = common_pb2.COLLOCATION_ROLE_BACKGROUND
    procs = len(task.placement.processes)
    threads = _threads(args.threads or "1", procs)
    for rank in range(procs) if args.rank is None else [args.rank]:
        process = task.processes[rank]
        process.threads = threads[rank] if 0 <= rank < procs else 1
        process.timing_file = _str(args.timing_file)
        if args.local_device is not None:
            process.local_device = args.local_device
    return task
