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
process's CPU time (the machine may be shared); with `--device cuda` (figures 1 and 2 on
the GPU; 3 and 4 stay on CPU) it is wall time up to the end of the step's kernels.

    .venv/bin/python bench/est_overhead.py [--steps 120] [--only 1 --only 2 ...] [--device cuda]
"""

from __future__ import annotations

import argparse
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


def interleaved(
    job: Workload, ests: int, steps: int, workdir: Path, device: str
) -> tuple[float, float, float]:
    """Runtime steps and plain-loop steps alternating one by one in this process.

    The plain step runs inside the runtime's progress callback (between two global
    steps, outside every EST context), so both see the same machine load. Returns
    (median runtime/plain time ratio, median runtime s/step, median plain s/step).
    """
    import torch

    from gearshift.worker.runtime.control import Progress
    from gearshift.worker.runtime.job import load_job
    from gearshift.worker.runtime.process import seed_globals
    from gearshift.worker.runtime.settings import RunSettings
    from gearshift.worker.runtime.trainer import Trainer

    warm = 3
    batch = ests * job.per_est
    plain = PlainLoop(job, ests, device)
    clock = step_clock(device)
    settings = RunSettings(
        num_ests=ests, global_batch_size=batch, total_steps=steps + warm, log_every=1
    )
    seed_globals(settings.seed)
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

    Trainer(
        load_job(job.module, job.config),
        settings,
        [list(range(ests))],
        0,
        workdir,
        device=torch.device(device),
        on_progress=progress,
    ).run()
    ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
    return ratio, statistics.median(ours), statistics.median(theirs)


def overhead_one_est(steps: int, workdir: Path, device: str) -> dict[str, float]:
    one = Workload("MLP", MLP, BIG, 256)
    ratio, ours, plain = interleaved(one, 1, steps, workdir / "one", device)
    return {"runtime_s_per_step": ours, "plain_s_per_step": plain, "slowdown": ratio}


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


def _runtime_steps(ests: int, batch: int, steps: int, workdir: Path) -> None:
    from gearshift.worker.runtime.job import load_job
    from gearshift.worker.runtime.process import seed_globals
    from gearshift.worker.runtime.settings import RunSettings
    from gearshift.worker.runtime.trainer import Trainer

    settings = RunSettings(num_ests=ests, global_batch_size=batch, total_steps=steps)
    seed_globals(settings.seed)
    Trainer(load_job(MLP, BIG), settings, [list(range(ests))], 0, workdir).run()


def _child(mode: str, steps: int, workdir: Path) -> None:
    """Run one side of the memory comparison in this process and print its peak RSS."""
    import torch

    torch.set_num_threads(1)
    if mode == "ests":
        _runtime_steps(8, 256, steps, workdir)
    else:
        plain = PlainLoop(Workload("MLP", MLP, BIG, 256 // 8), 1, "cpu")
        for _ in range(steps):
            plain.step()
    print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def _run_children(mode: str, count: int, steps: int, workdir: Path) -> list[int]:
    dirs = [str(workdir / f"{mode}-{i}") for i in range(count)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", mode, "--steps", str(steps), "--workdir", w],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in dirs
    ]
    peaks = []
    for proc in procs:
        out, _ = proc.communicate(timeout=1200)
        if proc.returncode:
            raise RuntimeError(f"memory child {mode} failed ({proc.returncode})")
        peaks.append(int(json.loads(out.strip().splitlines()[-1])["peak_rss"]))
    return peaks


def memory(steps: int, workdir: Path) -> dict[str, float]:
    (ests,) = _run_children("ests", 1, steps, workdir)
    plain = _run_children("plain", 8, steps, workdir)
    return {
        "ests_peak_rss_mib": ests / 2**20,
        "plain_x8_peak_rss_mib": sum(plain) / 2**20,
        "ratio": ests / sum(plain),
    }


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 120: on a shared 2-core machine 60 alternating steps left the 1-EST median +-2%.
    parser.add_argument("--steps", type=int, default=120, help="timed steps per figure")
    parser.add_argument("--only", type=int, choices=[1, 2, 3, 4], action="append")
    parser.add_argument("--child", choices=["ests", "plain"])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where figures 1 and 2 run"
    )
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.steps, args.workdir)
        return 0
    import torch

    from gearshift.worker.runtime.determinism import apply
    from gearshift.worker.runtime.settings import Determinism

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is visible")
    apply(Determinism.D1, threads=1, d2_threads=1)
    parts = set(args.only or [1, 2, 3, 4])
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if 1 in parts:
            _report_one(overhead_one_est(args.steps, workdir, args.device), args.device)
        if 2 in parts:
            for job in EIGHT_EST_WORKLOADS:
                eight = eight_ests_vs_accumulation(job, args.steps, workdir, args.device)
                _report_eight(eight, args.device)
        if 3 in parts:
            _report_memory(memory(args.steps, workdir))
        if 4 in parts:
            _report_bytes(bytes_sent(workdir))
    return 0


def _report_one(one: dict[str, float], device: str) -> None:
    print(
        f"1. 1 EST vs plain loop ({device}): {one['runtime_s_per_step'] * 1e3:.2f} vs "
        f"{one['plain_s_per_step'] * 1e3:.2f} ms/step -> {one['slowdown']:.4f}x time "
        "(target <= 1.02)",
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


def _report_memory(mem: dict[str, float]) -> None:
    print(
        "3. peak RSS, 8 ESTs in 1 process vs 8 plain processes: "
        f"{mem['ests_peak_rss_mib']:.0f} vs {mem['plain_x8_peak_rss_mib']:.0f} MiB -> "
        f"{mem['ratio']:.3f}x (target <= 0.25)",
        flush=True,
    )


def _report_bytes(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(
            f"4. bytes sent per process per step, N={row['ests']} mapping {row['mapping']}: "
            f"{row['max_ratio']:.3f}x the gradient (target <= 2.5)",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
