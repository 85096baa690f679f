"""The newcomer's pages run as written: every `sh` block of docs/getting-started.md and
docs/tour.md, in order, as one shell script per page, on a cluster that `gearshift up` starts.

A block is left out only under a `<!-- doc-test: skip (why) -->` line naming the test that
runs it instead. The tour's `gearshift up` block is run as a background process (on free
ports, with its own run folder: tests run side by side); the rest of its blocks run in a
folder of their own that holds the page's `train.py` block, pointed at that cluster by the
`export GEARSHIFT_SCHEDULER=...` line `gearshift up` prints.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SKIP = re.compile(r"<!-- doc-test: skip \((.+?)\) -->\s*$")
UP = "gearshift up"
UP_TIMEOUT = 180.0
SCRIPT_TIMEOUT = 300.0


@dataclass(frozen=True)
class Block:
    language: str
    title: str
    body: str
    skip: str  # why it is not run here; "" when it is


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        title = re.search(r'title="([^"]+)"', match.group(2))
        name = title.group(1) if title else ""
        found.append(Block(match.group(1), name, match.group(3), skip.group(1) if skip else ""))
    return found


def shell(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.language == "sh" and not b.skip]


def script(parts: list[Block]) -> str:
    """One bash script: a failing command fails the page, and each is echoed before it runs."""
    return "set -euo pipefail\nset -x\n" + "\n".join(b.body for b in parts)


def run(text: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", text], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=SCRIPT_TIMEOUT, check=False,
    )  # fmt: skip


def environment() -> dict[str, str]:
    """The user's shell after `. .venv/bin/activate`: this interpreter's folder first."""
    bin_dir = str(Path(sys.executable).parent)
    return os.environ | {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_every_block_is_run_or_says_which_test_runs_it() -> None:
    for name in ("getting-started.md", "tour.md"):
        page = REPO / "docs" / name
        found = blocks(page)
        assert any(b.language == "sh" and not b.skip for b in found), f"{name}: nothing runs"
        for block in found:
            assert block.language in ("sh", "python", "text"), f"{name}: {block.language!r}"
            if block.skip:
                assert re.search(r"tests/|CI|rewrite", block.skip), f"{name}: {block.skip}"


def commands(parts: list[Block]) -> set[str]:
    lines = (line.split("#")[0].strip() for b in parts for line in b.body.splitlines())
    return {" ".join(line.split()) for line in lines if line}


def test_the_readme_runs_only_commands_the_pages_run() -> None:
    """The README's blocks are copies of the tested pages' commands, so they cannot drift."""
    readme = commands([b for b in blocks(REPO / "README.md") if b.language == "sh"])
    pages = commands(shell(REPO / "docs" / "tour.md"))
    pages |= commands(
        [b for b in blocks(REPO / "docs" / "getting-started.md") if b.language == "sh"]
    )
    assert readme and readme <= pages, sorted(readme - pages)


def test_getting_started_runs_as_written(tmp_path: Path) -> None:
    result = run(script(shell(REPO / "docs" / "getting-started.md")), REPO, environment())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "usage: gearshift" in result.stdout


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`gearshift up` as the tour starts it, on free ports and a run folder of its own."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gearshift.client.cli", "up", "--base-port", "0",
         "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment(),
        start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    seen: list[str] = []
    scheduler = ""
    try:
        for line in process.stdout:  # ends when the process does; bounded by its own --timeout
            seen.append(line)
            found = re.search(r"export GEARSHIFT_SCHEDULER=(\S+)", line)
            scheduler = found.group(1) if found else scheduler
            if line.startswith("Press Ctrl-C"):
                break
        assert scheduler, "gearshift up printed no scheduler address:\n" + "".join(seen)
        yield process, scheduler
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # the tour's Ctrl-C
        try:
            process.wait(timeout=UP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow
def test_the_tour_runs_as_written(tmp_path: Path, up: tuple[subprocess.Popen[str], str]) -> None:
    page = REPO / "docs" / "tour.md"
    found = blocks(page)
    first, *rest = shell(page)
    assert first.body.split("#")[0].strip() == UP, f"the tour starts with {first.body!r}"
    assert not any(UP in b.body for b in rest), "one `gearshift up`, the first block"
    folder = tmp_path / "my-project"  # a folder of the user's, outside the repository
    folder.mkdir()
    for block in found:
        if block.title:
            (folder / block.title).write_text(block.body)
    assert (folder / "train.py").exists(), "the tour writes train.py"
    process, scheduler = up
    result = run(script(rest), folder, environment() | {"GEARSHIFT_SCHEDULER": scheduler})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert process.poll() is None, "gearshift up ended while the tour ran"
    shown = result.stdout
    assert re.search(r"digest\s+[0-9a-f]{64}", shown), shown[-2000:]  # gearshift job $BIG
    assert "plot written to big.png" in shown and (folder / "big.png").stat().st_size > 0
    assert re.search(r"^worker-\d\s", shown, re.MULTILINE), "gearshift cluster lists workers"
