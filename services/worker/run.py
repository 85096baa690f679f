"""`python -m gearshift.worker.run`: train a job with N ESTs on P local processes, or be one.

Local launcher (spawns P processes on this machine, rendezvous on 127.0.0.1; gloo on CPU,
on GPU see --backend):

    python -m gearshift.worker.run --job gearshift.examples.digits_cnn --ests 4 --procs 3 \\
        --mapping 2,1,1 --steps 300 --checkpoint-dir ckpt [--resume] [--determinism D1]

One process of a job (what the launcher, or a worker daemon on another machine, starts):

    python -m gearshift.worker.run --job ... --ests 4 --mapping 2,1,1 --steps 300 \\
        --checkpoint-dir ckpt --rank 1 --world-size 3 --master-addr HOST:PORT

Rank 0 prints progress (step, loss, samples/s) and at the end the SHA-256 digest of
the parameters, buffers and optimizer state. Exit status: 0 when the job reached
--steps, 75 when it stopped on request (SIGUSR1 or SIGTERM: checkpoint at the next
global-step boundary; resume later with --resume and any --procs/--mapping), 2 for
bad input, 1 for other failures.

Arguments are parsed without torch so that the determinism level can set the
environment variables torch reads when it loads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from gearshift.common.errors import ValidationError
from gearshift.common.facts import (
    CLEAN_EXITS,
    EXIT_BAD_INPUT,
    EXIT_COMPLETED,
    EXIT_FENCED,
    EXIT_OUT_OF_MEMORY,
    EXIT_STOPPED,
    OUT_OF_MEMORY,
)
from gearshift.common.ports import free_port
from gearshift.worker.command import (
    DEFAULT_CHECKPOINT_EVERY,
    load_spec_file,
    parse_config,
    spec_args,
)
from gearshift.worker.resources import pin_from_environment
from gearshift.worker.runtime.backend import BACKENDS
from gearshift.worker.runtime.determinism import environment
from gearshift.worker.runtime.priority import lower_priority
from gearshift.worker.runtime.settings import (
    Determinism,
    RunSettings,
    check_procs,
    even_mapping,
    parse_mapping,
)
from gearshift.worker.runtime.stop import EXIT_CODES, STOP_SIGNALS, StopFlag
from gearshift.worker.spawner import PARENT_VARIABLE, PRELOAD, RUN_MODULE, die_with_parent

if TYPE_CHECKING:
    from gearshift.worker.wiring import Wiring

STOP_GRACE_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gearshift.worker.run",
        description="Train a job with N ESTs on P processes, bitwise identical for any P.",
    )
    job = parser.add_argument_group("job")
    job.add_argument(
        "--spec",
        type=Path,
        help="a JobSpec as JSON: sets --job, --config, --ests, --batch-size, --steps, --seed, "
        "--shard-size, --data-size, --determinism, --checkpoint-every as the worker daemon would",
    )
    job.add_argument("--job", required=True, help="module defining build(config) -> Job")
    job.add_argument(
        "--code-dir",
        type=Path,
        help="folder put first on the import path (a user's code package, unpacked)",
    )
    job.add_argument("--config", default="{}", help="job config as a JSON object")
    job.add_argument("--config-file", type=Path, help="job config from a JSON file")
    job.add_argument("--ests", type=int, required=True, help="N, the number of ESTs")
    job.add_argument("--batch-size", type=int, help="global batch size B (default 8·N)")
    job.add_argument("--steps", type=int, required=True, help="total global steps")
    job.add_argument("--seed", type=int, default=0)
    job.add_argument("--shard-size", type=int, default=32, help="samples per data shard")
    job.add_argument("--loader-workers", type=int, default=2, help="logical loader workers per EST")
    job.add_argument(
        "--determinism", choices=[d.value for d in Determinism], default=Determinism.D1.value
    )
    job.add_argument("--d2-threads", type=int, default=1, help="intra-op threads under D2")
    job.add_argument(
        "--tree",
        choices=["balanced", "fold"],
        default="balanced",
        help="canonical summation order (fold: only to show that the order matters)",
    )
    job.add_argument(
        "--no-est-rng-contexts",
        action="store_true",
        help="share one RNG stream among a process's ESTs (breaks determinism; for tests)",
    )
    place = parser.add_argument_group("placement")
    place.add_argument("--procs", type=int, help="P, processes (default: from --mapping, else 1)")
    place.add_argument("--mapping", help="ESTs per process, e.g. 2,1,1 (default: even)")
    place.add_argument(
        "--threads",
        default="1",
        help="intra-op threads per process, one value or one per process (e.g. 2,1)",
    )
    place.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="plan: recompute activations in the backward pass (same bits as without)",
    )
    place.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="plan: on GPU keep the optimizer state in host memory and step there (no-op on CPU)",
    )
    place.add_argument("--loader-procs", type=int, default=0, help="loader processes per process")
    place.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ckpt = parser.add_argument_group("checkpoints and output")
    ckpt.add_argument("--checkpoint-dir", type=Path, required=True)
    ckpt.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    ckpt.add_argument("--checkpoint-every", type=int, default=0, help="every K steps (0: never)")
    ckpt.add_argument("--keep-checkpoints", type=int, default=2)
    ckpt.add_argument("--log-every", type=int, default=10, help="progress every K steps")
    ckpt.add_argument(
        "--loss-log", type=Path, help="append each step's EST losses and time (JSON lines)"
    )
    ckpt.add_argument("--stats-dir", type=Path, help="write rank<R>.json run statistics here")
    one = parser.add_argument_group("one process of a job (set by the launcher or a daemon)")
    one.add_argument("--rank", type=int, help="run only this process")
    one.add_argument("--world-size", type=int, help="P, with --rank")
    one.add_argument("--master-addr", default="", help="HOST:PORT where rank 0 listens")
    one.add_argument(
        "--rendezvous-group",
        default="",
        help="the placement's name at the rendezvous: processes of another placement that "
        "reach the port do not join (default: --job-id)",
    )
    one.add_argument("--timeout", type=float, default=600.0, help="process group timeout (s)")
    one.add_argument(
        "--local-device",
        type=int,
        help="with --device cuda: this process's GPU, an index among the visible ones "
        "(CUDA_VISIBLE_DEVICES); default: rank mod the number visible; needs --backend",
    )
    one.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="the process group's backend; auto: gloo on CPU, and on CUDA nccl when the "
        "processes, all on this machine with rank r on visible GPU r mod their number, each "
        "get a GPU of their own, gloo (host copies) when some share one",
    )
    svc = parser.add_argument_group(
        "services (set by a worker daemon; the token comes from GEARSHIFT_TOKEN)"
    )
    svc.add_argument("--job-id", default="", help="the job's id in the scheduler")
    svc.add_argument("--task-id", default="", help="the task this process belongs to")
    svc.add_argument(
        "--generation",
        type=int,
        default=0,
        help="the placement's generation (the scheduler's, gN in the task id), sent with every "
        "dynamic-mode shard call so a newer placement fences this one out (0: unfenced)",
    )
    svc.add_argument("--brain", default="", help="HOST:PORT: rank 0 reports runtime samples there")
    svc.add_argument("--shard-manager", default="", help="HOST:PORT of the shard manager")
    svc.add_argument("--dataset-id", default="", help="dataset id in the shard manager")
    svc.add_argument(
        "--data-mode",
        choices=["local", "deterministic", "dynamic"],
        default="local",
        help="local: shard plan computed here; deterministic: the same plan read from the shard "
        "manager (GetShardsAt); dynamic: shards pulled as they are needed (not reproducible)",
    )
    svc.add_argument(
        "--data-size", type=int, default=0, help="samples to use, 0..N-1 (0: the whole dataset)"
    )
    svc.add_argument("--accelerator-type", default="cpu", help="device type, for the Brain")
    svc.add_argument(
        "--profile-key",
        default="",
        help="rank 0 first measures the job's layer profile (DeepPool) and stores it in the "
        "Brain (--brain) under this key; a failure is logged and training goes on",
    )
    svc.add_argument(
        "--profile-rubick",
        action="store_true",
        help="rank 0 first runs Rubick's profiling run (a few steps in a few execution plans, "
        "gearshift.worker.profiling.rubick_run) and stores the runs in the Brain (--brain) "
        "for --job-id; a failure is logged and training goes on",
    )
    svc.add_argument("--model-type", default="", help="the job's model type, for the Brain")
    svc.add_argument(
        "--report-interval",
        type=float,
        default=1.0,
        help="seconds between samples sent to the Brain",
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
        default=0.0,
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


def _config(args: argparse.Namespace) -> dict[str, Any]:
    text = args.config_file.read_text() if args.config_file else args.config
    return parse_config(text, "--config-file" if args.config_file else "--config")


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


def resolve(args: argparse.Namespace) -> tuple[RunSettings, tuple[int, ...], list[int]]:
    """Settings, ESTs per process and threads per process; ValidationError names a bad flag."""
    if not args.step_delay >= 0:
        raise ValidationError("--step-delay", f"must be >= 0 seconds (got {args.step_delay})")
    procs: int | None = args.world_size if args.world_size is not None else args.procs
    if args.mapping:
        mapping = parse_mapping(args.mapping, args.ests, procs)
    else:
        mapping = even_mapping(args.ests, 1 if procs is None else procs)
    check_procs(args.ests, len(mapping))
    settings = RunSettings(
        num_ests=args.ests,
        global_batch_size=args.batch_size if args.batch_size is not None else 8 * args.ests,
        total_steps=args.steps,
        seed=args.seed,
        shard_size=args.shard_size,
        loader_workers=args.loader_workers,
        loader_procs=args.loader_procs,
        determinism=Determinism(args.determinism),
        d2_threads=args.d2_threads,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        log_every=args.log_every,
        tree_shape=args.tree,
        est_rng_contexts=not args.no_est_rng_contexts,
        gradient_checkpointing=args.gradient_checkpointing,
        offload_optimizer=args.offload_optimizer,
    )
    settings.validate()
    return settings, mapping, _threads(args.threads, len(mapping))


def launch(
    argv: Sequence[str], settings: RunSettings, mapping: tuple[int, ...], threads: list[int]
) -> int:
    """Start the P processes of the job here and wait for them; signals are passed on.

    They are forked by a fork server that imported torch and the runtime once (PRELOAD),
    not each started from a fresh interpreter: every fresh one spent about 5 s of CPU on
    imports. The server starts with the determinism level's variables set, so torch
    reads them when it loads, as a fresh process would."""
    procs = len(mapping)
    address = f"127.0.0.1:{free_port()}"
    os.environ.update(environment(settings.determinism))
    context = multiprocessing.get_context("forkserver")
    # Not this module: each child runs it again as its main module (multiprocessing's
    # rule for a parent started with -m), which finding it imported warns about.
    context.set_forkserver_preload([name for name in PRELOAD if name != RUN_MODULE[1]])
    children: dict[int, multiprocessing.process.BaseProcess] = {}

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children.values():
            if child.exitcode is None and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    for sig in (*STOP_SIGNALS, signal.SIGINT):
        signal.signal(sig, forward)
    # Children (and the fork server, started by the first) start with stop signals blocked
    # and unblock them once they can handle them.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for rank in range(procs):
            rank_argv = [*argv, "--mapping", ",".join(map(str, mapping))]
            rank_argv += ["--threads", str(threads[rank]), "--rank", str(rank)]
            rank_argv += ["--world-size", str(procs), "--master-addr", address]
            child = context.Process(target=_be_rank, args=(rank_argv,), name=f"rank-{rank}")
            child.start()
            children[rank] = child
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    codes: dict[int, int] = {}
    while len(codes) < procs:
        running = {child.sentinel: rank for rank, child in children.items() if rank not in codes}
        for sentinel in multiprocessing.connection.wait(list(running)):
            done = running[cast(int, sentinel)]
            children[done].join()
            code = children[done].exitcode
            codes[done] = code = 1 if code is None else code
            if code not in CLEAN_EXITS:
                print(
                    f"rank {done} failed with exit status {code}; stopping the others",
                    file=sys.stderr,
                )
                _stop_rest(children, codes)
    failed = [code for code in codes.values() if code not in CLEAN_EXITS]
    if failed:
        return failed[0] if failed[0] > 0 else 1
    return EXIT_STOPPED if EXIT_STOPPED in codes.values() else EXIT_COMPLETED


def _be_rank(argv: list[str]) -> None:
    """In a forked child: be one rank, as `python -m gearshift.worker.run ARGV` would."""
    os.environ.pop(PARENT_VARIABLE, None)  # its parent is the fork server, not a daemon
    sys.argv = ["gearshift.worker.run", *argv]
    sys.exit(main(argv))


def _stop_rest(
    children: dict[int, multiprocessing.process.BaseProcess], codes: dict[int, int]
) -> None:
    """Terminate the processes still running (peers blocked on a dead one), then kill."""
    rest = {rank: child for rank, child in children.items() if rank not in codes}
    for child in rest.values():
        child.terminate()
    for rank, child in rest.items():
        child.join(STOP_GRACE_S)
        if child.exitcode is None:
            child.kill()
            child.join()
        codes[rank] = child.exitcode if child.exitcode is not None else 1


def run_one(
    args: argparse.Namespace,
    config: dict[str, Any],
    settings: RunSettings,
    mapping: tuple[int, ...],
    threads: int,
) -> int:
    """Be rank `args.rank` of the job."""
    if args.background:  # first: the threads started from here on inherit the priority
        threads = 1
        print(f"background task: {lower_priority()}, 1 intra-op thread", flush=True)
    stop = StopFlag()
    stop.install()
    for name, value in environment(settings.determinism).items():
        if settings.determinism is Determinism.D2:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)
    # torch loads from here on.
    from gearshift.worker.runtime.control import Progress  # noqa: PLC0415
    from gearshift.worker.runtime.process import ProcessSpec, run_process  # noqa: PLC0415
    from gearshift.worker.wiring import Wiring  # noqa: PLC0415

    rank = args.rank
    wiring = Wiring.from_args(args, settings, mapping)
    if rank == 0 and args.profile_key and args.brain:
        _profile_first(args, config, settings, wiring)
    if rank == 0 and args.profile_rubick and args.brain and args.job_id:
        if args.device == "cpu":
            _profile_rubick(args, config, settings, threads, wiring)
        else:
            print("rubick profiling run skipped: it times CPU processes only", flush=True)

    def report(progress: Progress) -> None:
        wiring.timing(progress.step, progress.compute_s, mapping[rank])
        if rank == 0:
            print(
                f"step {progress.step}/{progress.total_steps} loss {progress.loss:.6f} "
                f"samples/s {progress.samples_per_s:.1f}",
                flush=True,
            )
            wiring.progress(
                progress.step, progress.total_steps, progress.loss, progress.samples_per_s
            )

    spec = ProcessSpec(
        job_module=args.job,
        job_config=config,
        settings=settings,
        mapping=mapping,
        rank=rank,
        checkpoint_dir=args.checkpoint_dir,
        master_addr=args.master_addr,
        resume=args.resume,
        threads=threads,
        device=args.device,
        local_device=args.local_device,
        backend=args.backend,
        loss_log=args.loss_log,
        timeout_s=args.timeout,
        group=args.rendezvous_group or args.job_id or "gearshift",
        pause_file=args.pause_file,
        background=args.background,
        step_delay=args.step_delay,
    )
    from gearshift.worker.datasource import StalePlacementError  # noqa: PLC0415

    try:
        result = run_process(spec, stop=stop, on_progress=report, source=wiring.source())
    except StalePlacementError as exc:
        # Another placement of the job runs: no retry, no checkpoint, a failure code.
        print(f"rank {rank}: {exc}", file=sys.stderr, flush=True)
        return EXIT_FENCED
    finally:
        wiring.close()
    if args.stats_dir is not None:
        args.stats_dir.mkdir(parents=True, exist_ok=True)
        stats = {
            "rank": rank,
            "outcome": str(result.outcome),
            "step": result.step,
            "steps_run": result.steps_run,
            "wall_s": result.wall_s,
            "paused_s": result.paused_s,
            "bytes_sent": result.bytes_sent,
            "grad_bytes": result.grad_bytes,
            "peak_rss_bytes": result.peak_rss_bytes,
            "digest": result.digest,
            "device": result.device,
            "backend": result.backend,
        }
        (args.stats_dir / f"rank{rank}.json").write_text(json.dumps(stats, indent=1))
    if rank == 0:
        print(f"outcome {result.outcome} at step {result.step}", flush=True)
        print(f"digest sha256:{result.digest}", flush=True)
    return EXIT_CODES[result.outcome]


def _profile_first(
    args: argparse.Namespace, config: dict[str, Any], settings: RunSettings, wiring: Wiring
) -> None:
    """Rank 0 measures the job's layer profile before its first step (the other ranks wait at
    their first exchange) at per-device batches B/g, g = 1, 2, 4, ... up to its ESTs."""
    from gearshift.worker.profiling.first_round import (  # noqa: PLC0415
        FirstProfile,
        profile_and_store,
    )

    batch, most = settings.global_batch_size, 1
    while most * 2 <= settings.num_ests and batch % (most * 2) == 0:
        most *= 2
    target = FirstProfile(
        key=args.profile_key,
        job_id=args.job_id,
        model_type=args.model_type,
        brain=args.brain,
        token=wiring.token,
        tls=wiring.tls,
        global_batch=batch,
        max_devices=most,
        device_kind=args.device,
    )
    profile_and_store(args.job, config, target)


def _profile_rubick(
    args: argparse.Namespace,
    config: dict[str, Any],
    settings: RunSettings,
    threads: int,
    wiring: Wiring,
) -> None:
    """Rank 0 runs Rubick's profiling run before its first step (the other ranks wait at
    their first exchange) and stores the runs for its job."""
    from gearshift.worker.profiling.rubick_run import (  # noqa: PLC0415
        RubickTarget,
        profile_and_store,
    )

    d2 = settings.determinism is Determinism.D2
    target = RubickTarget(
        job_id=args.job_id,
        brain=args.brain,
        token=wiring.token,
        tls=wiring.tls,
        global_batch=settings.global_batch_size,
        num_ests=settings.num_ests,
        gc=True,  # a profiling run: GC on and off whatever the job's plan allows
        threads=settings.d2_threads if d2 else threads,
        seed=settings.seed,
    )
    profile_and_store(args.job, config, target)


def expand_spec(argv: list[str]) -> list[str]:
    """Replace `--spec FILE` by the flags the JobSpec determines (the worker daemon's own
    mapping); flags given explicitly after it still win."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--spec", type=Path)
    known, rest = pre.parse_known_args(argv)
    if known.spec is None:
        return argv
    return [*spec_args(load_spec_file(known.spec), DEFAULT_CHECKPOINT_EVERY), *rest]


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent()  # started by a worker daemon: do not outlive it
    pinned = pin_from_environment()  # before any thread starts: they inherit the cores
    if pinned:
        print(pinned, file=sys.stderr, flush=True)
    try:
        return _main(argv)
    except MemoryError:  # the memory is freed by now: say so, with a code the worker reads
        traceback.print_exc()
        print(f"{OUT_OF_MEMORY}: MemoryError", file=sys.stderr, flush=True)
        return EXIT_OUT_OF_MEMORY


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = expand_spec(argv)
    except ValidationError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args = build_parser().parse_args(argv)
    try:
        if args.code_dir is not None:
            if not args.code_dir.is_dir():
                raise ValidationError("--code-dir", f"{args.code_dir} is not a folder")
            sys.path.insert(0, str(args.code_dir.resolve()))
        settings, mapping, threads = resolve(args)
        config = _config(args)
        if args.rank is None:
            if args.local_device is not None:
                raise ValidationError("--local-device", "is for one process of a job (--rank)")
            return launch(argv, settings, mapping, threads)
        if not 0 <= args.rank < len(mapping):
            raise ValidationError("--rank", f"must be between 0 and {len(mapping) - 1}")
        return run_one(args, config, settings, mapping, threads[args.rank])
    except ValidationError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
