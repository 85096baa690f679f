"""Rubick's profiling run: a job's training step timed in a few execution plans.

`python -m gearshift.worker.profiling.rubick_run --job MODULE ...` prints the runs as JSON;
`gearshift profile --rubick JOB.yaml` runs it and stores them in the Brain; a job's rank 0
runs it before its first step when told to (`--profile-rubick`, run.py) and stores them for
its own job (StoreRubickProfile; the job's token may).

Each configuration (per-EST batch, ESTs per process, gradient checkpointing, intra-op
threads) is a short run of the real runtime loop (Trainer) on a model built afresh:
`warmup` global steps, then `steps` timed ones; the iteration time is their median. The
forward pass alone is timed at each (per-EST batch, threads) the same way: Eq. 1 needs
T_fwd.

How a configuration maps onto Rubick's RubickRun (one process, one device, as the Brain
reads runtime samples): k ESTs in the process are Rubick's GA with a = k on dp = 1 (k
mini-batches of the per-EST batch before one optimizer step), so the run's global batch is
per-EST batch x k and its per-GPU work (what T_fwd scales with) the per-EST batch; GC is
Rubick's GC; the thread count is recorded as cpus_per_gpu. Eq. 1 reads CPU cores only under
ZeRO-Offload, so it cannot price a thread count: a process with 2 threads is another
device to it, and runs are grouped (and fitted) per thread count, as the Brain fits one
model per accelerator type.

The job must not compute anything else for having been profiled: every model is built
afresh from the job's seed, and the process's random generators (torch, `random`, NumPy)
and its intra-op thread count are put back afterwards. The runs use determinism D1 with
the thread count set directly (D2's fixed ISA is an environment of the process, set before
torch loads, so it holds here too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise, product
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from gearshift.common.auth import ClientTls
from gearshift.common.errors import ValidationError
from gearshift.common.facts import EXIT_BAD_INPUT
from gearshift.v1 import brain_pb2
from gearshift.worker.training_task import parse_config

MAX_CONFIGS = 200


@dataclass(frozen=True, order=True)
class Point:
    """One configuration of the profiling run."""

    batch_per_est: int
    ests: int  # ESTs in the process: Rubick's GA steps
    gc: bool
    threads: int

    @property
    def global_batch(self) -> int:
        return self.batch_per_est * self.ests

    @property
    def label(self) -> str:
        gc = "+gc" if self.gc else ""
        return f"b{self.batch_per_est}xk{self.ests}{gc}/t{self.threads}"


CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class Timed:
    """A configuration's measured iteration (median of its timed steps), in ms, by the wall
    clock and by the process's CPU time (which other processes on the machine do not
    inflate while one thread works, but which counts every thread's time)."""

    point: Point
    iteration_ms: float
    step_ms: tuple[float, ...]
    cpu_ms: float = 0.0

    def ms(self, clock: str) -> float:
        return self.cpu_ms if clock == "cpu" else self.iteration_ms


@dataclass(frozen=True)
class RubickProfile:
    """What a profiling run measured: the model's size, forward times, timed runs."""

    params: int
    layers: int
    global_batch: int  # the job's own (the workload's b)
    forward_ms: dict[tuple[int, int], float]  # (per-EST batch, threads) -> forward ms
    runs: tuple[Timed, ...]
    forward_cpu_ms: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def thread_counts(self) -> list[int]:
        return sorted({t.point.threads for t in self.runs})

    def request(self, threads: int, clock: str = "wall") -> brain_pb2.StoreRubickProfileRequest:
        """The runs at `threads` as Rubick's workload and runs (subject left to the caller),
        timed by `clock` (wall or cpu)."""
        times = self.forward_cpu_ms if clock == "cpu" else self.forward_ms
        forward = [
            brain_pb2.RubickForward(samples_per_gpu=b, milliseconds=ms)
            for (b, t), ms in sorted(times.items())
            if t == threads
        ]
        if not forward:
            raise ValueError(f"no run at {threads} thread(s)")
        workload = brain_pb2.RubickWorkload(
            params_millions=self.params / 1e6,
            global_batch=self.global_batch,
            seq_hid_layers=0.0,
            layers=self.layers,
            forward=forward,
        )
        return brain_pb2.StoreRubickProfileRequest(
            workload=workload,
            runs=[run_message(t, clock) for t in self.runs if t.point.threads == threads],
        )


