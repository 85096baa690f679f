"""What ESTs cost, each figure measured side by side in one run (CPU; the machine may be shared).

1. 1 EST in a process (context switches, gradient bookkeeping) vs a plain PyTorch loop on
   the same batches: time per step ratio (target <= 1.02).
2. 8 ESTs in one process vs gradient accumulation over 8 micro-batches in a plain loop:
   throughput ratio (target >= 0.95), for three jobs: the MLP (the worst case: the fewest
   FLOPs per gradient byte, so summing gradients in the canonical tree weighs most), the
   digits CNN and the transformer language model.
3. Peak memory (RSS) of 8 ESTs in one process vs the sum over 8 plain processes
   (target <= 0.25).
4. Bytes each process sends per step vs the gradient's size, for several placements
   (target <= 2.5).

Timed parts run under D1's switches (deterministic algorithms, no autotuning) with one
intra-op thread; the runtime's and the plain loop's steps alternate one by one in one
process, and the figure is the median of the per-step ratios. On CPU a step's time is this
process's CPU time (the machine may be shared); with `--device cuda` it is wall time up to
the end of the step's kernels, and the jobs are sized for a GPU: figure 1 trains the
ResNet-18 layout of `gearshift.examples.resnet` (128 images per step), figure 2 adds it
to the three jobs, and figure 3 measures GPU memory (what the device reports in use, CUDA
contexts included, taken once every process has trained; and the caching allocator's
peak) of 1, 2, 4, 8, 16 ESTs of that ResNet in one process vs as many plain processes
sharing the GPU (EasyScale: flat at ~4.9 GB vs 32.5 GB for packed workers). Figure 4
stays on CPU (gloo).

    .venv/bin/python bench/est_overhead.py [--steps 120] [--only 1 --only 2 ...] \
        [--device cuda] [--memory-counts 1,2,4,8,16] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MLP = "gearshift.examples.mlp"
# Wide enough that a step is compute, as on a GPU job; dropout and input noise kept.
BIG = {"features": 512, "hidden": 1024, "layers": 3, "classes": 16, "samples": 8192}


@dataclass(frozen=True)
class Workload:
    """A job for figure 2: 8 ESTs of `per_est` samples; `steps_share` of the timed steps
    (a slow job's per-step ratios vary less)."""

    name: str
    module: str
    config: dict[str, Any]
    per_est: int
    steps_share: float = 1.0


RESNET18 = Workload(
    "ResNet-18",
    "gearshift.examples.resnet",
    {"width": 64, "blocks": [2, 2, 2, 2], "image": 32, "samples": 8192},
    128,
    steps_share=0.5,
)
MLP_MEMORY = Workload("MLP", MLP, BIG, 32)  # figure 3 on CPU: 8 x 32 samples
MEMORY_WORKLOADS = {"mlp": MLP_MEMORY, "resnet18": RESNET18}
EIGHT_EST_WORKLOADS = [
    Workload("MLP", MLP, BIG, 32),
    Workload("MLP", MLP, BIG, 64),
    Workload("digits CNN", "gearshift.examples.digits_cnn", {"channels": 32}, 32),
    Workload(
        "transformer LM",
        "gearshift.examples.tiny_lm",
        {"vocab": 256, "seq_len": 64, "d_model": 256, "heads": 4, "text_len": 200000},
        8,
        steps_share=0.25,
    ),
]


def step_clock(device: str) -> Callable[[], float]:
    """CPU: this process's CPU time (with one intra-op thread every computation of a step
    runs here, so the figure does not move with other programs' load the way wall time
    does). GPU: wall time once the kernels queued so far have finished."""
    if device == "cpu":
        return time.process_time
    import torch

    def gpu_clock() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()

    return gpu_clock


class PlainLoop:
    """A plain PyTorch loop over the same dataset: `micro` accumulated micro-batches of
    `job.per_est` samples per step."""

    def __init__(self, job: Workload, micro: int, device: str) -> None:
        import torch

        from gearshift.worker.runtime.data import DataPosition, EstStream, LocalShards
        from gearshift.worker.runtime.job import load_job
        from gearshift.worker.runtime.process import seed_globals

        seed_globals(0)
        self.job = load_job(job.module, job.config)
        self.device = torch.device(device)
        self.job.model.to(self.device)
        self.stream = EstStream(LocalShards(len(self.job.dataset), 32, 0, 1), 0, DataPosition())
        self.micro = micro
        self.per_micro = job.per_est
        self.job.model.train()

    def step(self) -> None:
        from gearshift.worker.runtime.trainer import to_device

        job = self.job
        for _ in range(self.micro):
            indices = self.stream.take(self.per_micro)
            batch = job.collate([job.dataset[i] for i in indices])
            inputs, targets = to_device(batch, self.device)
            loss = job.loss(job.model(inputs), targets)
            (loss / self.micro if self.micro > 1 else loss).backward()  # type: ignore[no-untyped-call]
            loss.item()
        job.optimizer.step()
        if job.lr_scheduler is not None:
            job.lr_scheduler.step()
        job.optimizer.zero_grad(set_to_none=True)


def runtime(
    job: Workload,
    ests: int,
    steps: int,
    workdir: Path,
    device: str,
    *,
    on_progress: Callable[[Any], None] | None = None,
) -> Any:
    """A Trainer of `ests` ESTs in this process (after the global generators are seeded
    from the job seed, as a training process does), reporting every step."""
    import torch

    from gearshift.worker.runtime.job import load_job
    from gearshift.worker.runtime.process import seed_globals
    from gearshift.worker.runtime.settings import RunSettings
    from gearshift.worker.runtime.trainer import Trainer

    settings = RunSettings(
        num_ests=ests, global_batch_size=ests * job.per_est, total_steps=steps, log_every=1
    )
    seed_globals(settings.seed)
    return Trainer(
        load_job(job.module, job.config),
        settings,
        [list(range(ests))],
        0,
        workdir,
        device=torch.device(device),
        on_progress=on_progress,
    )


def interleaved(
    job: Workload, ests: int, steps: int, workdir: Path, device: str
) -> tuple[float, float, float]:
    """Runtime steps and plain-loop steps alternating one by one in this process.

    The plain step runs inside the runtime's progress callback (between two global
    steps, outside every EST context), so both see the same machine load. Returns
    (median runtime/plain time ratio, median runtime s/step, median plain s/step).
    """
    from gearshift.worker.runtime.control import Progress

    warm = 3
    plain = PlainLoop(job, ests, device)
    clock = step_clock(device)
    ours: list[float] = []
    theirs: list[float] = []
    last_exit = [0.0]

    def progress(p: Progress) -> None:
        entry = clock()
        if p.step > warm:
            ours.append(entry - last_exit[0])
        plain.step()
        done = clock()
        if p.step > warm:
            theirs.append(done - entry)
        last_exit[0] = done

    runtime(job, ests, steps + warm, workdir, device, on_progress=progress).run()
    ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
    return ratio, statistics.median(ours), statistics.median(theirs)


def overhead_one_est(steps: int, workdir: Path, device: str) -> dict[str, Any]:
    one = RESNET18 if device == "cuda" else Workload("MLP", MLP, BIG, 256)
    ratio, ours, plain = interleaved(one, 1, steps, workdir / "one", device)
    return {
        "job": one.name,
        "per_est": one.per_est,
        "runtime_s_per_step": ours,
        "plain_s_per_step": plain,
        "slowdown": ratio,
    }


def eight_est_workloads(device: str) -> list[Workload]:
    return [*EIGHT_EST_WORKLOADS, RESNET18] if device == "cuda" else EIGHT_EST_WORKLOADS


def eight_ests_vs_accumulation(
    job: Workload, steps: int, workdir: Path, device: str
) -> dict[str, Any]:
    timed = max(10, round(steps * job.steps_share))
    out = workdir / f"eight-{job.module}-{job.per_est}"
    ratio, ours, plain = interleaved(job, 8, timed, out, device)
    return {
        "job": job.name,
        "per_est": job.per_est,
        "runtime_s_per_step": ours,
        "accumulation_s_per_step": plain,
        "throughput": 1 / ratio,
    }


def _child(args: argparse.Namespace) -> None:
    """Run one side of the memory comparison in this process and print its peaks; on a GPU,
    wait for stdin to close before exiting, so that the parent reads the device's memory
    while every process still holds what it allocated."""
    import torch

    torch.set_num_threads(1)
    job = MEMORY_WORKLOADS[args.workload]
    if args.child == "ests":
        runtime(job, args.count, args.steps, args.workdir, args.device).run()
    else:
        plain = PlainLoop(job, 1, args.device)
        for _ in range(args.steps):
            plain.step()
    peaks = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if args.device == "cuda":
        torch.cuda.synchronize()
        peaks["gpu_allocated"] = torch.cuda.max_memory_allocated()
        peaks["gpu_reserved"] = torch.cuda.max_memory_reserved()
    print(json.dumps(peaks), flush=True)
    if args.device == "cuda":
        sys.stdin.read()


def _run_children(
    mode: str, procs: int, ests: int, *, job: str, steps: int, workdir: Path, device: str
) -> tuple[list[dict[str, int]], int]:
    """`procs` children of `mode`, each with `ests` ESTs (ests mode): their peaks, and on a
    GPU the device memory in use once all of them have trained, less what was in use before."""
    used_before = _gpu_used() if device == "cuda" else 0
    dirs = [str(workdir / f"{mode}-{ests}-{i}") for i in range(procs)]
    cmd = [sys.executable, __file__, "--child", mode, "--count", str(ests), "--workload", job]
    cmd += ["--steps", str(steps), "--device", device]
    children = [
        subprocess.Popen(
            [*cmd, "--workdir", w],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in dirs
    ]
    peaks: list[dict[str, int]] = []
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"memory child {mode} failed ({child.wait(timeout=60)})")
            peaks.append(json.loads(line))
        used = _gpu_used() - used_before if device == "cuda" else 0
    finally:
        for child in children:
            child.communicate(timeout=1200)
    if any(child.returncode for child in children):
        raise RuntimeError(f"memory child {mode} failed: {[c.returncode for c in children]}")
    return peaks, used


def _gpu_used() -> int:
    import torch

    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def memory(counts: list[int], steps: int, workdir: Path, device: str) -> list[dict[str, Any]]:
    """Per count k: k ESTs in one process vs k plain processes (one micro-batch each)."""
    job = "resnet18" if device == "cuda" else "mlp"
    rows = []
    side = functools.partial(_run_children, job=job, steps=steps, workdir=workdir, device=device)
    for k in counts:
        (ests,), ests_used = side("ests", 1, k)
        plain, plain_used = side("plain", k, 1)
        row: dict[str, Any] = {
            "count": k,
            "job": MEMORY_WORKLOADS[job].name,
            "per_est": MEMORY_WORKLOADS[job].per_est,
            "ests_peak_rss_mib": ests["peak_rss"] / 2**20,
            "plain_peak_rss_mib": sum(p["peak_rss"] for p in plain) / 2**20,
        }
        row["ratio"] = row["ests_peak_rss_mib"] / row["plain_peak_rss_mib"]
        if device == "cuda":
            row |= {
                "ests_gpu_used_gib": ests_used / 2**30,
                "plain_gpu_used_gib": plain_used / 2**30,
                "ests_gpu_allocated_gib": ests["gpu_allocated"] / 2**30,
                "plain_gpu_allocated_gib": sum(p["gpu_allocated"] for p in plain) / 2**30,
            }
            row["gpu_ratio"] = ests_used / plain_used
        rows.append(row)
    return rows


def bytes_sent(workdir: Path) -> list[dict[str, Any]]:
    """Launch real multi-process runs (gloo) and read what each rank passed to the backend."""
    config = json.dumps({"features": 64, "hidden": 256, "layers": 2})
    rows = []
    for ests, mapping in ((4, "1,1,1,1"), (4, "2,2"), (4, "2,1,1"), (8, "3,3,2"), (8, "2,2,2,2")):
        out = workdir / f"bytes-{ests}-{mapping}"
        cmd = [sys.executable, "-m", "gearshift.worker.run", "--job", MLP, "--config", config]
        cmd += ["--ests", str(ests), "--mapping", mapping, "--steps", "20", "--log-every", "100"]
        cmd += ["--checkpoint-dir", str(out / "ckpt"), "--stats-dir", str(out / "stats")]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=1200)
        ratios = []
        for path in sorted((out / "stats").glob("rank*.json")):
            stats = json.loads(path.read_text())
            ratios.append(stats["bytes_sent"] / stats["steps_run"] / stats["grad_bytes"])
        rows.append({"ests": ests, "mapping": mapping, "max_ratio": max(ratios)})
    return rows


