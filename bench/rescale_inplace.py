"""Rescaling in place against checkpoint-and-restart, in the runtime alone; CPU, one run.

The digits CNN (4 ESTs, D1) trains on processes forked by the worker daemon's zygote
(`gearshift.worker.zygote`, torch imported once), as a daemon starts them. The bench
itself stands in for the scheduler and the worker daemons, which do not ask for in-place
changes yet (issue 47, point 2). It rescales the job `--repeats` times of each kind, in
turn:

- grow: 2 -> 3 processes;
- shrink: 3 -> 2;
- move: 2 -> 2, one process replaced by a new one (between workers, on one host here).

It does this once per path:

- **in place:** the bench writes the change to the membership file and forks the joining
  process at the same moment; the change is at step 0, so the job trains on until the
  joiner says it is ready (membership.py);
- **in place, eager:** the same at step 1, applied at the next boundary: the processes
  that stay wait there for the joiner (what in place did before the joiners announced
  themselves);
- **restart:** the bench stops every process (SIGUSR1: a checkpoint at the next step,
  then exit 75), waits for them, and forks the new placement with `--resume`.

The decision is when the bench acts. The first step is the time at which the new
placement's rank 0 logged its first step after the change (the loss log). The bench
reports the median and max per kind and path, and of the pause: how long rank 0 did no
step, from the old placement's last step to the new one's first. In place, the first
step on the new placement still waits for the joiner, the pause only for the regrouping;
eager, both wait for it. A fourth run of the same steps on 2
processes, never rescaled, gives the throughput baseline (steps per second from the
first fork to the end). All four runs must end with the same digest. A 2-step run
first warms the zygote up, so that no run pays for its imports.

    .venv/bin/python bench/rescale_inplace.py [--repeats 10] [--gap 10] [--margin STEPS]
        [--json FILE] [--device cuda]

With `--device cuda` every process trains on the GPU (`bench/gpu_checks.sh`'s inplace part):
the runtime picks the backend (NCCL where each process has a GPU of its own, gloo with host
copies where they share one) and a joiner's state still comes from host memory.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gearshift.common.facts import EXIT_STOPPED
from gearshift.common.ports import free_port
from gearshift.worker.runtime import membership
from gearshift.worker.runtime.membership import Change
from gearshift.worker.spawner import Child, Spawner, SpawnRequest

CNN = "gearshift.examples.digits_cnn"
KINDS = ("grow", "shrink", "move")
TIMEOUT_S = 300.0
# The processes each kind goes from and to: ESTs per rank.
MAPPINGS = {"grow": ((2, 2), (2, 1, 1)), "shrink": ((2, 1, 1), (2, 2)), "move": ((2, 2), (2, 2))}


def wait_for(
    check: Callable[[], Any],
    what: str,
    timeout: float = TIMEOUT_S,
    alive: Callable[[], None] = lambda: None,
) -> Any:
    """Poll `check` until it returns something truthy (bounded; a bench, not a test).
    `alive` raises when waiting longer is pointless (a process of the job died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        alive()
        time.sleep(0.01)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


class Job:
    """One run of the job: its folder, its processes (by name) and its loss log."""

    def __init__(self, root: Path, spawner: Spawner, steps: int, device: str = "cpu") -> None:
        self.root = root
        self.device = device
        self.spawner = spawner
        self.steps = steps
        self.address = f"127.0.0.1:{free_port()}"
        self.procs: dict[str, Child] = {}
        self.count = 0
        self._read = 0  # bytes of the loss log read so far
        self._steps: dict[int, float] = {}
        root.mkdir(parents=True)

    def fork(self, mapping: tuple[int, ...], rank: int, *extra: str) -> str:
        self.count += 1
        name = f"p{self.count}"
        argv = [sys.executable, "-m", "gearshift.worker.run", "--job", CNN, "--ests", "4"]
        argv += ["--steps", str(self.steps), "--log-every", "1000000", "--mapping"]
        argv += [",".join(map(str, mapping)), "--rank", str(rank), "--master-addr"]
        argv += [self.address, "--checkpoint-dir", str(self.root / "ckpt"), "--loss-log"]
        argv += [str(self.root / "losses.jsonl"), "--membership-file"]
        argv += [str(self.root / "membership.json"), "--device", self.device, *extra]
        request = SpawnRequest(argv, dict(os.environ), self.root, self.log(name), forkable=True)
        self.procs[name] = self.spawner.spawn(request)
        return name

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def steps_logged(self) -> dict[int, float]:
        """Step -> when rank 0 logged it (the latest record of a step run twice). Reads only
        what was appended since the last call: on 2 cores, parsing the whole log at every
        poll took CPU from the job it measures."""
        path = self.root / "losses.jsonl"
        if path.exists():
            with path.open("rb") as f:
                f.seek(self._read)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._read += len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                self._steps[int(record["step"])] = float(record["time"])
        return self._steps

    def alive(self) -> None:
        """Raise, with its log's end, when a process failed: a child that cannot start (no
        GPU, a bad flag) would otherwise keep the bench waiting out its timeout."""
        for name, child in self.procs.items():
            code = child.poll()
            if code not in (None, 0, EXIT_STOPPED):
                tail = self.log(name).read_text()[-2000:]
                others = "".join(
                    f"\n--- {other} {c.poll()}\n{self.log(other).read_text()[-600:]}"
                    for other, c in self.procs.items()
                    if other != name and self.log(other).exists()
                )
                raise RuntimeError(
                    f"{self.root.name}: process {name} exited {code}:\n{tail}{others}"
                )

    def reach(self, step: int) -> float:
        found = wait_for(lambda: self.steps_logged().get(step), f"step {step}", alive=self.alive)
        return float(found)

    def changed_at(self, name: str, generation: int) -> int:
        """The step at which process `name` (rank 0 of `generation`) said it moved on to it."""
        pattern = re.compile(rf"^step (\d+): generation {generation},", re.MULTILINE)

        def alive() -> None:
            self.alive()
            if self.procs[name].poll() is not None:
                raise RuntimeError(
                    f"{self.root.name}: the job ended at step {self.last_step()} before "
                    f"generation {generation}: give it more steps (--margin)"
                )

        found = wait_for(
            lambda: pattern.search(self.log(name).read_text()), f"gen {generation}", alive=alive
        )
        return int(found.group(1))

    def last_step(self) -> int:
        return max(self.steps_logged(), default=0)

    def wait(self, names: list[str]) -> dict[str, int]:
        wait_for(
            lambda: all(self.procs[n].poll() is not None for n in names), f"the exit of {names}"
        )
        return {n: int(self.procs[n].poll() or 0) for n in names}

    def digest(self, name: str) -> str:
        found = re.findall(r"digest sha256:([0-9a-f]{64})", self.log(name).read_text())
        if not found:
            raise RuntimeError(f"{name} printed no digest:\n{self.log(name).read_text()}")
        return str(found[-1])


Seconds = dict[str, list[tuple[float, float]]]  # kind -> (decision to first step, pause)


def pause(job: Job, last: int) -> float:
    """How long rank 0 did no step: from step `last`, the old placement's last, to the new
    placement's first (a step's own time included)."""
    logged = job.steps_logged()
    return logged[last + 1] - logged[last]


def in_place(job: Job, kinds: list[str], gap: int, *, wait: bool = True) -> Seconds:
    """Every change in place; rank 0 (the first process) stays and serves the store. `wait`:
    at step 0, the job trains on until the joiner is ready; else at the next boundary."""
    seconds: Seconds = {kind: [] for kind in KINDS}
    ranks = [job.fork((2, 2), 0), job.fork((2, 2), 1)]
    changes: list[Change] = []
    for generation, kind in enumerate(kinds, 1):
        job.reach(job.last_step() + gap if changes else gap)
        old, new = MAPPINGS[kind]
        keep = {"grow": [0, 1], "shrink": [0, 1], "move": [0]}[kind]
        sources = (*keep, *[None] * (len(new) - len(keep)))
        changes.append(Change(generation, new, sources, job.address, at_step=0 if wait else 1))
        decided = time.time()
        membership.write(job.root / "membership.json", changes)
        joined = [
            job.fork(new, rank, "--join-generation", str(generation))
            for rank in range(len(keep), len(new))
        ]
        leaving = [ranks[r] for r in range(len(old)) if r not in keep]
        ranks = [ranks[r] for r in keep] + joined
        step = job.changed_at(ranks[0], generation)
        seconds[kind].append((job.reach(step + 1) - decided, pause(job, step)))
        job.wait(leaving)
    job.wait(ranks)
    return seconds


def restart(job: Job, kinds: list[str], gap: int) -> Seconds:
    """Every change a checkpoint, a stop and a new placement that resumes."""
    seconds: Seconds = {kind: [] for kind in KINDS}
    ranks = [job.fork((2, 2), 0), job.fork((2, 2), 1)]
    for count, kind in enumerate(kinds):
        job.reach(job.last_step() + gap if count else gap)
        _, new = MAPPINGS[kind]
        decided = time.time()
        for name in ranks:
            job.procs[name].send_signal(signal.SIGUSR1)
        codes = job.wait(ranks)
        if set(codes.values()) != {EXIT_STOPPED}:
            raise RuntimeError(f"the stop for a {kind} ended with {codes}")
        stopped = job.last_step()
        job.address = f"127.0.0.1:{free_port()}"
        ranks = [job.fork(new, rank, "--resume") for rank in range(len(new))]
        seconds[kind].append((job.reach(stopped + 1) - decided, pause(job, stopped)))
    job.wait(ranks)
    return seconds


DRIVES: dict[str, Callable[[Job, list[str], int], Seconds]] = {
    "in_place": in_place,
    "in_place_eager": functools.partial(in_place, wait=False),
    "restart": restart,
}


def fixed(job: Job) -> list[str]:
    ranks = [job.fork((2, 2), 0), job.fork((2, 2), 1)]
    job.wait(ranks)
    return ranks


def summary(values: list[float]) -> dict[str, float | int]:
    return {"median_s": statistics.median(values), "max_s": max(values), "n": len(values)}


def with_pauses(values: list[tuple[float, float]]) -> dict[str, float | int]:
    """`summary` of the decisions to first steps, and the pauses' median and max."""
    paused = [v[1] for v in values]
    return summary([v[0] for v in values]) | {
        "pause_median_s": statistics.median(paused),
        "pause_max_s": max(paused),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="rescales of each kind")
    parser.add_argument("--gap", type=int, default=10, help="steps between two rescales")
    parser.add_argument(
        "--margin",
        type=int,
        help="steps a rescale may take beyond --gap (the job trains on while a joiner starts; "
        "default 20 on the CPU, 120 on a GPU, where a joiner took 0.7 s to be ready)",
    )
    parser.add_argument("--json", type=Path, help="write every figure here as one document")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="(cpu)")
    args = parser.parse_args()
    margin = args.margin if args.margin is not None else 120 if args.device == "cuda" else 20
    kinds = [kind for _ in range(args.repeats) for kind in KINDS]
    steps = len(kinds) * (args.gap + margin) + 2 * args.gap
    spawner = Spawner(zygote_python=sys.executable)
    figures: dict[str, Any] = {"steps": steps, "rescales": len(kinds), "device": args.device}
    with tempfile.TemporaryDirectory(prefix="gearshift-rescale-") as tmp:
        # the zygote's imports, before any clock
        fixed(Job(Path(tmp) / "warm-up", spawner, 2, args.device))
        runs: dict[str, tuple[Job, float, Seconds]] = {}
        for path, drive in DRIVES.items():
            job = Job(Path(tmp) / path, spawner, steps, args.device)
            began = time.time()
            runs[path] = (job, began, drive(job, kinds, args.gap))
            print(f"{path}: {len(kinds)} rescales in {time.time() - began:.1f} s", flush=True)
        base = Job(Path(tmp) / "fixed", spawner, steps, args.device)
        began = time.time()
        first = fixed(base)[0]
        rates = {"fixed": steps / (base.steps_logged()[steps] - began)}
        digests = {"fixed": base.digest(first)}
        for path, (job, began, seconds) in runs.items():
            rates[path] = steps / (job.steps_logged()[steps] - began)
            last = [name for name in job.procs if "digest" in job.log(name).read_text()]
            digests[path] = job.digest(last[-1])
            for kind in KINDS:
                figures.setdefault(kind, {})[path] = with_pauses(seconds[kind])
    figures["throughput_steps_per_s"] = rates
    figures["throughput_ratio"] = {p: rates[p] / rates["fixed"] for p in DRIVES}
    figures["digests_equal"] = len(set(digests.values())) == 1
    figures["digest"] = digests["fixed"]
    spawner.close()
    print(f"digits CNN, 4 ESTs, {steps} steps, {len(kinds)} rescales per path")
    print(f"{'':<24}{'decision to first step':>22}{'pause':>20}")
    print(
        f"{'kind':<8}{'path':<16}{'median s':>12}{'max s':>10}{'median s':>10}{'max s':>10}{'n':>4}"
    )
    for kind in KINDS:
        for path in DRIVES:
            row = figures[kind][path]
            first = f"{row['median_s']:>12.3f}{row['max_s']:>10.3f}"
            paused = f"{row['pause_median_s']:>10.3f}{row['pause_max_s']:>10.3f}"
            print(f"{kind:<8}{path:<16}{first}{paused}{row['n']:>4}")
    for path, rate in rates.items():
        print(f"throughput {path:<15} {rate:8.1f} steps/s")
    print(f"digests equal: {figures['digests_equal']} ({digests})")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if figures["digests_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
