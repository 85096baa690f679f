"""Sia's own simulator (SOSP'23 artifact), run here as a subprocess: one JSON of figures per run.

    python bench/sia_artifact.py --artifact DIR --python /work/sia-venv/bin/python \\
        --policy sia|pollux|gavel --workload philly/workload-1 [--fixed-bsz] --out RESULTS_DIR
    python bench/sia_artifact.py --summary --out RESULTS_DIR    # the runs' table, pooled rows

The artifact has no licence: nothing of it is in this repository. DIR is a fetched copy (its
`sia-simulator/` folder, or the folder above it); its interpreter (--python) is a separate
environment with the artifact's requirements (docs/results/sia.md says how to make one).

Each run writes RESULTS_DIR/<policy>-<fixed|adaptive>-<workload, / as _>.json with the average and
p99 JCT, makespan, GPU-hours and restarts per job, every job's figures, the command, the wall time
and the date; the artifact's own log (one JSON line per round) is kept in RESULTS_DIR/raw/.
`load_results(RESULTS_DIR)` reads them back for bench/sia.py.

How the figures are counted, read from the artifact's simulator (job.py, cluster.py and its
utils/print_run_stats.py), so that they mean what the artifact means:
- JCT: completion minus submission time of each job, from the last round's record.
- p99: nearest rank (the sorted JCTs' ceil(0.99 n)-th), as `gearshift simulate` prints it.
- makespan: the last completion minus the first submission (print_run_stats.get_makespans).
- restarts: the job's `num_restarts` at the end. The artifact sets it to 0 at the first start and
  adds one at every later change of placement (resize within a GPU type, move to another type,
  resume after a preemption); a preemption itself adds nothing.
- GPU-seconds: as print_run_stats.get_gpu_hrs_stats counts them: every round record in which the
  job is not complete and holds an allocation charges its GPU count times the round length. The
  round the job completes in is charged whole, and the restart delay (checkpoint-restore) is
  charged as held GPUs.

Policies, with the artifact's published settings (its run_experiment.sh):
- sia: multi_simulator.py --policy=sia, p=-0.5, lambda_a=0.01, lambda_n=1.1, 60 s rounds,
  --project_throughputs --share_max_replicas; --fixed-bsz adds its --disable_bsz_tuning.
- gavel: multi_simulator.py --policy=gavel, 360 s rounds; the artifact always runs it at the
  workload's batch sizes, so it takes --fixed-bsz and refuses to run without it.
- pollux: multi_simulator_unaware.py --policy=pollux, p=-1, 60 s rounds. Its command line has no
  fixed-batch option; --fixed-bsz runs it through a small driver (below) that gives every job the
  workload's batch size and calls the artifact's own Job.disable_bsz_tuning(), the call its
  --disable_bsz_tuning makes for Sia's jobs.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

POLICIES = ("sia", "pollux", "gavel")

RESULT_KEYS = (
    "policy",
    "workload",
    "fixed_bsz",
    "n_jobs",
    "avg_jct_h",
    "p99_jct_h",
    "makespan_h",
    "gpu_hours_per_job",
    "restarts_per_job",
    "jobs",
    "command",
    "wall_s",
    "date",
)
JOB_KEYS = ("name", "submit_s", "jct_s", "gpu_seconds", "restarts")

SIA_ARGS = (
    "--policy=sia",
    "--policy_p_val=-0.5",
    "--mip_lambda_a=0.01",
    "--mip_lambda_n=1.1",
    "--interval=60",
    "--project_throughputs",
    "--share_max_replicas",
)
GAVEL_ARGS = ("--policy=gavel", "--interval=360")
POLLUX_ARGS = ("--policy=pollux", "--interval=60", "--policy_p_val=-1")

# Pollux at the workload's batch sizes: the artifact's ClusterUnaware builds Pollux's jobs without
# one; this subclass sets it and switches the job's batch-size tuning off, then runs the artifact's
# own entry point unchanged.
POLLUX_FIXED_DRIVER = """
import runpy, sys
import cluster_unaware
class FixedBatch(cluster_unaware.ClusterUnaware):
    def __init__(self, workload, *args, **kwargs):
        super().__init__(workload, *args, **kwargs)
        sizes = dict(zip(workload["name"], workload["batch_size"]))
        for job in self.jobs:
            job.target_batch_size = int(sizes[job.name])
            job.disable_bsz_tuning()