def run_message(timed: Timed, clock: str = "wall") -> brain_pb2.RubickRun:
    """A timed configuration as Rubick's run (see the module docstring for the mapping)."""
    p = timed.point
    return brain_pb2.RubickRun(
        plan=brain_pb2.RubickPlan(dp=1, tp=1, pp=1, ga=p.ests, gc=p.gc),
        resources=brain_pb2.RubickResources(placement=[1], cpus_per_gpu=p.threads),
        iteration_seconds=timed.ms(clock) / 1e3,
        global_batch=p.global_batch,
    )


def grid(
    batches: Sequence[int], ests: Sequence[int], gc: Sequence[bool], threads: Sequence[int]
) -> list[Point]:
    """Every combination, in order (threads, per-EST batch, ESTs, GC); ValidationError for a
    value < 1 or an empty dimension, naming it."""
    for name, values in (("--batches", batches), ("--ests", ests), ("--threads", threads)):
        if not values or any(v < 1 for v in values):
            raise ValidationError(name, f"want one or more values >= 1, got {list(values)}")
    if not gc:
        raise ValidationError("--gc", "want on, off or both")
    points = [
        Point(b, k, g, t)
        for t, b, k, g in product(sorted(set(threads)), sorted(set(batches)), sorted(set(ests)),
                                  sorted(set(gc)))
    ]  # fmt: skip
    if len(points) > MAX_CONFIGS:
        raise ValidationError("--batches", f"{len(points)} configurations, at most {MAX_CONFIGS}")
    return points


