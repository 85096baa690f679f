"""Bring your own model: a `train.py` written in a folder outside the repository, run with
`gearshift run` on the dev cluster (`gearshift up`'s DevCluster), read with `gearshift logs`.

- the first `gearshift run` uploads the file; a second of the same file uploads nothing;
- the two jobs (2 processes each) land on one worker and on two workers, and end with the
  same digest;
- `gearshift logs --follow` prints rank 0's step lines while the job runs, and exits 0
  when it ends;
- a script that fails at import fails its job at once, the import error in `gearshift job`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.client.devcluster import ClusterConfig, DevCluster, parse_workers
from gearshift.client.sdk import Client
from gearshift.v1 import common_pb2, scheduler_pb2
from tests.helpers import wait_until

C = common_pb2
S = scheduler_pb2
TOKEN = "own-code-token"
WAIT = 120.0
STEPS = "1500"  # long enough for the second job to be placed while the first runs
TRAIN_PY = textwrap.dedent(
    '''
    """A user's own model: a tiny two-layer net on a synthetic regression task."""

    import torch
    from torch import nn

    from gearshift.worker.runtime.job import Job

    DATASET_SIZE = 256


    class Points:
        def __init__(self) -> None:
            gen = torch.Generator().manual_seed(11)
            self.x = torch.randn(DATASET_SIZE, 6, generator=gen)
            self.y = self.x @ torch.randn(6, 1, generator=gen) + 0.1

        def __len__(self) -> int:
            return DATASET_SIZE

        def __getitem__(self, i: int):
            return self.x[i], self.y[i]


    def build(config):
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)))
        return Job(model=model, optimizer=opt, dataset=Points(), loss=nn.MSELoss())
    '''
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[DevCluster]:
    config = ClusterConfig(
        run_dir=tmp_path / "cluster", base_port=0, workers=parse_workers("cpu:2,cpu:1,cpu:1"),
        round_seconds=1.0, heartbeat_interval=0.5, heartbeat_timeout=5.0, token=TOKEN,
        log_level="warning",
    )  # fmt: skip
    with DevCluster(config) as started:
        yield started


def gearshift(cluster: DevCluster, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, from the folder of their code."""
    env = os.environ | {
        "GEARSHIFT_SCHEDULER": cluster.address("scheduler"),
        "GEARSHIFT_TOKEN": TOKEN,
    }
    return subprocess.run(
        [sys.executable, "-m", "gearshift.client.cli", *args],
        check=False, capture_output=True, text=True, cwd=cwd, env=env, timeout=WAIT,
    )  # fmt: skip


def test_own_code_runs_uploads_once_logs_live_and_keeps_its_bits(
    cluster: DevCluster, tmp_path: Path
) -> None:
    project = tmp_path / "my-project"  # outside the repository
    project.mkdir()
    (project / "train.py").write_text(TRAIN_PY)
    run = ("run", "train.py", "--ests", "2", "--steps", STEPS, "--min-devices", "2")

    first = gearshift(cluster, *run, cwd=project)
    assert first.returncode == 0, first.stderr
    assert "uploaded" in first.stderr and "nothing uploaded" not in first.stderr, first.stderr
    job_a = first.stdout.strip()
    with Client(cluster.address("scheduler"), TOKEN) as client:
        wait_until(lambda: client.get(job_a).progress.step >= 1, WAIT, "job A trains")
        follower = subprocess.Popen(
            [sys.executable, "-m", "gearshift.client.cli", "logs", job_a, "--follow",
             "--rank", "0", "--address", cluster.address("scheduler"), "--token", TOKEN],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        seen: list[str] = []
        live = threading.Event()

        def read() -> None:
            assert follower.stdout is not None
            for line in follower.stdout:
                seen.append(line)
                if live.is_set():  # no call once seen: the client closes before the stream ends
                    continue
                if "step " in line and client.get(job_a).state == C.JOB_STATE_RUNNING:
                    live.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert live.wait(WAIT), f"no step line while job A ran: {seen}"

        second = gearshift(cluster, *run, cwd=project)
        assert second.returncode == 0, second.stderr
        assert "nothing uploaded" in second.stderr, second.stderr
        job_b = second.stdout.strip()

        done = [client.wait(job, timeout=WAIT) for job in (job_a, job_b)]
        placements = [
            e.placement
            for job in (job_a, job_b)
            for e in client.events(job)
            if e.type in (S.JOB_EVENT_TYPE_STARTED, S.JOB_EVENT_TYPE_RESCALED)
        ]
    assert [j.state for j in done] == [C.JOB_STATE_SUCCEEDED] * 2, [j.message for j in done]
    assert all(len(p.processes) == 2 for p in placements), placements
    workers = {len({p.worker_id for p in placement.processes}) for placement in placements}
    assert workers == {1, 2}, placements  # its 2 processes ran on one worker and on two
    assert done[0].final_digest == done[1].final_digest != ""
    assert follower.wait(timeout=30) == 0, follower.stderr.read() if follower.stderr else ""
    reader.join(timeout=10)
    assert any(f"step {STEPS}/{STEPS}" in line for line in seen), seen[-5:]
    assert all(line.startswith("[rank 0] ") for line in seen)


def test_a_script_that_fails_at_import_fails_its_job_at_once(
    cluster: DevCluster, tmp_path: Path
) -> None:
    project = tmp_path / "broken"
    project.mkdir()
    (project / "train.py").write_text("import no_such_module_here\nDATASET_SIZE = 64\n")
    result = gearshift(cluster, "run", "train.py", "--ests", "1", "--steps", "5", "--wait",
                       cwd=project)  # fmt: skip
    assert result.returncode == 1, result.stderr
    job_id = result.stdout.split()[0]
    shown = gearshift(cluster, "job", job_id, cwd=project)
    assert "No module named 'no_such_module_here'" in shown.stdout, shown.stdout
    with Client(cluster.address("scheduler"), TOKEN) as client:
        job = client.get(job_id)
        kinds = [e.type for e in client.events(job_id)]
    assert job.state == C.JOB_STATE_FAILED, job.message
    assert kinds.count(S.JOB_EVENT_TYPE_STARTED) == 1, kinds  # not retried: bad input
