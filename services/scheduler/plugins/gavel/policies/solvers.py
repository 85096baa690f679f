"""Which installed solver solves which class of problem, in one place.

- LP: CLARABEL first. It is an interior-point method, like ECOS that Gavel's
  reference implementation uses: on the many max-min LPs whose optimum is not
  unique it returns a point inside the optimal face, spreading time over
  types instead of jumping to a vertex, which is what Gavel's mechanism was
  tuned against; it is also the fastest installed LP solver at 2,048 jobs
  (bench/policies.py). HiGHS is the fallback.
- LP over elastic configurations (lp_vertex): HiGHS first. Its simplex answers at a
  vertex, where few configurations of a job have a positive share, so the round
  mechanism moves jobs between configurations (each move a checkpoint and restart)
  less often than an interior point spread over the optimal face would make it.
- conic (inv_pos, SOC, exponential cones): CLARABEL, then SCS.
- MILP: HiGHS (branch and bound), then SCIPY (also HiGHS underneath).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from functools import cache
from typing import Any

from gearshift.scheduler.plugins.gavel.policies.base import PolicyError, ProblemClass
from gearshift.scheduler.plugins.gavel.policies.cvx import cp

log = logging.getLogger("gearshift.scheduler.policies")

ORDER: dict[ProblemClass, tuple[str, ...]] = {
    "lp": ("CLARABEL", "HIGHS", "SCS"),
    "lp_vertex": ("HIGHS", "CLARABEL", "SCS"),
    "conic": ("CLARABEL", "SCS"),
    "milp": ("HIGHS", "SCIPY"),
    "greedy": (),
}
_OK = {"optimal", "optimal_inaccurate"}  # cp.OPTIMAL, cp.OPTIMAL_INACCURATE


@cache
def _installed() -> frozenset[str]:
    # cvxpy probes every solver package on each call; once per process is enough.
    return frozenset(cp.installed_solvers())


@cache
def _quiet_highs() -> None:
    """HiGHS prints a banner on stdout the first time a solver object is made in a process,
    from C++: make that first one with the stdout file descriptor pointed at /dev/null, so
    no command's output (JSON included) ever carries it."""
    try:
        import highspy  # noqa: PLC0415 - only when HiGHS is about to be used
    except ImportError:
        return
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()  # type: ignore[no-untyped-call]
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def solvers_for(kind: ProblemClass) -> list[str]:
    """The installed solvers for a problem class, preferred first."""
    return [s for s in ORDER[kind] if s in _installed()]


def solve(problem: cp.Problem, kind: ProblemClass, *, what: str = "policy") -> str:
    """Solve with the first solver of the class that reports an optimum; returns its name.

    Raises PolicyError when the problem is infeasible or no solver succeeds,
    so callers never read a None variable value.
    """
    statuses: list[str] = []
    for name in solvers_for(kind):
        if name in ("HIGHS", "SCIPY"):
            _quiet_highs()
        options: dict[str, Any] = {}
        if name == "SCS":
            options = {"eps_abs": 1e-7, "eps_rel": 1e-7, "max_iters": 200_000}
        try:
            with warnings.catch_warnings():  # an inaccurate solution is logged, not printed
                warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                problem.solve(solver=name, **options)
        except cp.error.SolverError as exc:
            statuses.append(f"{name}: {exc}")
            log.debug("solver failed", extra={"solver": name, "what": what, "error": str(exc)})
            continue
        statuses.append(f"{name}: {problem.status}")
        if problem.status == cp.OPTIMAL_INACCURATE:
            log.info("inaccurate solution accepted", extra={"solver": name, "what": what})
        if problem.status in _OK:
            return name
        if problem.status in {cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE}:
            break
    raise PolicyError(f"{what}: no optimal solution ({'; '.join(statuses) or 'no solver'})")