def counts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of counts (1,2,4)") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 120: on a shared 2-core machine 60 alternating steps left the 1-EST median +-2%.
    parser.add_argument("--steps", type=int, default=120, help="timed steps per figure")
    parser.add_argument("--only", type=int, choices=[1, 2, 3, 4], action="append")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where figures 1-3 run"
    )
    parser.add_argument(
        "--memory-counts",
        type=counts,
        help="figure 3's EST/process counts (default: 8 on cpu, 1,2,4,8,16 on cuda)",
    )
    parser.add_argument("--memory-steps", type=int, default=8, help="figure 3's steps on cuda")
    parser.add_argument("--json", type=Path, help="also write every figure here as JSON")
    child = parser.add_argument_group("one side of figure 3 (internal)")
    child.add_argument("--child", choices=["ests", "plain"])
    child.add_argument("--count", type=int, default=8, help="ESTs of the child")
    child.add_argument("--workload", choices=sorted(MEMORY_WORKLOADS), default="mlp")
    child.add_argument("--workdir", type=Path)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.child:
        _child(args)
        return 0
    import torch

    from gearshift.worker.runtime.determinism import apply
    from gearshift.worker.runtime.settings import Determinism

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is visible")
    apply(Determinism.D1, threads=1, d2_threads=1)
    parts = set(args.only or [1, 2, 3, 4])
    results: dict[str, Any] = {"device": args.device, "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if 1 in parts:
            results["one_est"] = overhead_one_est(args.steps, workdir, args.device)
            _report_one(results["one_est"], args.device)
        if 2 in parts:
            results["eight_ests"] = []
            for job in eight_est_workloads(args.device):
                eight = eight_ests_vs_accumulation(job, args.steps, workdir, args.device)
                results["eight_ests"].append(eight)
                _report_eight(eight, args.device)
        if 3 in parts:
            cuda = args.device == "cuda"
            memory_counts = args.memory_counts or ([1, 2, 4, 8, 16] if cuda else [8])
            steps = args.memory_steps if cuda else args.steps
            results["memory"] = memory(memory_counts, steps, workdir, args.device)
            for row in results["memory"]:
                _report_memory(row)
        if 4 in parts:
            results["bytes"] = bytes_sent(workdir)
            _report_bytes(results["bytes"])
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _report_one(one: dict[str, Any], device: str) -> None:
    print(
        f"1. 1 EST vs plain loop ({device}), {one['job']}, {one['per_est']} samples: "
        f"{one['runtime_s_per_step'] * 1e3:.2f} vs {one['plain_s_per_step'] * 1e3:.2f} ms/step "
        f"-> {one['slowdown']:.4f}x time (target <= 1.02)",
        flush=True,
    )


def _report_eight(eight: dict[str, Any], device: str) -> None:
    print(
        f"2. 8 ESTs vs 8-micro-batch accumulation ({device}), {eight['job']}, "
        f"{eight['per_est']} samples per EST: "
        f"{eight['runtime_s_per_step'] * 1e3:.2f} vs "
        f"{eight['accumulation_s_per_step'] * 1e3:.2f} ms/step -> "
        f"{eight['throughput']:.4f}x throughput (target >= 0.95)",
        flush=True,
    )


def _report_memory(row: dict[str, Any]) -> None:
    k = row["count"]
    line = (
        f"3. peak RSS, {k} ESTs in 1 process vs {k} plain processes ({row['job']}): "
        f"{row['ests_peak_rss_mib']:.0f} vs {row['plain_peak_rss_mib']:.0f} MiB -> "
        f"{row['ratio']:.3f}x"
    )
    if "gpu_ratio" in row:
        line += (
            f"; GPU memory in use {row['ests_gpu_used_gib']:.2f} vs "
            f"{row['plain_gpu_used_gib']:.2f} GiB -> {row['gpu_ratio']:.3f}x (allocator peaks "
            f"{row['ests_gpu_allocated_gib']:.2f} vs {row['plain_gpu_allocated_gib']:.2f} GiB)"
        )
    elif k == 8:
        line += " (target <= 0.25)"
    print(line, flush=True)


def _report_bytes(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(
            f"4. bytes sent per process per step, N={row['ests']} mapping {row['mapping']}: "
            f"{row['max_ratio']:.3f}x the gradient (target <= 2.5)",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
