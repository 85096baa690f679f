"""cvxpy is loaded by the first policy that builds a program, not by a scheduler's start."""

from __future__ import annotations

import subprocess
import sys

import cvxpy

from gearshift.scheduler.policies import solvers


def test_a_scheduler_starts_without_loading_cvxpy() -> None:
    probe = (
        "import sys, gearshift.scheduler.daemon as d, gearshift.scheduler.policies as p;"
        "print(sorted(m for m in sys.modules if m.startswith('cvxpy.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", f"imported at a scheduler's start: {out.stdout[:300]}"


def test_the_solved_statuses_are_cvxpy_s() -> None:
    assert {cvxpy.OPTIMAL, cvxpy.OPTIMAL_INACCURATE} == solvers._OK
