"""cvxpy is loaded by the first policy that builds a program, not by a scheduler's start."""

from __future__ import annotations

import subprocess
import sys

import cvxpy

from gearshift.scheduler.plugins.gavel.policies import solvers


def test_a_scheduler_starts_without_loading_cvxpy_and_an_lp_policy_loads_it() -> None:
    probe = (
        "import sys, gearshift.scheduler.daemon;"
        "from gearshift.scheduler.plugins.allocators import make_allocator;"
        "from gearshift.scheduler.plugins.gavel.policies import make_policy;"
        "loaded = lambda: sorted(m for m in sys.modules if m.startswith('cvxpy.'));"
        "make_allocator('easyscale'); make_allocator('fifo'); print(loaded());"
        "make_policy('las'); print(len(loaded()) > 0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    greedy, lp = out.stdout.splitlines()
    assert greedy == "[]", f"loaded by a greedy policy's scheduler: {greedy[:300]}"
    assert lp == "True"  # in the thread that makes the policy, not on a first use elsewhere


def test_the_solved_statuses_are_cvxpy_s() -> None:
    assert {cvxpy.OPTIMAL, cvxpy.OPTIMAL_INACCURATE} == solvers._OK
