"""cgroup v2 limits for training processes, used only where this daemon may create cgroups.

That is: its own cgroup (the `0::` line of /proc/self/cgroup) is a cgroup v2 folder it
may write and that offers the cpuset and memory controllers (a delegated cgroup: systemd's
`Delegate=yes`, a container given its own). cgroup v2 lets a folder that holds processes
have no children with controllers, so the daemon first moves itself into `<own>/daemon`
(its training processes and zygote, started later, follow it there), then enables the
controllers for `<own>`'s children. Each process then gets `<own>/<task>.rank<R>` with
`cpuset.cpus` and `memory.max` and is moved in once spawned. Anything refused on the way
means no cgroups: CPU affinity and the RSS watchdog, which run in every case, hold the
process alone. (Memory a process touched before it was moved stays charged where it was:
the watchdog still sees it.) The kernel's OOM kill shows in the cgroup's memory.events.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from gearshift.worker.resources import format_cores

ROOT = Path("/sys/fs/cgroup")
PROC_SELF = Path("/proc/self/cgroup")
CONTROLLERS = ("cpuset", "memory")
DAEMON_LEAF = "daemon"


def own_cgroup(text: str) -> str | None:
    """The cgroup v2 path in a /proc/<pid>/cgroup text (`0::/a/b` -> `/a/b`); None in v1."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def problem(root: Path, own: str | None) -> str:
    """Why task cgroups cannot be made under `own` (empty: they can be tried)."""
    if own is None or not (root / "cgroup.controllers").is_file():
        return "no cgroup v2 hierarchy"
    if own == "/":
        return "the daemon is in the root cgroup, not one delegated to it"
    base = root / own.lstrip("/")
    try:
        offered = (base / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return f"cannot read {base}/cgroup.controllers: {exc.strerror}"
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:
        return f"{base} does not offer {', '.join(missing)}"
    if not os.access(base, os.W_OK):
        return f"{base} is not writable by this daemon"
    return ""


class Cgroups:
    """Task cgroups under this daemon's own cgroup folder `base`."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def probe(cls, root: Path = ROOT, proc: Path = PROC_SELF) -> tuple[Cgroups | None, str]:
        """Set up and return the cgroups of this daemon, or None and why not."""
        try:
            own = own_cgroup(proc.read_text())
        except OSError as exc:
            return None, f"cannot read {proc}: {exc.strerror}"
        why = problem(root, own)
        if why:
            return None, why
        assert own is not None
        cgroups = cls(root / own.lstrip("/"))
        try:
            cgroups.setup(os.getpid())
        except OSError as exc:
            return None, f"cannot delegate {cgroups.base}: {exc}"
        return cgroups, ""

    def setup(self, pid: int) -> None:
        """Move the daemon into its leaf, then enable the controllers for the task cgroups."""
        leaf = self.base / DAEMON_LEAF
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(f"{pid}\n")
        (self.base / "cgroup.subtree_control").write_text(
            " ".join(f"+{c}" for c in CONTROLLERS) + "\n"
        )

    def create(self, name: str, cores: Sequence[int], memory: int) -> Path:
        """A cgroup for one process, its limits written (OSError when refused)."""
        path = self.base / name
        path.mkdir(exist_ok=True)
        if cores:
            (path / "cpuset.cpus").write_text(format_cores(cores) + "\n")
        if memory > 0:
            (path / "memory.max").write_text(f"{memory}\n")
        return path

    @staticmethod
    def add(path: Path, pid: int) -> None:
        (path / "cgroup.procs").write_text(f"{pid}\n")

    @staticmethod
    def oom_killed(path: Path) -> bool:
        """Whether the kernel killed a process of the cgroup for its memory.max."""
        try:
            text = (path / "memory.events").read_text()
        except OSError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        return False

    @staticmethod
    def remove(path: Path) -> None:
        """Drop an emptied cgroup (best effort: one that still holds a process stays)."""
        with contextlib.suppress(OSError):
            path.rmdir()