cluster_unaware.ClusterUnaware = FixedBatch
sys.argv = ["multi_simulator_unaware.py"] + sys.argv[1:]
runpy.run_path("multi_simulator_unaware.py", run_name="__main__")
"""


class ArtifactError(Exception):
    """The artifact's directory, run or output is not what this script can use."""


@dataclass(frozen=True)
class JobResult:
    name: str
    submit_s: float
    jct_s: float
    gpu_seconds: float
    restarts: int


def simulator_dir(artifact: Path) -> Path:
    """The folder holding multi_simulator.py: DIR itself or DIR/sia-simulator."""
    for candidate in (artifact, artifact / "sia-simulator"):
        if (candidate / "multi_simulator.py").is_file():
            return candidate
    raise ArtifactError(
        f"--artifact {artifact}: no multi_simulator.py in it or in its sia-simulator/"
    )


def result_stem(policy: str, workload: str, fixed_bsz: bool) -> str:
    """<policy>-<fixed|adaptive>-<workload with / replaced by _>."""
    return f"{policy}-{'fixed' if fixed_bsz else 'adaptive'}-{workload.replace('/', '_')}"


def simulator_command(
    python: str, policy: str, workload_csv: str, fixed_bsz: bool, log: Path
) -> list[str]:
    """The artifact's command line for one policy and workload (run from its simulator folder)."""
    output = f"--output={log}"
    if policy == "sia":
        extra = ["--disable_bsz_tuning"] if fixed_bsz else []
        return [python, "multi_simulator.py", workload_csv, *SIA_ARGS, *extra, output]
    if policy == "gavel":
        if not fixed_bsz:
            raise ArtifactError(
                "--policy gavel: the artifact runs Gavel at the workload's batch sizes only; "
                "pass --fixed-bsz"
            )
        return [python, "multi_simulator.py", workload_csv, *GAVEL_ARGS, output]
    if policy == "pollux":
        if fixed_bsz:
            return [python, "-c", POLLUX_FIXED_DRIVER, workload_csv, *POLLUX_ARGS, output]
        return [python, "multi_simulator_unaware.py", workload_csv, *POLLUX_ARGS, output]
    raise ArtifactError(f"--policy {policy!r}: choose one of {', '.join(POLICIES)}")


