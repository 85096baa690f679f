"""The runtime's GPU checks in one go, for a machine with CUDA: `bench/gpu_checks.sh OUTDIR`.

Parts (all by default, in this order; `--parts` picks some):

- tests: the GPU-marked tests (`pytest -m gpu` over the test files that have them).
- bitwise: N = 4 ESTs under D1 on the GPU - 1 process x 4 ESTs vs 2 x 2 vs 4 x 1 (the
  processes share the GPU: gloo, or NCCL where there is a GPU per process) and a staged
  rescale 4 -> 2 -> 3 (mapping 2,1,1) resumed from checkpoints - for the digits CNN (SGD)
  and the tiny LM (Adam); each run's digest and every EST's loss bits at every step are
  compared with the 1 x 4 run's.
- d2: the digits CNN under D2 on 1 and 2 processes: equal digests here, and the digest to
  compare with the same part on another GPU kind (H100 vs H200).
- overhead: `bench/est_overhead.py --device cuda --only 1 --only 2` (1 EST vs a plain loop,
  8 ESTs vs 8-micro-batch accumulation, a ResNet-18 among the jobs).
- memory: `bench/est_overhead.py --device cuda --only 3` (GPU memory of 1, 2, 4, 8, 16
  ESTs in one process vs as many plain processes).
- inplace: `bench/rescale_inplace.py --device cuda --repeats 10` (issue 47: grow, shrink and
  move in place - waiting for the joiner, and eager - against checkpoint-and-restart on the
  GPU, each rescale's cost and pause; the digests of the rescaled runs and the fixed one
  must be equal).
- multiplex: `bench/multiplex.py --cuda` (DeepPool's foreground/background pair on GPU 0 -
  high- and low-priority streams, the pause loop - against the two one after the other;
  both keep their digests).

It writes three files to OUTDIR (the device tool brings back at most 8): summary.md (the
device, driver and versions, then one table per part), summary.json (the same data) and
logs.tar.gz (every command's output and the runs' statistics; no checkpoints). Each
command is bounded by `--deadline` (seconds from the start, default 540: a device command
is killed at 600), and a part that no longer fits is listed as not run, so the summary is
always written. Exit status: 0 when every part ran and passed, 1 when a check failed or a
part did not finish, 2 when there is no CUDA device or the project cannot be imported
(nothing runs then).

On the device machine (Python 3.12 with torch, no network) `bench/gpu_checks.sh` installs
the wheels carried in `.gearshift/gpu-wheels/` (`bench/gpu_wheels.sh` downloads them here;
name the folder in the device command's carry), and this script makes the repository
importable as the `gearshift` package without installing it. Two commands of 10 minutes
cover everything:

    bench/gpu_checks.sh $OUT --parts tests,bitwise
    bench/gpu_checks.sh $OUT --parts d2,overhead,memory,multiplex,inplace
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]
PARTS = ("tests", "bitwise", "d2", "overhead", "memory", "multiplex", "inplace")
EXIT_FAILED = 1
EXIT_UNUSABLE = 2
RESERVE_S = 25.0  # kept for the summary and the logs' archive
MIN_PART_S = 30.0  # a part is not started with less than this left
LAUNCH_LIMIT_S = 300.0
DIGEST = re.compile(r"^digest sha256:([0-9a-f]{64})$", re.MULTILINE)
CNN = "gearshift.examples.digits_cnn"
LM = "gearshift.examples.tiny_lm"
# Modules every part needs (the training processes), and those of the daemon's test.
NEEDED = ("gearshift.worker.run", "gearshift.worker.wiring", "sklearn")
NEEDED_BY_TESTS = ("gearshift.worker.daemon", "pytest")


# -- arguments ---------------------------------------------------------------------------------


def parts_list(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in PARTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give some of {', '.join(PARTS)}, comma-separated"
        )
    return [part for part in PARTS if part in chosen]


def at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} (got {value})")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/gpu_checks.sh", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    parser.add_argument("outdir", type=Path, help="where summary.md, .json and logs go")
    parser.add_argument("--parts", type=parts_list, default=list(PARTS), help=", ".join(PARTS))
    parser.add_argument("--deadline", type=at_least(60), default=540, help="seconds for everything")
    parser.add_argument(
        "--workdir", type=Path, default=Path("/tmp/gearshift-gpu-checks"), help="scratch space"
    )
    parser.add_argument("--cnn-steps", type=at_least(3), default=150, help="digits CNN steps")
    parser.add_argument("--lm-steps", type=at_least(3), default=90, help="tiny LM steps")
    parser.add_argument("--d2-steps", type=at_least(1), default=60, help="D2 run's steps")
    parser.add_argument("--overhead-steps", type=at_least(10), default=120, help="timed steps")
    parser.add_argument("--python", default=sys.executable, help="the Python with torch")
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: only to try this script where there is no GPU (its figures say nothing "
        "about GPUs)",
    )
    return parser


# -- running commands under the deadline ------------------------------------------------------


class Deadline:
    def __init__(self, seconds: float, now: float | None = None) -> None:
        self.end = (time.monotonic() if now is None else now) + seconds

    def left(self) -> float:
        return self.end - RESERVE_S - time.monotonic()

    def limit(self, wanted: float) -> float:
        return max(min(wanted, self.left()), 1.0)


@dataclass
class Ran:
    """One command's end: exit code (None: stopped at its time limit), seconds, log."""

    code: int | None
    seconds: float
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def run_logged(
    cmd: Sequence[str], log: Path, timeout: float, env: Mapping[str, str], cwd: Path = REPO
) -> Ran:
    """Run `cmd` with stdout and stderr in `log`; past `timeout` its whole process group
    (a launcher's training processes too) is killed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
            out.write(f"\n[gpu_checks] stopped after {timeout:.0f}s\n")
    return Ran(code, time.monotonic() - start, log)


# -- the environment -------------------------------------------------------------------------


def import_path(repo: Path, target: Path) -> Path:
    """A folder that makes `repo` importable as the `gearshift` package without installing
    it: links named after pyproject.toml's package-dir mapping."""
    mapping: dict[str, str] = tomllib.loads((repo / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    if target.exists():
        shutil.rmtree(target)
    top = target / "gearshift"
    top.mkdir(parents=True)
    for entry in (repo / mapping["gearshift"]).iterdir():
        (top / entry.name).symlink_to(entry.resolve())
    for package, folder in sorted(mapping.items()):
        if package != "gearshift":
            link = target.joinpath(*package.split("."))
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to((repo / folder).resolve())
    return target


def missing(python: str, modules: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """Module -> why it does not import, for each of `modules` that does not."""
    probe = (
        "import importlib, json, sys\n"
        "bad = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        bad[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(bad))\n"
    )
    done = subprocess.run(
        [python, "-c", probe, *modules], capture_output=True, text=True, env=dict(env),
        cwd=REPO, timeout=300, check=False,
    )  # fmt: skip
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {name: done.stderr.strip()[-500:] for name in modules}


def cuda_info(python: str, env: Mapping[str, str]) -> dict[str, Any]:
    """What torch sees: available, device count and name, torch, CUDA and NCCL versions."""
    probe = (
        "import json, torch\n"
        "ok = torch.cuda.is_available()\n"
        "nccl = torch.cuda.nccl.version() if ok else None\n"
        "print(json.dumps({'available': ok, 'count': torch.cuda.device_count() if ok else 0,\n"
        "    'name': torch.cuda.get_device_name(0) if ok else '', 'torch': torch.__version__,\n"
        "    'cuda': torch.version.cuda, 'nccl': '.'.join(map(str, nccl)) if nccl else None}))\n"
    )
    done = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, env=dict(env), timeout=300,
        check=False,
    )  # fmt: skip
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"available": False, "error": done.stderr.strip()[-1000:]}


def nvidia_smi() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        return "nvidia-smi not found"
    return (done.stdout or done.stderr).strip()


# -- bitwise runs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One launcher command of a run: P processes up to `steps` global steps."""

    procs: int
    steps: int
    mapping: str = ""
    resume: bool = False


def bitwise_plan(steps: int) -> dict[str, list[Launch]]:
    """Run name -> its launches; every run ends at `steps` with N = 4 ESTs."""
    third = steps // 3
    return {
        "1 x 4": [Launch(1, steps)],
        "2 x 2": [Launch(2, steps)],
        "4 x 1": [Launch(4, steps)],
        "4 -> 2 -> 3 (2,1,1), resumed": [
            Launch(4, third),
            Launch(2, 2 * third, resume=True),
            Launch(3, steps, "2,1,1", resume=True),
        ],
    }


def launch_command(
    args: argparse.Namespace, job: str, run_dir: Path, stage: int, launch: Launch, *extra: str
) -> list[str]:
    cmd = [args.python, "-m", "gearshift.worker.run", "--job", job, "--ests", "4"]
    cmd += ["--procs", str(launch.procs), "--steps", str(launch.steps), "--device", args.device]
    cmd += ["--log-every", "50", "--checkpoint-dir", str(run_dir / "ckpt")]
    cmd += ["--loss-log", str(run_dir / "losses.jsonl")]
    cmd += ["--stats-dir", str(run_dir / f"stats-{stage}")]
    if launch.mapping:
        cmd += ["--mapping", launch.mapping]
    if launch.resume:
        cmd.append("--resume")
    return [*cmd, *extra]


def digest_of(text: str) -> str:
    found = DIGEST.findall(text)
    return str(found[-1]) if found else ""


def loss_steps(path: Path) -> list[list[str]]:
    """Every EST's loss bits, step by step (a step run again after a resume counts once)."""
    by_step: dict[int, list[str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                by_step[int(record["step"])] = list(record["loss_bits"])
    return [by_step[step] for step in sorted(by_step)]


def first_difference(reference: list[list[str]], other: list[list[str]]) -> int | None:
    """1-based step of the first loss bits that differ (or that one run lacks)."""
    for step in range(max(len(reference), len(other))):
        if step >= len(reference) or step >= len(other) or reference[step] != other[step]:
            return step + 1
    return None


def rank_stats(stats_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("rank*.json"))]
    return sorted(rows, key=lambda row: int(row.get("rank", 0)))


@dataclass
class RunResult:
    """A run of the bitwise part (or d2) and how it compares with its reference."""

    job: str
    name: str
    ok: bool  # every launch exited 0
    seconds: float
    digest: str
    backends: list[str]  # per launch: the ranks' "device/backend", e.g. "cuda:0/gloo x2"
    steps: int = 0  # steps with loss bits
    same_digest: bool | None = None
    first_difference: int | None = None
    error: str = ""
    losses: list[list[str]] = field(default_factory=list, repr=False)

    def passed(self) -> bool:
        """Ran, and matched its reference (a run whose reference failed was not compared)."""
        return self.ok and self.same_digest is True and self.first_difference is None


def describe_ranks(stats: list[dict[str, Any]]) -> str:
    """`cuda:0/gloo x2`: each distinct device/backend and how many ranks had it."""
    kinds: dict[str, int] = {}
    for row in stats:
        key = f"{row.get('device', '?')}/{row.get('backend', '?')}"
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{key} x{count}" if count > 1 else key for key, count in kinds.items())


def run_launches(
    ctx: Context,
    job: str,
    name: str,
    launches: list[Launch],
    *,
    part: str,
    extra: Sequence[str] = (),
) -> RunResult:
    """The launches of one run, in order, in their own folder; stops at the first failure."""
    run_dir = ctx.logs / part / job.rsplit(".", 1)[-1] / slug(name)
    started = time.monotonic()
    backends: list[str] = []
    output = ""
    for stage, launch in enumerate(launches):
        cmd = launch_command(ctx.args, job, run_dir, stage, launch, *extra)
        limit = ctx.deadline.limit(LAUNCH_LIMIT_S)
        ran = run_logged(cmd, run_dir / f"launch-{stage}.log", limit, ctx.env)
        output = ran.output()
        backends.append(describe_ranks(rank_stats(run_dir / f"stats-{stage}")))
        if ran.code != 0:
            why = "stopped at its time limit" if ran.code is None else f"exit {ran.code}"
            tail = "\n".join(output.strip().splitlines()[-5:])
            return RunResult(
                job, name, False, time.monotonic() - started, "", backends,
                error=f"launch {stage + 1} ({launch.procs} processes): {why}\n{tail}",
            )  # fmt: skip
    losses = loss_steps(run_dir / "losses.jsonl")
    return RunResult(
        job, name, True, time.monotonic() - started, digest_of(output), backends,
        steps=len(losses), losses=losses,
    )  # fmt: skip


def compare_with(reference: RunResult, runs: list[RunResult]) -> None:
    """Set each run's verdict against the reference (the reference against itself)."""
    for run in runs:
        if not (run.ok and reference.ok):
            continue
        run.same_digest = bool(run.digest) and run.digest == reference.digest
        run.first_difference = first_difference(reference.losses, run.losses)


# -- the parts ---------------------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    env: dict[str, str]
    deadline: Deadline
    logs: Path


def part_tests(ctx: Context) -> dict[str, Any]:
    bad = missing(ctx.args.python, NEEDED_BY_TESTS, ctx.env)
    if bad:
        return {"ok": False, "error": f"cannot import {bad}", "tests": []}
    files = sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if "@pytest.mark.gpu" in path.read_text()
    )
    junit = ctx.logs / "tests.xml"
    cmd = [ctx.args.python, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider"]
    cmd += ["--junitxml", str(junit), *files]
    ran = run_logged(cmd, ctx.logs / "tests.log", ctx.deadline.limit(540.0), ctx.env)
    tests = junit_rows(junit) if junit.exists() else []
    failed = [t for t in tests if t["outcome"] not in ("passed", "skipped")]
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    return {
        "ok": ran.code == 0 and bool(tests) and not failed and not skipped,
        "exit": ran.code,
        "seconds": ran.seconds,
        "tests": tests,
        "error": "" if ran.code is not None else "stopped at its time limit",
    }


def junit_rows(path: Path) -> list[dict[str, Any]]:
    """Each test case of a JUnit XML report: name, outcome, seconds, message."""
    rows = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                text = (found.get("message") or found.text or "").strip()
                outcome, message = name, (text.splitlines() or [""])[0][:200]
                break
        rows.append(
            {
                "test": f"{case.get('classname', '')}::{case.get('name', '')}",
                "outcome": outcome,
                "seconds": float(case.get("time", 0)),
                "message": message,
            }
        )
    return rows


def part_bitwise(ctx: Context) -> dict[str, Any]:
    jobs = [
        ("digits CNN (SGD)", CNN, ctx.args.cnn_steps),
        ("tiny LM (Adam)", LM, ctx.args.lm_steps),
    ]
    results: list[RunResult] = []
    for label, module, steps in jobs:
        runs = []
        for name, launches in bitwise_plan(steps).items():
            if ctx.deadline.left() < MIN_PART_S:
                runs.append(RunResult(label, name, False, 0.0, "", [], error="not run: deadline"))
            else:
                runs.append(run_launches(ctx, module, name, launches, part="bitwise"))
                runs[-1].job = label
        compare_with(runs[0], runs)
        results += runs
    return {"ok": all(r.passed() for r in results), "runs": [summary_of(r) for r in results]}


def part_d2(ctx: Context) -> dict[str, Any]:
    steps = ctx.args.d2_steps
    runs = []
    for name, launch in (("1 x 4", Launch(1, steps)), ("2 x 2", Launch(2, steps))):
        d2 = ("--determinism", "D2")
        runs.append(run_launches(ctx, CNN, name, [launch], part="d2", extra=d2))
        runs[-1].job = "digits CNN (SGD), D2"
    compare_with(runs[0], runs)
    return {"ok": all(r.passed() for r in runs), "runs": [summary_of(r) for r in runs]}


def part_overhead(ctx: Context, figures: Sequence[str], name: str) -> dict[str, Any]:
    out = ctx.logs / f"{name}.json"
    cmd = [ctx.args.python, "bench/est_overhead.py", "--device", ctx.args.device]
    cmd += ["--json", str(out)]
    cmd += ["--steps", str(ctx.args.overhead_steps)]
    for figure in figures:
        cmd += ["--only", figure]
    ran = run_logged(cmd, ctx.logs / f"{name}.log", ctx.deadline.limit(540.0), ctx.env)
    data = json.loads(out.read_text()) if out.exists() else {}
    error = {0: "", None: "stopped at its time limit"}.get(ran.code, f"exit {ran.code}")
    return {
        "ok": ran.code == 0 and bool(data),
        "seconds": ran.seconds,
        "data": data,
        "error": error,
    }


def summary_of(run: RunResult) -> dict[str, Any]:
    out = asdict(run)
    out.pop("losses")
    out["passed"] = run.passed()
    return out


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


# -- the summary -------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def verdict(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "**NO**"


def run_rows(runs: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    rows = []
    for run in runs:
        if run["error"]:
            cells = [f"failed: {run['error'].splitlines()[0]}", "-", "-", "-"]
        else:
            first = run["first_difference"]
            cells = [
                f"`{run['digest'][:16]}`",
                verdict(run["same_digest"]),
                "none" if first is None else f"**{first}**",
                run["steps"],
            ]
        backends = "; ".join(run["backends"]) or "-"
        rows.append([run["job"], run["name"], backends, *cells, f"{run['seconds']:.0f}"])
    return rows


RUN_HEADERS = (
    "job", "run", "device/backend per launch", "digest", "= 1 x 4", "first differing step",
    "steps", "s",
)  # fmt: skip


def overhead_lines(data: Mapping[str, Any]) -> list[str]:
    rows = []
    one = data.get("one_est")
    if one:
        rows.append(
            [
                "1 EST vs plain loop",
                one["job"],
                one["per_est"],
                f"{one['runtime_s_per_step'] * 1e3:.2f}",
                f"{one['plain_s_per_step'] * 1e3:.2f}",
                f"{one['slowdown']:.4f}x time",
                "<= 1.02 (EasyScale: overhead <= 1.9%)",
            ]
        )
    for eight in data.get("eight_ests", []):
        rows.append(
            [
                "8 ESTs vs 8-micro-batch accumulation",
                eight["job"],
                eight["per_est"],
                f"{eight['runtime_s_per_step'] * 1e3:.2f}",
                f"{eight['accumulation_s_per_step'] * 1e3:.2f}",
                f"{eight['throughput']:.4f}x throughput",
                ">= 0.95",
            ]
        )
    headers = (
        "figure",
        "job",
        "samples/EST",
        "runtime ms/step",
        "plain ms/step",
        "ratio",
        "target",
    )
    return table(headers, rows) if rows else ["(no figures)"]


def memory_lines(data: Mapping[str, Any]) -> list[str]:
    rows = [
        [
            row["count"],
            row["job"],
            row["per_est"],
            f"{row.get('ests_gpu_used_gib', 0):.2f}",
            f"{row.get('plain_gpu_used_gib', 0):.2f}",
            f"{row.get('gpu_ratio', 0):.3f}",
            f"{row.get('ests_gpu_allocated_gib', 0):.2f} / "
            f"{row.get('plain_gpu_allocated_gib', 0):.2f}",
            f"{row['ests_peak_rss_mib']:.0f} / {row['plain_peak_rss_mib']:.0f}",
        ]
        for row in data.get("memory", [])
    ]
    headers = (
        "k", "job", "samples/EST", "k ESTs, 1 process: GPU in use GiB",
        "k processes: GPU in use GiB", "ratio", "allocator peaks GiB (ESTs / processes)",
        "RSS MiB (ESTs / processes)",
    )  # fmt: skip
    return table(headers, rows) if rows else ["(no rows)"]


def run_bench(ctx: Context, name: str, argv: Sequence[str], limit: float) -> dict[str, Any]:
    """bench/ARGV[0] with its arguments, writing its figures to NAME.json: whether it exited
    0, the figures, and why not."""
    out = ctx.logs / f"{name}.json"
    cmd = [ctx.args.python, str(REPO / "bench" / argv[0]), *argv[1:], "--json", str(out)]
    ran = run_logged(cmd, ctx.logs / f"{name}.log", ctx.deadline.limit(limit), ctx.env)
    data = json.loads(out.read_text()) if out.exists() else {}
    error = "" if ran.code == 0 else f"exit {ran.code} (see logs.tar.gz)"
    return {"ok": ran.code == 0, "data": data, "error": error}


def part_multiplex(ctx: Context) -> dict[str, Any]:
    return run_bench(ctx, "multiplex", ["multiplex.py", "--cuda"], 400.0)


def part_inplace(ctx: Context) -> dict[str, Any]:
    argv = ["rescale_inplace.py", "--device", "cuda", "--repeats", "10"]
    result = run_bench(ctx, "inplace", argv, 420.0)
    result["ok"] = result["ok"] and bool(result["data"].get("digests_equal"))
    return result


def inplace_lines(data: Mapping[str, Any]) -> list[str]:
    keys = ("median_s", "max_s", "pause_median_s", "pause_max_s")
    rows = [
        [kind, path, *(f"{row[key]:.3f}" if key in row else "-" for key in keys), str(row["n"])]
        for kind in ("grow", "shrink", "move")
        for path, row in data.get(kind, {}).items()
    ]
    ratio = data.get("throughput_ratio", {})
    tail = [
        "",
        f"throughput against the fixed run: {ratio}",
        f"digests equal: {data.get('digests_equal')}",
    ]
    headers = ("kind", "path", "first step: median s", "max s", "pause: median s", "max s", "n")
    return [*table(headers, rows), *tail] if rows else ["(none)"]


def multiplex_lines(data: Mapping[str, Any]) -> list[str]:
    rows = [
        [
            label,
            f"{data[key]['fg_slowdown']:.3f}x",
            f"{100 * data[key]['bg_progress_when_fg_done']:.0f}%",
            f"{data[key]['throughput_ratio']:.3f}x",
            str(data[key]["pause_count"]),
        ]
        for key, label in (("loop", "pause loop"), ("priority", "priority only"))
        if key in data
    ]
    headers = ("collocated", "foreground slowdown", "background done", "vs sequential", "pauses")
    same = f"same digests as alone: {data.get('same_digests')}"
    return [*table(headers, rows), "", same] if rows else ["(no rows)"]


def render(report: Mapping[str, Any]) -> str:
    """summary.md from the report (summary.json's content)."""
    env = report["environment"]
    lines = ["# Gearshift GPU checks (bench/gpu_checks.py)", ""]
    lines += [
        f"- device: {env.get('nvidia_smi', '?')}",
        f"- torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, "
        f"NCCL {env.get('nccl', '?')}; {env.get('count', 0)} GPU(s) visible to torch",
        f"- parts: {', '.join(report['parts'])} on {report['device']}; {report['seconds']:.0f} s",
        f"- verdict: **{report['verdict']}**",
    ]
    if report.get("error"):
        lines += ["", f"**error:** {report['error']}"]
    results = report["results"]
    if "tests" in results:
        tests = results["tests"]
        lines += ["", "## GPU-marked tests", ""]
        rows = [
            [t["test"], t["outcome"], f"{t['seconds']:.1f}", t["message"]] for t in tests["tests"]
        ]
        lines += table(("test", "outcome", "s", "message"), rows) if rows else ["(none ran)"]
        if tests.get("error"):
            lines += ["", f"error: {tests['error']}"]
    if "bitwise" in results:
        lines += ["", f"## Bitwise: N = 4 ESTs, D1, on {report['device']}", ""]
        lines += table(RUN_HEADERS, run_rows(results["bitwise"]["runs"]))
    if "d2" in results:
        lines += ["", "## D2 digest (compare with the same part on another GPU kind)", ""]
        lines += table(RUN_HEADERS, run_rows(results["d2"]["runs"]))
    if "overhead" in results:
        lines += ["", f"## Overhead: bench/est_overhead.py --device {report['device']}", ""]
        lines += overhead_lines(results["overhead"]["data"])
        if results["overhead"]["error"]:
            lines += ["", f"error: {results['overhead']['error']} (see logs.tar.gz)"]
    if "memory" in results:
        lines += ["", "## Memory: k ESTs in one process vs k plain processes", ""]
        lines += memory_lines(results["memory"]["data"])
        if results["memory"]["error"]:
            lines += ["", f"error: {results['memory']['error']} (see logs.tar.gz)"]
    if "multiplex" in results:
        lines += ["", "## Multiplexing: bench/multiplex.py --cuda (paper: < 18%, 1.2-2.3x)", ""]
        lines += multiplex_lines(results["multiplex"]["data"])
        if results["multiplex"]["error"]:
            lines += ["", f"error: {results['multiplex']['error']}"]
    if "inplace" in results:
        lines += ["", "## In place: bench/rescale_inplace.py --device cuda (target < 0.5 s)", ""]
        lines += inplace_lines(results["inplace"]["data"])
        if results["inplace"]["error"]:
            lines += ["", f"error: {results['inplace']['error']}"]
    not_run = [part for part in report["parts"] if part not in results]
    if not_run and not report.get("error"):
        lines += ["", f"not run (deadline): {', '.join(not_run)}"]
    return "\n".join(lines) + "\n"


def pack_logs(workdir: Path, archive: Path) -> None:
    """Everything under `workdir` but checkpoints, as one gzipped tar."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(workdir.rglob("*")):
            if path.is_file() and not path.is_symlink() and path.suffix != ".pt":
                tar.add(path, arcname=str(path.relative_to(workdir)))


def finish(outdir: Path, workdir: Path, report: dict[str, Any]) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "summary.json").write_text(json.dumps(report, indent=1))
    (outdir / "summary.md").write_text(render(report))
    logs = workdir / "logs"
    if logs.exists():
        pack_logs(logs, outdir / "logs.tar.gz")
    print(render(report), flush=True)


# -- main --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    deadline = Deadline(args.deadline, started)
    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    logs = args.workdir / "logs"
    logs.mkdir(parents=True)
    env = dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
    report: dict[str, Any] = {"parts": args.parts, "device": args.device, "results": {}}
    report["seconds"] = 0.0

    def end(code: int, verdict_text: str, error: str = "") -> int:
        report.update(verdict=verdict_text, error=error)
        report["seconds"] = time.monotonic() - started
        finish(args.outdir, args.workdir, report)
        if error:
            print(f"error: {error}", file=sys.stderr)
        return code

    unimportable = missing(args.python, ["gearshift.worker"], env).get("gearshift.worker", "")
    if "No module named 'gearshift'" in unimportable:
        path = import_path(REPO, args.workdir / "path")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    info = cuda_info(args.python, env)
    report["environment"] = info | {"nvidia_smi": nvidia_smi()}
    if not info.get("available") and args.device == "cuda":
        shown = env.get("CUDA_VISIBLE_DEVICES", "unset")
        why = info.get("error") or f"torch {info.get('torch')} sees none"
        return end(
            EXIT_UNUSABLE,
            "not run",
            f"no CUDA device ({why}; CUDA_VISIBLE_DEVICES={shown}): the GPU checks need one",
        )
    bad = missing(args.python, NEEDED, env)
    if bad:
        return end(
            EXIT_UNUSABLE,
            "not run",
            f"cannot import {bad}: carry the missing wheels (bench/gpu_wheels.sh, then name "
            ".gearshift/gpu-wheels in the device command's carry)",
        )
    ctx = Context(args, env, deadline, logs)
    runners: dict[str, Callable[[Context], dict[str, Any]]] = {
        "tests": part_tests,
        "bitwise": part_bitwise,
        "d2": part_d2,
        "overhead": functools.partial(part_overhead, figures=["1", "2"], name="overhead"),
        "memory": functools.partial(part_overhead, figures=["3"], name="memory"),
        "multiplex": part_multiplex,
        "inplace": part_inplace,
    }
    for part in args.parts:
        if deadline.left() < MIN_PART_S:
            break
        print(f"[gpu_checks] {part} ({deadline.left():.0f}s left)", flush=True)
        report["results"][part] = runners[part](ctx)
    results = report["results"]
    failed = [part for part, result in results.items() if not result["ok"]]
    not_run = [part for part in args.parts if part not in results]
    if failed or not_run:
        text = "; ".join(
            [f"failed: {', '.join(failed)}"] * bool(failed)
            + [f"not run: {', '.join(not_run)}"] * bool(not_run)
        )
        return end(EXIT_FAILED, text)
    return end(0, "all passed")


if __name__ == "__main__":
    sys.exit(main())
