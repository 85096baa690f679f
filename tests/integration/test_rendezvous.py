"""A placement's processes meet under its name (JOB.gGENERATION). A process of another job,
or of an earlier placement of the same job still running, that reaches the same port must
not join, or its ESTs' data would land in our steps: the chaos soak saw both (two worker
daemons on one host were handed one port; a placement thought gone still ran). It waits
for its own peers and gives up; the job ends with the digest it has alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gearshift.common.ports import free_port_in

COMMON = [
    *("--job", "gearshift.examples.mlp", "--config", '{"lr": 0.1}'),
    *("--ests", "2", "--steps", "12", "--batch-size", "8"),
    *("--shard-size", "16", "--data-size", "256", "--seed", "3"),
    *("--mapping", "1,1", "--world-size", "2"),
]


def rank(
    number: int, master: str, group: str, folder: Path, timeout: float = 60.0
) -> subprocess.Popen[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "gearshift.worker.run", *COMMON,
         "--rank", str(number), "--master-addr", master, "--job-id", "job-a",
         "--rendezvous-group", group,
         "--timeout", str(timeout), "--checkpoint-dir", str(folder / "ckpt")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def digest(process: subprocess.Popen[str]) -> str:
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    return str(re.findall(r"^digest sha256:([0-9a-f]{64})$", out, re.MULTILINE)[-1])


@pytest.mark.parametrize(
    "stranger_group",
    ["job-b.g1", "job-a.g1"],  # another job; an earlier placement of this job still running
)
def test_a_process_of_another_placement_does_not_join_the_group(
    tmp_path: Path, stranger_group: str
) -> None:
    alone = f"127.0.0.1:{free_port_in(20000, 30000)}"
    zero, one = (rank(r, alone, "job-a.g2", tmp_path / "alone" / str(r)) for r in (0, 1))
    expected = digest(zero)
    assert one.wait(120) == 0

    master = f"127.0.0.1:{free_port_in(20000, 30000)}"
    stranger = rank(1, master, stranger_group, tmp_path / "stranger", timeout=8.0)
    zero = rank(0, master, "job-a.g2", tmp_path / "a0")
    try:
        one = rank(1, master, "job-a.g2", tmp_path / "a1")
        assert digest(zero) == expected, "the job's steps are its own"
        assert one.wait(120) == 0
        out, _ = stranger.communicate(timeout=120)
        assert stranger.returncode != 0, f"the stranger must not have trained:\n{out}"
    finally:
        for process in (stranger, zero):
            if process.poll() is None:
                process.kill()
