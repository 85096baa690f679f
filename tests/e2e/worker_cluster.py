"""Test data and helpers of the worker end-to-end and chaos tests.

The cluster is `gearshift up`'s DevCluster (client/devcluster.py) on the test's
PostgreSQL database and Redis, with 1-3 worker daemons offering CPU slots and the
short intervals below. The reference a job through the cluster must match is the
same JobSpec run directly by `python -m gearshift.worker.run --spec` on a fixed
number of processes; it is computed once per test session and shared by the xdist
workers through a file lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from gearshift.client.devcluster import ClusterConfig, ClusterTls, DevCluster
from gearshift.client.sdk import Client
from gearshift.common.channel import connect
from gearshift.common.config import merged
from gearshift.common.ports import free_port_in
from gearshift.v1 import common_pb2, scheduler_pb2, worker_pb2, worker_pb2_grpc
from tests.helpers import live_pids, single_seed

CNN = "gearshift.examples.digits_cnn"
CONFIG = '{"lr": 0.05}'
ESTS = 4
BATCH = 16
SEED = 7
SIZE = 512  # 128 samples per EST per epoch: 32 steps an epoch
SHARD = 16
CHECKPOINT_EVERY = 10
WORKERS = (("w1", "cpu:2"), ("w2", "cpu:2"))
READY_TIMEOUT = 90.0

C = common_pb2
S = scheduler_pb2


def digits_spec(name: str, steps: int, *, ests: int = ESTS, min_devices: int = 1) -> C.JobSpec:
    """The digits CNN job of these tests (every e2e test compares against one reference)."""
    return C.JobSpec(
        name=name,
        entrypoint=C.Entrypoint(module=CNN, config_json=CONFIG),
        num_ests=ests,
        global_batch_size=BATCH // ESTS * ests,
        total_steps=steps,
        dataset=C.DatasetSpec(name="digits", size=SIZE, shard_size=SHARD, seed=SEED),
        elastic=C.ElasticBounds(min_devices=min_devices, max_devices=ests),
        checkpoint_every_steps=CHECKPOINT_EVERY,
    )


def reference_command(
    directory: Path,
    steps: int,
    *,
    ests: int = ESTS,
    determinism: str = "D1",
    spec: C.JobSpec | None = None,
) -> list[str]:
    """`python -m gearshift.worker.run --spec` of the tests' job (or `spec`) on a fixed N
    processes."""
    if spec is None:
        spec = digits_spec("reference", steps, ests=ests)
    spec.determinism = C.DeterminismLevel.Value(f"DETERMINISM_LEVEL_{determinism}")
    spec_file = directory / "spec.json"
    spec_file.write_text(json_format.MessageToJson(spec))
    return [
        sys.executable, "-m", "gearshift.worker.run", "--spec", str(spec_file),
        "--procs", str(ests), "--checkpoint-dir", str(directory / "ckpt"),
        "--loss-log", str(directory / "losses.jsonl"), "--log-every", "1000",
    ]  # fmt: skip


@dataclass(frozen=True)
class Reference:
    digest: str
    losses: dict[int, list[str]]  # step -> every EST's loss bits


def shared_dir(tmp_path_factory: Any) -> Path:
    """The folder the xdist workers of one session share for the references
    (pytest.TempPathFactory; `reference` locks it)."""
    base: Path = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / (
        "gearshift-worker-reference"
    )


def reference(
    shared_dir: Path,
    steps: int,
    *,
    ests: int = ESTS,
    determinism: str = "D1",
    spec: C.JobSpec | None = None,
) -> Reference:
    """The fixed-placement run's digest and losses (of the digits job, or of `spec` with
    `ests` ESTs and `steps` steps), computed once per session (file lock)."""
    name = f"reference-{steps}" + (
        "" if (ests, determinism) == (ESTS, "D1") else f"-{ests}-{determinism}"
    )
    if spec is not None:
        name += "-" + spec.entrypoint.module.replace(".", "_")
    directory = shared_dir / name
    result = directory / "result.json"
    shared_dir.mkdir(parents=True, exist_ok=True)
    with (shared_dir / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            directory.mkdir(parents=True, exist_ok=True)
            run = subprocess.run(
                reference_command(directory, steps, ests=ests, determinism=determinism, spec=spec),
                check=False,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert run.returncode == 0, run.stdout + run.stderr
            digest = re.findall(r"^digest sha256:([0-9a-f]{64})$", run.stdout, re.MULTILINE)[-1]
            losses = step_log(directory / "losses.jsonl")
            result.write_text(json.dumps({"digest": digest, "losses": losses}))
    data = json.loads(result.read_text())
    return Reference(data["digest"], {int(k): v for k, v in data["losses"].items()})


def step_log(path: Path) -> dict[int, list[str]]:
    """step -> loss bits from a loss log; a step run twice must have the same bits."""
    by_step: dict[int, list[str]] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by a SIGKILL mid-write
            continue
        step, bits = int(record["step"]), list(record["loss_bits"])
        assert by_step.setdefault(step, bits) == bits, f"step {step} ran twice with other losses"
        by_step[step] = bits
    return by_step


def step_sequence(path: Path) -> list[int]:
    """Every step in the order rank 0 of each placement ran it (repeats after restarts)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            continue
    return out


