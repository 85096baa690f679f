"""This worker's CPU cores and host memory, and which cores each training process gets.

The scheduler gives each process a core count and a memory limit (StartTaskRequest);
which cores is the worker's choice, since only it knows which are free. Cores are
held by a task from its start to its end, so two tasks never share a core unless
they share devices on purpose (collocated tasks, which then share the least-used
cores rather than being refused).

Plain functions and one small thread-safe allocator; the /proc reads are in
`detect_*` and `rss_bytes` only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from gearshift.common.errors import ResourceExhaustedError, ValidationError

MEMINFO = Path("/proc/meminfo")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# The training process reads it first thing and pins itself to these cores ("2,3").
CORES_VARIABLE = "GEARSHIFT_PROCESS_CORES"  # not --cpu-cores's GEARSHIFT_CPU_CORES


def parse_meminfo_total(text: str) -> int:
    """Bytes of MemTotal in a /proc/meminfo text; ValueError when it is missing."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "MemTotal":
            fields = rest.split()
            if fields and fields[0].isdigit():
                unit = fields[1].lower() if len(fields) > 1 else ""
                return int(fields[0]) * (1024 if unit == "kb" else 1)
    raise ValueError("no MemTotal line in /proc/meminfo")


def detect_cores() -> list[int]:
    """The cores this daemon may run on (its affinity, which a container's cpuset narrows)."""
    return sorted(os.sched_getaffinity(0))


def detect_memory() -> int:
    return parse_meminfo_total(MEMINFO.read_text())


def offered_cores(count: int, available: Sequence[int]) -> list[int]:
    """The first `count` of the cores available (0: all of them); ValidationError naming
    --cpu-cores when there are not that many."""
    if count < 0:
        raise ValidationError("--cpu-cores", "must be >= 0 (0: every core this daemon may use)")
    if count > len(available):
        raise ValidationError(
            "--cpu-cores", f"{count} asked but this daemon may use only {len(available)} cores"
        )
    return list(available[:count] if count else available)


def format_cores(cores: Sequence[int]) -> str:
    """`0-3,6`: ranges of consecutive core ids, as /proc's Cpus_allowed_list writes them."""
    parts: list[str] = []
    ordered = sorted(cores)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cores(text: str) -> list[int]:
    """Inverse of format_cores (also accepts plain comma lists); ValueError on bad text."""
    cores: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{text!r} is not a core list (e.g. 0-3,6)")
        cores.extend(range(int(first), int(last if dash else first) + 1))
    return sorted(set(cores))


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (/proc/<pid>/statm); None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return None
    return int(fields[1]) * PAGE_SIZE if len(fields) > 1 else None


class CoreAllocator:
    """Which of the worker's cores each task's processes hold; `take` and `release`."""

    def __init__(self, cores: Sequence[int]) -> None:
        self.cores = list(cores)
        self._users: dict[int, set[str]] = {c: set() for c in self.cores}
        self._lock = threading.Lock()

    def take(
        self, owner: str, per_process: int, processes: int, *, share: bool = False
    ) -> list[list[int]]:
        """Cores for each of `processes` processes of `owner`, `per_process` each, from the
        free ones; ResourceExhaustedError when too few are free, unless `share` (collocated
        tasks), which then also takes the least-used held ones."""
        if per_process < 1 or processes < 1:
            raise ValidationError("cpu_cores_per_process", "must be >= 1")
        needed = per_process * processes
        if needed > len(self.cores):
            raise ResourceExhaustedError(
                f"{processes} process(es) x {per_process} cores = {needed} cores asked; this "
                f"worker has {len(self.cores)} ({format_cores(self.cores)})"
            )
        with self._lock:
            free = [c for c in self.cores if not self._users[c]]
            if len(free) < needed and not share:
                held = sorted({u for c in self.cores for u in self._users[c]})
                raise ResourceExhaustedError(
                    f"{needed} cores asked but only {len(free)} of this worker's "
                    f"{len(self.cores)} are free (held by {', '.join(held)})"
                )
            chosen = sorted(self.cores, key=lambda c: (len(self._users[c]), self.cores.index(c)))
            chosen = chosen[:needed]
            for c in chosen:
                self._users[c].add(owner)
        return [sorted(chosen[i * per_process : (i + 1) * per_process]) for i in range(processes)]

    def release(self, owner: str) -> None:
        with self._lock:
            for users in self._users.values():
                users.discard(owner)

    def free(self) -> list[int]:
        with self._lock:
            return [c for c in self.cores if not self._users[c]]


def pin_from_environment(environ: dict[str, str] | None = None) -> str:
    """In a training process: pin it to the cores CORES_VARIABLE names (threads started
    later inherit them); what it did, for its log ("" without the variable)."""
    text = (os.environ if environ is None else environ).get(CORES_VARIABLE, "")
    if not text:
        return ""
    cores = parse_cores(text)
    os.sched_setaffinity(0, cores)
    return f"resources: pinned to CPU cores {format_cores(sorted(os.sched_getaffinity(0)))}"
