"""A PS phase run as a worker daemon's task: cores per process, measured use, progress.

The worker daemon starts the PS launcher (`python -m gearshift.worker.ps.run --task ...`)
as a task's one process, pinned to the cores the scheduler's plan gives the whole job;
the launcher splits them over its PS and worker processes (`assign_cores`), measures
each process's CPU and memory while the phase runs (`UseMeter`, from /proc), and keeps
`progress.json` in the task folder as a data-parallel rank 0 does: global batches done,
samples/s, and DLRover's PS metrics (ŵ, ŝ, cores used per PS, memory, the held-out AUC
of the last phase), which heartbeats carry to the scheduler (TaskStatus.ps_metrics).

A stop request (SIGUSR1 to the launcher) writes the stop file: PS 0 stops handing out
batches, the workers finish the batch they hold, `rpc.shutdown()` drains every push, the
PSs write their shards and the launcher publishes the checkpoint, then exits 75
(checkpointed on request); a resumed task continues from that checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STOP_FILE = "stop"  # in the checkpoint folder: PS 0 hands out no more batches
PS0_PROGRESS = "ps0-progress.json"  # in a generation's folder: PS 0's batch counter
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def assign_cores(available: Sequence[int], demands: Sequence[float]) -> list[list[int]]:
    """Cores for each process, `ceil(demand)` each (at least 1, at most all): disjoint
    slices in order when the available cores suffice, else shared round-robin (a plan
    bigger than the cores it was given still runs, slower)."""
    if not available:
        raise ValueError("no cores to assign")
    if any(d <= 0 for d in demands):
        raise ValueError(f"every process needs > 0 cores, got {list(demands)}")
    wants = [min(max(math.ceil(d - 1e-9), 1), len(available)) for d in demands]
    out: list[list[int]] = []
    pos = 0
    for want in wants:
        out.append(sorted({available[(pos + i) % len(available)] for i in range(want)}))
        pos += want
    return out


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (/proc/<pid>/stat); None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class UseMeter:
    """CPU and peak RSS of a phase's processes, from the first sample to the latest."""

    ps_pids: list[int]
    worker_pids: list[int]
    first_at: float = 0.0
    last_at: float = 0.0
    first_cpu: dict[int, float] = field(default_factory=dict)
    last_cpu: dict[int, float] = field(default_factory=dict)
    peak_rss: dict[int, int] = field(default_factory=dict)

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for pid in self.ps_pids + self.worker_pids:
            cpu = cpu_seconds(pid)
            if cpu is None:
                continue
            self.first_cpu.setdefault(pid, cpu)
            self.last_cpu[pid] = cpu
            self.peak_rss[pid] = max(self.peak_rss.get(pid, 0), rss(pid))
        if not self.first_at:
            self.first_at = now
        self.last_at = now

    def cores(self, pid: int) -> float:
        span = self.last_at - self.first_at
        if span <= 0 or pid not in self.first_cpu:
            return 0.0
        return (self.last_cpu[pid] - self.first_cpu[pid]) / span

    def metrics(self) -> dict[str, float | int | list[float]]:
        """DLRover's measurements: ŵ (mean worker cores), cores per PS, ŝ = PS cores / N_w."""
        ps = [self.cores(p) for p in self.ps_pids]
        workers = [self.cores(p) for p in self.worker_pids]
        return {
            "worker_cores_used": sum(workers) / len(workers) if workers else 0.0,
            "ps_cores_per_worker": sum(ps) / len(workers) if workers else 0.0,
            "ps_cores_used": ps,
            "worker_memory_bytes_used": max(
                (self.peak_rss.get(p, 0) for p in self.worker_pids), default=0
            ),
            "ps_memory_bytes_used": max((self.peak_rss.get(p, 0) for p in self.ps_pids), default=0),
            "ps": len(self.ps_pids),
            "workers": len(self.worker_pids),
            "measured_seconds": max(self.last_at - self.first_at, 0.0),
        }


def write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
