"""`python -m gearshift.worker.run`: train a job with N ESTs on P local processes, or be one.

Local launcher (spawns P processes on this machine, rendezvous on 127.0.0.1; gloo on CPU,
on GPU see --backend):

    python -m gearshift.worker.run --job gearshift.examples.digits_cnn --ests 4 --procs 3 \\
        --mapping 2,1,1 --steps 300 --checkpoint-dir ckpt [--resume] [--determinism D1]

One process of a job, as a worker daemon starts it (the file: a TrainingTask, see
command.py), or by hand with the flags:

    python -m gearshift.worker.run --task TASK_DIR/task.binpb --rank 1
    python -m gearshift.worker.run --job ... --ests 4 --mapping 2,1,1 --steps 300 \\
        --checkpoint-dir ckpt --rank 1 --world-size 3 --master-addr HOST:PORT

The flags (run_flags.py) build the TrainingTask a daemon would write, and every process
takes its settings from that message alone (training_task.resolve): one path for both.

Rank 0 prints progress (step, loss, samples/s) and at the end the SHA-256 digest of
the parameters, buffers and optimizer state. Exit status: 0 when the job reached
--steps, 75 when it stopped on request (SIGUSR1 or SIGTERM: checkpoint at the next
global-step boundary; resume later with --resume and any --procs/--mapping), 2 for
bad input, 1 for other failures.

Arguments are read without torch so that the determinism level can set the
environment variables torch reads when it loads.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, cast

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
from gearshift.v1 import training_pb2
from gearshift.worker.resources import pin_from_environment
from gearshift.worker.run_flags import build_parser, given, task_from_args
from gearshift.worker.runtime.determinism import environment
from gearshift.worker.runtime.priority import lower_priority
from gearshift.worker.runtime.settings import Determinism
from gearshift.worker.runtime.stop import EXIT_CODES, STOP_SIGNALS, Outcome, StopFlag
from gearshift.worker.spawner import PARENT_VARIABLE, PRELOAD, RUN_MODULE, die_with_parent
from gearshift.worker.training_task import ProcessSettings, read_task, resolve

if TYPE_CHECKING:
    from gearshift.worker.wiring import Wiring

STOP_GRACE_S = 30.0


def launch(task: training_pb2.TrainingTask, determinism: Determinism) -> int:
    """Start the P processes of the job here and wait for them; signals are passed on.

    They are forked by a fork server that imported torch and the runtime once (PRELOAD),
    not each started from a fresh interpreter: every fresh one spent about 5 s of CPU on
    imports. The server starts with the determinism level's variables set, so torch
    reads them when it loads, as a fresh process would."""
    procs = len(task.placement.processes)
    task.rendezvous_address = f"127.0.0.1:{free_port()}"
    data = task.SerializeToString()
    os.environ.update(environment(determinism))
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
            child = context.Process(target=_be_rank, args=(data, rank), name=f"rank-{rank}")
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


def _be_rank(data: bytes, rank: int) -> None:
    """In a forked child: be rank `rank` of the serialized TrainingTask `data`."""
    os.environ.pop(PARENT_VARIABLE, None)  # its parent is the fork server, not a daemon
    sys.argv = ["gearshift.worker.run", "--rank", str(rank)]
    task = training_pb2.TrainingTask.FromString(data)
    sys.exit(_guarded(lambda: _be(task, rank)))


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


def run_one(p: ProcessSettings) -> int:
    """Be rank `p.rank` of the job."""
    threads = p.threads
    if p.background:  # first: the threads started from here on inherit the priority
        print(f"background task: {lower_priority()}, 1 intra-op thread", flush=True)
    stop = StopFlag()
    stop.install()
    for name, value in environment(p.run.determinism).items():
        if p.run.determinism is Determinism.D2:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)
    # torch loads from here on.
    from gearshift.worker.runtime.control import Progress  # noqa: PLC0415
    from gearshift.worker.runtime.process import ProcessSpec, run_process  # noqa: PLC0415
    from gearshift.worker.wiring import Wiring  # noqa: PLC0415

    rank, s = p.rank, p.services
    wiring = Wiring.connect(p)
    if s.profile_key:
        _profile_first(p, wiring)
    if s.profile_rubick:
        if p.device == "cpu":
            _profile_rubick(p, wiring)
        else:
            print("rubick profiling run skipped: it times CPU processes only", flush=True)

    def report(progress: Progress) -> None:
        wiring.timing(progress.step, progress.compute_s, progress.ests_held)
        if progress.rank == 0:
            print(
                f"step {progress.step}/{progress.total_steps} loss {progress.loss:.6f} "
                f"samples/s {progress.samples_per_s:.1f}",
                flush=True,
            )
            wiring.progress(
                progress.step,
                progress.total_steps,
                progress.loss,
                progress.samples_per_s,
                first_step_at=progress.first_step_at,
                paused_from=progress.paused_from,
            )

    spec = ProcessSpec(
        job_module=p.job_module,
        job_config=p.config,
        settings=p.run,
        mapping=p.mapping,
        rank=rank,
        checkpoint_dir=p.checkpoint_dir,
        master_addr=p.master_addr,
        resume=p.resume,
        threads=threads,
        device=p.device,
        local_device=p.local_device,
        backend=p.backend,
        loss_log=p.loss_log,
        timeout_s=p.timeout_s,
        group=p.group,
        pause_file=p.pause_file,
        background=p.background,
        membership_file=p.membership_file,
        join_generation=p.join_generation,
        step_delay=p.step_delay,
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
    if result.outcome is Outcome.LEFT:  # its ESTs train on in the job's other processes
        print(f"outcome {result.outcome} at step {result.step}", flush=True)
        return EXIT_CODES[result.outcome]
    rank = result.rank  # where it ended (membership changes move it)
    if p.stats_dir is not None:
        p.stats_dir.mkdir(parents=True, exist_ok=True)
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
        (p.stats_dir / f"rank{rank}.json").write_text(json.dumps(stats, indent=1))
    if rank == 0:
        print(f"outcome {result.outcome} at step {result.step}", flush=True)
        print(f"digest sha256:{result.digest}", flush=True)
    return EXIT_CODES[result.outcome]


def _profile_first(p: ProcessSettings, wiring: Wiring) -> None:
    """Rank 0 measures the job's layer profile before its first step (the other ranks wait at
    their first exchange) at per-device batches B/g, g = 1, 2, 4, ... up to its ESTs."""
    from gearshift.worker.profiling.first_round import (  # noqa: PLC0415
        FirstProfile,
        profile_and_store,
    )

    batch, most = p.run.global_batch_size, 1
    while most * 2 <= p.run.num_ests and batch % (most * 2) == 0:
        most *= 2
    target = FirstProfile(
        key=p.services.profile_key,
        job_id=p.services.job_id,
        model_type=p.services.model_type,
        brain=p.services.brain,
        token=wiring.token,
        tls=wiring.tls,
        global_batch=batch,
        max_devices=most,
        device_kind=p.device,
    )
    profile_and_store(p.job_module, p.config, target)


def _profile_rubick(p: ProcessSettings, wiring: Wiring) -> None:
    """Rank 0 runs Rubick's profiling run before its first step (the other ranks wait at
    their first exchange) and stores the runs for its job."""
    from gearshift.worker.profiling.rubick_run import (  # noqa: PLC0415
        RubickTarget,
        profile_and_store,
    )

    d2 = p.run.determinism is Determinism.D2
    target = RubickTarget(
        job_id=p.services.job_id,
        brain=p.services.brain,
        token=wiring.token,
        tls=wiring.tls,
        global_batch=p.run.global_batch_size,
        num_ests=p.run.num_ests,
        gc=True,  # a profiling run: GC on and off whatever the job's plan allows
        threads=p.run.d2_threads if d2 else p.threads,
        seed=p.run.seed,
    )
    profile_and_store(p.job_module, p.config, target)


def read_command_line(argv: Sequence[str]) -> tuple[training_pb2.TrainingTask, int | None]:
    """The TrainingTask (a daemon's --task file, else the one the flags describe) and the
    rank to be (None: launch them all here); ValidationError names a bad flag."""
    args = build_parser().parse_args(argv)
    if args.task is None:
        return task_from_args(args), args.rank
    extra = sorted(given(args) - {"task", "rank"})
    if extra:
        raise ValidationError("--task", f"takes --rank only, not --{extra[0].replace('_', '-')}")
    if args.rank is None:
        raise ValidationError("--rank", "is required with --task")
    return read_task(args.task), args.rank


def main(argv: Sequence[str] | None = None) -> int:
    return _guarded(lambda: _main(sys.argv[1:] if argv is None else argv))


def _guarded(body: Callable[[], int]) -> int:
    """Run `body` as a training process: tied to its daemon, on its cores, its memory
    errors reported with the code the worker reads."""
    die_with_parent()  # started by a worker daemon: do not outlive it
    pinned = pin_from_environment()  # before any thread starts: they inherit the cores
    if pinned:
        print(pinned, file=sys.stderr, flush=True)
    try:
        return body()
    except MemoryError:  # the memory is freed by now: say so, with a code the worker reads
        traceback.print_exc()
        print(f"{OUT_OF_MEMORY}: MemoryError", file=sys.stderr, flush=True)
        return EXIT_OUT_OF_MEMORY


def _main(argv: Sequence[str]) -> int:
    try:
        task, rank = read_command_line(argv)
        if rank is None:  # every rank checked before anything starts
            ranks = [resolve(task, r) for r in sorted(task.processes)]
            return launch(task, ranks[0].run.determinism)
    except ValidationError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _be(task, rank)


def _be(task: training_pb2.TrainingTask, rank: int) -> int:
    """Be rank `rank` of `task`, with the settings it resolves to."""
    try:
        settings = resolve(task, rank)
        if settings.code_dir is not None:
            sys.path.insert(0, str(settings.code_dir.resolve()))
        return run_one(settings)
    except ValidationError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