def rendezvous_base() -> int:
    """This test's own range of the scheduler's 100 rendezvous ports (parallel tests should
    not share one: a port taken by another test costs a job a restart)."""
    return free_port_in(30000, 32700) // 100 * 100


# An elastic objective recomputed at every round after a change, solved in the round: what
# the tests of one objective were written against (the default waits 30 s between
# recomputations, solved on a thread).
GAVEL_TIMING = {"minRecomputeSeconds": 0, "recomputeInBackground": False}


def e2e_cluster(
    root: Path,
    database: str,
    redis_url: str,
    *,
    workers: Sequence[tuple[str, str]] = WORKERS,
    flags: Mapping[str, Sequence[str]] | None = None,
    scheduler: Mapping[str, Any] | None = None,
    tls: ClusterTls | None = None,
) -> DevCluster:
    """The DevCluster of one test (not started): both services on the test's database,
    short rounds and heartbeats, its own rendezvous ports; `flags` as ClusterConfig's, and
    `scheduler` laid over EasyScale's allocator alone (tests.helpers.single_seed; the
    scheduler file's keys)."""
    own = {
        "cluster": {"rendezvousPortBase": rendezvous_base()},
        "limits": {"stopTimeoutSeconds": 30},
    }
    config = ClusterConfig(
        run_dir=root / "cluster", base_port=0, workers=workers, postgres_url=database,
        redis_url=redis_url, round_seconds=1.0, heartbeat_interval=0.5,
        heartbeat_timeout=5.0, report_interval=0.5, log_level="info", metrics=False, tls=tls,
        flags=flags or {}, scheduler=merged(merged(single_seed(), own), scheduler or {}),
    )  # fmt: skip
    return DevCluster(config)


def started(cluster: DevCluster, workers: Sequence[tuple[str, str]] | None = None) -> DevCluster:
    """Start the cluster (with these workers instead of its config's, when given)."""
    if workers is not None:
        cluster.config.workers = workers
    cluster.start(READY_TIMEOUT)
    return cluster


def client_of(cluster: DevCluster, token: str = "") -> Client:
    """The scheduler's client, as a user of this cluster would have it."""
    return Client(cluster.address("scheduler"), token or None, tls=cluster.client_tls, timeout=10)


def worker_tasks(cluster: DevCluster, worker_id: str) -> list[C.TaskStatus]:
    """What a worker daemon itself says it runs."""
    with connect(cluster.address(worker_id), tls=cluster.client_tls) as channel:
        stub = worker_pb2_grpc.WorkerAgentStub(channel)
        return list(stub.DescribeWorker(worker_pb2.DescribeWorkerRequest()).tasks)


def running_on(job: S.Job) -> dict[str, int]:
    """worker id -> processes of the job there."""
    out: dict[str, int] = {}
    for process in job.placement.processes:
        out[process.worker_id] = out.get(process.worker_id, 0) + 1
    return out


def training_processes(cluster: DevCluster, worker_id: str = "*", task_id: str = "*") -> list[int]:
    """Pids of a worker's training processes that still run (the daemon writes rank<R>.pid);
    `*` for every worker or task."""
    return live_pids(cluster.work_root.glob(f"{worker_id}/tasks/{task_id}/rank*.pid"))
