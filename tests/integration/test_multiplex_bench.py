"""bench/multiplex.py at a tiny scale: it runs end to end on a real worker daemon, the
collocated jobs keep their digests, and every figure it reports is there."""

from __future__ import annotations

import json
from pathlib import Path

from bench.multiplex import main


def test_multiplex_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "multiplex.json"
    argv = ["--job", "gearshift.examples.mlp", "--fg-steps", "40", "--bg-steps", "20"]
    assert main([*argv, "--pause-seconds", "0.5", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["same_digests"] is True
    for key in ("loop", "priority"):
        run = figures[key]
        assert run["fg_slowdown"] > 0 and run["throughput_ratio"] > 0, run
        assert 0 <= run["bg_progress_when_fg_done"] <= 1, run
    assert figures["priority"]["pause_count"] == 0