def read_rounds(log: IO[str]) -> list[dict[str, Any]]:
    """The artifact's output log: one JSON object per round ({"timestamp", "submitted_jobs"})."""
    rounds = []
    for number, line in enumerate(log, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ArtifactError(f"line {number}: not JSON ({error.msg})") from None
        if (
            not isinstance(record, dict)
            or "timestamp" not in record
            or "submitted_jobs" not in record
        ):
            raise ArtifactError(
                f"line {number}: a round record needs 'timestamp' and 'submitted_jobs'"
            )
        rounds.append(record)
    if not rounds:
        raise ArtifactError("the log has no round record")
    return rounds


def held_gpus(entry: dict[str, Any]) -> int:
    """GPUs a job holds in a round: the length of its allocation's GPU list (none when queued)."""
    allocation = entry.get("allocation") or []
    if len(allocation) != 2 or allocation[0] is None:
        return 0
    return len(allocation[1])


def job_results(rounds: list[dict[str, Any]]) -> list[JobResult]:
    """Per job: submission, JCT, GPU-seconds and restarts, counted as the artifact counts them."""
    if len(rounds) < 2:
        raise ArtifactError("the log needs at least two rounds to know the round length")
    interval = float(rounds[1]["timestamp"]) - float(rounds[0]["timestamp"])
    if interval <= 0:
        raise ArtifactError(
            f"round timestamps do not increase ({rounds[0]['timestamp']}, {rounds[1]['timestamp']})"
        )
    gpu_seconds: dict[str, float] = collections.defaultdict(float)
    for record in rounds:
        for entry in record["submitted_jobs"]:
            if entry["completion_time"] is None:
                gpu_seconds[entry["name"]] += held_gpus(entry) * interval
    jobs = []
    for entry in rounds[-1]["submitted_jobs"]:
        if entry["completion_time"] is None:
            raise ArtifactError(
                f"job {entry['name']} has not completed in the last round "
                f"(t={rounds[-1]['timestamp']})"
            )
        jobs.append(
            JobResult(
                name=str(entry["name"]),
                submit_s=float(entry["submission_time"]),
                jct_s=float(entry["completion_time"]) - float(entry["submission_time"]),
                gpu_seconds=gpu_seconds[entry["name"]],
                restarts=int(entry["num_restarts"] or 0),
            )
        )
    return jobs


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile (the same rank as `gearshift simulate`'s p99 JCT)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def summarize(jobs: list[JobResult], policy: str, workload: str, fixed_bsz: bool) -> dict[str, Any]:
    """The result's figures (all keys but command, wall_s and date)."""
    if not jobs:
        raise ArtifactError("no job in the log")
    n = len(jobs)
    jcts = [job.jct_s for job in jobs]
    makespan = max(job.submit_s + job.jct_s for job in jobs) - min(job.submit_s for job in jobs)
    return {
        "policy": policy,
        "workload": workload,
        "fixed_bsz": fixed_bsz,
        "n_jobs": n,
        "avg_jct_h": sum(jcts) / n / 3600,
        "p99_jct_h": p99(jcts) / 3600,
        "makespan_h": makespan / 3600,
        "gpu_hours_per_job": sum(job.gpu_seconds for job in jobs) / n / 3600,
        "restarts_per_job": sum(job.restarts for job in jobs) / n,
        "jobs": [vars(job) for job in jobs],
    }


def workload_names(csv_path: Path) -> list[str]:
    """Job names of an artifact workload file (name,time,application,num_replicas,batch_size)."""
    lines = csv_path.read_text().splitlines()
    if not lines or lines[0].split(",")[0] != "name":
        raise ArtifactError(
            f"{csv_path}: not an artifact workload (its header must start with 'name')"
        )
    return [line.split(",")[0] for line in lines[1:] if line.strip()]


def check_complete(jobs: list[JobResult], expected: list[str]) -> None:
    """Every job of the workload, and only those, appears in the log."""
    got = {job.name for job in jobs}
    if got != set(expected):
        missing, extra = sorted(set(expected) - got), sorted(got - set(expected))
        raise ArtifactError(
            f"the log's jobs differ from the workload's: missing {missing[:5]}, "
            f"unexpected {extra[:5]}"
        )


def run_simulator(command: list[str], cwd: Path, nice: int, timeout_s: float, label: str) -> float:
    """Run the artifact under nice with a timeout, progress to stderr; its wall seconds.

    Its stdout (a table per round, the solver's chatter: tens of MB) is read and dropped, but
    for the last lines, shown if it fails."""
    start = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    last_report = start
    with subprocess.Popen(
        ["nice", "-n", str(nice), *command],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    ) as process:
        assert process.stdout is not None
        watchdog = threading.Timer(timeout_s, os.killpg, (process.pid, signal.SIGKILL))
        watchdog.start()
        try:
            for line in process.stdout:
                tail.append(line.rstrip())
                now = time.monotonic()
                if "SIMULATOR TIME" in line and now - last_report >= 30:
                    simulated = line.replace("-", " ").split("TIME:")[-1].strip()
                    print(
                        f"[{label}] {now - start:6.0f} s wall, simulated t={simulated} s",
                        file=sys.stderr,
                        flush=True,
                    )
                    last_report = now
            code = process.wait()
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            raise
        finally:
            watchdog.cancel()
    wall = time.monotonic() - start
    if wall >= timeout_s:
        raise ArtifactError(f"{label}: killed after --timeout {timeout_s:.0f} s")
    if code != 0:
        raise ArtifactError(
            f"{label}: the artifact exited with {code}; its last lines:\n" + "\n".join(tail)
        )
    return wall


def load_results(results_dir: str | Path) -> list[dict[str, Any]]:
    """Every result JSON of RESULTS_DIR (not raw/), checked for the expected keys, by file name."""
    results = []
    for path in sorted(Path(results_dir).glob("*.json")):
        result = json.loads(path.read_text())
        if not isinstance(result, dict) or set(result) != set(RESULT_KEYS):
            raise ArtifactError(
                f"{path}: not a sia_artifact result (keys must be {', '.join(RESULT_KEYS)})"
            )
        results.append(result)
    return results


def pool(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over several runs (workloads) of one policy and mode: JCT, p99, GPU-hours and
    restarts over all their jobs; the makespan is the runs' mean, as print_run_stats gives it."""
    if not results:
        raise ArtifactError("nothing to pool")
    jobs = [job for result in results for job in result["jobs"]]
    n = len(jobs)
    return {
        "runs": len(results),
        "n_jobs": n,
        "avg_jct_h": sum(job["jct_s"] for job in jobs) / n / 3600,
        "p99_jct_h": p99([job["jct_s"] for job in jobs]) / 3600,
        "makespan_h": sum(result["makespan_h"] for result in results) / len(results),
        "gpu_hours_per_job": sum(job["gpu_seconds"] for job in jobs) / n / 3600,
        "restarts_per_job": sum(job["restarts"] for job in jobs) / n,
    }


def summary_table(results: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per run, then one pooled row per policy and batch-size mode."""
    lines = [
        "| policy | batch size | workload | avg JCT (h) | p99 JCT (h) | makespan (h) "
        "| GPU-h/job | restarts/job | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def row(result: dict[str, Any], workload: str, wall: str) -> str:
        return (
            f"| {result['policy']} | {'fixed' if result['fixed_bsz'] else 'adaptive'} "
            f"| {workload} | {result['avg_jct_h']:.3f} | {result['p99_jct_h']:.2f} "
            f"| {result['makespan_h']:.2f} | {result['gpu_hours_per_job']:.2f} "
            f"| {result['restarts_per_job']:.2f} | {wall} |"
        )

    groups: dict[tuple[str, bool], list[dict[str, Any]]] = collections.defaultdict(list)
    for result in sorted(results, key=lambda r: (r["policy"], not r["fixed_bsz"], r["workload"])):
        groups[(result["policy"], result["fixed_bsz"])].append(result)
        lines.append(row(result, result["workload"], f"{result['wall_s']:.0f}"))
    for (policy, fixed), members in groups.items():
        pooled = pool(members) | {"policy": policy, "fixed_bsz": fixed}
        names = ", ".join(m["workload"].rsplit("-", 1)[-1] for m in members)
        lines.append(row(pooled, f"**pooled ({names})**", "-"))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--artifact", type=Path, help="the artifact's sia-simulator/ (or its parent)"
    )
    parser.add_argument("--python", help="interpreter with the artifact's requirements")
    parser.add_argument("--policy", choices=POLICIES)
    parser.add_argument(
        "--workload",
        help="under the artifact's workloads/, no .csv: philly/workload-1",
    )
    parser.add_argument(
        "--fixed-bsz", action="store_true", help="hold every job at its workload batch size"
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="results folder (one JSON per run, raw logs in raw/)",
    )
    parser.add_argument(
        "--timeout", type=float, default=5400.0, help="seconds before the run is killed"
    )
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument(
        "--summary", action="store_true", help="print --out's results as a table; run nothing"
    )
    args = parser.parse_args(argv)
    if not args.summary:
        missing = [f"--{name}" for name in ("artifact", "python", "policy", "workload")]
        missing = [flag for flag in missing if getattr(args, flag[2:]) is None]
        if missing:
            parser.error(f"a run needs {', '.join(missing)} (or --summary)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summary:
        try:
            print(summary_table(load_results(args.out)))
        except (ArtifactError, OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    try:
        sim_dir = simulator_dir(args.artifact)
        workload_csv = f"workloads/{args.workload}.csv"
        if not (sim_dir / workload_csv).is_file():
            raise ArtifactError(f"--workload {args.workload}: no {sim_dir / workload_csv}")
        expected = workload_names(sim_dir / workload_csv)
        stem = result_stem(args.policy, args.workload, args.fixed_bsz)
        raw = (args.out / "raw").resolve()
        log = raw / f"{stem}.log"
        command = simulator_command(args.python, args.policy, workload_csv, args.fixed_bsz, log)
        raw.mkdir(parents=True, exist_ok=True)
        date = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"[{stem}] cd {sim_dir} && {shlex.join(command)}", file=sys.stderr, flush=True)
        wall = run_simulator(command, sim_dir, args.nice, args.timeout, stem)
        with log.open() as handle:
            jobs = job_results(read_rounds(handle))
        check_complete(jobs, expected)
    except (ArtifactError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = summarize(jobs, args.policy, args.workload, args.fixed_bsz)
    result |= {
        "command": f"cd {sim_dir} && {shlex.join(command)}",
        "wall_s": round(wall, 1),
        "date": date,
    }
    target = args.out / f"{stem}.json"
    target.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"[{stem}] {len(jobs)} jobs: avg JCT {result['avg_jct_h']:.3f} h, "
        f"p99 {result['p99_jct_h']:.2f} h, "
        f"makespan {result['makespan_h']:.2f} h, {result['gpu_hours_per_job']:.2f} GPU-h/job, "
        f"{result['restarts_per_job']:.2f} restarts/job, wall {wall:.0f} s -> {target}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