def default_points(
    global_batch: int, num_ests: int, *, gc: bool, threads: Sequence[int]
) -> list[Point]:
    """A job's profiling run before its first round: per-EST batches b/2, b, 2b around its
    own b = B/N, 1 and 2 ESTs per process (and its N when larger, up to 4), GC off (and on
    when asked), at each of `threads`: 6 to 18 short runs per thread count."""
    b = max(1, global_batch // max(1, num_ests))
    batches = sorted({max(1, b // 2), b, 2 * b})
    ests = sorted({1, 2, min(max(num_ests, 1), 4)})
    return grid(batches, ests, [False, True] if gc else [False], threads)


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Put back the process's random generators, intra-op thread count and deterministic
    switches (the runs apply D1's) on exit."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    py_state, np_state, threads = random.getstate(), np.random.get_state(), torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    cudnn = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    cuda = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    devices = list(range(torch.cuda.device_count())) if cuda else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_num_threads(threads)
        torch._C._set_deterministic_algorithms(deterministic)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn


def _inputs(job: Any, batch: int) -> tuple[Any, Any]:
    samples = job.collate([job.dataset[i % len(job.dataset)] for i in range(batch)])
    if not isinstance(samples, tuple | list) or len(samples) != 2:
        raise ValidationError("--job", "the dataset's samples must collate to (inputs, targets)")
    return samples[0], samples[1]


def _median_ms(times: Sequence[float]) -> float:
    return statistics.median(times) * 1e3


def measure(
    module: str,
    config: dict[str, Any],
    points: Sequence[Point],
    *,
    global_batch: int,
    seed: int = 0,
    warmup: int = 2,
    steps: int = 5,
    shard_size: int = 32,
    say: Any = None,
) -> RubickProfile:
    """Time every configuration (see the module docstring); the process is left as it was.
    ValidationError for a job that cannot be profiled."""

    from gearshift.worker.runtime import determinism, recompute  # noqa: PLC0415
    from gearshift.worker.runtime.job import load_job  # noqa: PLC0415
    from gearshift.worker.runtime.process import seed_globals  # noqa: PLC0415
    from gearshift.worker.runtime.settings import Determinism, RunSettings  # noqa: PLC0415
    from gearshift.worker.runtime.trainer import Trainer  # noqa: PLC0415

    if warmup < 0 or steps < 1:
        raise ValidationError("--steps", f"want warmup >= 0 and steps >= 1, got {warmup}, {steps}")
    if not points:
        raise ValidationError("--batches", "no configuration to profile")
    forward: dict[tuple[int, int], float] = {}
    forward_cpu: dict[tuple[int, int], float] = {}
    runs: list[Timed] = []
    params = layers = 0
    with isolated(), tempfile.TemporaryDirectory(prefix="gearshift-rubick-") as tmp:
        for point in points:
            determinism.apply(Determinism.D1, point.threads, point.threads)
            seed_globals(seed)
            job = load_job(module, config)
            params = sum(p.numel() for p in job.model.parameters() if p.requires_grad)
            layers = max(1, len(recompute.segments(job.model)))
            key = (point.batch_per_est, point.threads)
            if key not in forward:
                forward[key], forward_cpu[key] = _time_forward(
                    job, point.batch_per_est, warmup, steps
                )
            step_s: list[float] = []
            cpu_marks = [time.process_time()]

            def on_progress(
                progress: Any,
                into: list[float] = step_s,
                p: Point = point,
                marks: list[float] = cpu_marks,
            ) -> None:
                marks.append(time.process_time())
                into.append(p.global_batch / max(progress.samples_per_s, 1e-12))

            settings = RunSettings(
                num_ests=point.ests,
                global_batch_size=point.global_batch,
                total_steps=warmup + steps,
                seed=seed,
                shard_size=shard_size,
                determinism=Determinism.D1,
                log_every=1,
                keep_checkpoints=1,
                gradient_checkpointing=point.gc,
            )
            trainer = Trainer(
                job,
                settings,
                [list(range(point.ests))],
                0,
                Path(tmp) / point.label.replace("/", "-"),
                on_progress=on_progress,
            )
            cpu_marks[0] = time.process_time()
            trainer.run()
            timed = step_s[warmup:]
            cpu = [b - a for a, b in pairwise(cpu_marks)][warmup:]
            runs.append(
                Timed(point, _median_ms(timed), tuple(s * 1e3 for s in timed), _median_ms(cpu))
            )
            if say is not None:
                say(f"{point.label:18s} {runs[-1].iteration_ms:9.2f} ms/iteration")
    return RubickProfile(params, layers, global_batch, forward, tuple(runs), forward_cpu)


def _time_forward(job: Any, batch: int, warmup: int, steps: int) -> tuple[float, float]:
    """Median ms (wall, CPU) of the training-mode forward pass and loss at `batch` samples."""
    inputs, targets = _inputs(job, batch)
    job.model.train()
    times, cpu = [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = job.loss(job.model(inputs), targets)
        took, took_cpu = time.perf_counter() - t0, time.process_time() - c0
        del loss
        if i >= warmup:
            times.append(took)
            cpu.append(took_cpu)
    return _median_ms(times), _median_ms(cpu)


STORE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RubickTarget:
    """What a job's profiling run before its first step measures and where it stores it."""

    job_id: str
    brain: str
    token: str | None
    tls: ClientTls | None
    global_batch: int
    num_ests: int
    gc: bool  # profile GC on as well as off
    threads: int  # the process's intra-op threads (the runs are stored at this count)
    seed: int = 0


def profile_and_store(job_module: str, config: dict[str, Any], target: RubickTarget) -> bool:
    """Measure the job's default grid (`default_points`) at its own thread count and store
    the runs for its job; True when the Brain has them. Never raises for a job that cannot
    be profiled or a Brain that cannot be reached: training matters more."""
    import grpc  # noqa: PLC0415

    from gearshift.common.channel import connect  # noqa: PLC0415
    from gearshift.v1 import brain_pb2_grpc  # noqa: PLC0415

    began = time.perf_counter()
    try:
        points = default_points(
            target.global_batch, target.num_ests, gc=target.gc, threads=[target.threads]
        )
        profile = measure(
            job_module, config, points, global_batch=target.global_batch, seed=target.seed
        )
    except (ValidationError, RuntimeError, ValueError) as exc:
        print(f"rubick profile not measured: {exc}", flush=True)
        return False
    request = profile.request(target.threads)
    request.job_id = target.job_id
    try:
        with connect(target.brain, token=target.token, tls=target.tls) as channel:
            reply = brain_pb2_grpc.BrainStub(channel).StoreRubickProfile(
                request, timeout=STORE_TIMEOUT_S
            )
    except grpc.RpcError as exc:
        print(f"rubick profile not stored in the Brain: {exc.code()} {exc.details()}", flush=True)
        return False
    print(
        f"rubick profile of job {target.job_id}: {len(request.runs)} runs "
        f"({', '.join(t.point.label for t in profile.runs)}), {reply.runs_stored} stored, "
        f"in {time.perf_counter() - began:.1f} s",
        flush=True,
    )
    return True


def to_json(profile: RubickProfile) -> dict[str, Any]:
    """The profile as JSON data: one StoreRubickProfileRequest (no subject) per clock and
    thread count, and every timed step."""
    return {
        "params": profile.params,
        "layers": profile.layers,
        "global_batch": profile.global_batch,
        "profiles": {
            clock: {
                str(t): json_format.MessageToDict(profile.request(t, clock))
                for t in profile.thread_counts
            }
            for clock in CLOCKS
        },
        "forward_ms": [[b, t, ms] for (b, t), ms in sorted(profile.forward_ms.items())],
        "runs": [{**asdict(r.point), "iteration_ms": r.iteration_ms, "cpu_ms": r.cpu_ms,
                  "step_ms": list(r.step_ms)} for r in profile.runs],
    }  # fmt: skip


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValidationError(flag, f"{text!r} is not a comma-separated list of integers") from None


GC_CHOICES = {"off": [False], "on": [True], "both": [False, True]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gearshift.worker.profiling.rubick_run",
        description="Time a job's training step in several execution plans (Rubick's "
        "profiling run) and print the runs as JSON.",
    )
    parser.add_argument("--job", required=True, help="module defining build(config) -> Job")
    parser.add_argument("--config", default="{}", help="the job's config, a JSON object")
    parser.add_argument("--code-dir", type=Path, help="folder put first on the import path")
    parser.add_argument("--global-batch", type=int, required=True, help="the job's global batch")
    parser.add_argument("--batches", required=True, help="per-EST batch sizes, e.g. 8,16,32")
    parser.add_argument("--ests", default="1,2", help="ESTs per process, e.g. 1,2,4")
    parser.add_argument("--gc", choices=sorted(GC_CHOICES), default="both", help="GC off/on")
    parser.add_argument("--threads", default="1", help="intra-op thread counts, e.g. 1,2")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (their median)")
    parser.add_argument("--seed", type=int, default=0, help="the job's seed")
    parser.add_argument("--out", type=Path, help="write the JSON here instead of stdout")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.global_batch < 1:
            raise ValidationError("--global-batch", "must be >= 1")
        points = grid(
            _ints(args.batches, "--batches"),
            _ints(args.ests, "--ests"),
            GC_CHOICES[args.gc],
            _ints(args.threads, "--threads"),
        )
        if args.code_dir is not None:
            sys.path.insert(0, str(args.code_dir.resolve()))
        profile = measure(
            args.job,
            parse_config(args.config, "--config"),
            points,
            global_batch=args.global_batch,
            seed=args.seed,
            warmup=args.warmup,
            steps=args.steps,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ValidationError as exc:
        print(f"rubick_run: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    text = json.dumps(to_json(profile), indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
