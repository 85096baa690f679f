"""cvxpy, loaded on first use: `from gearshift.scheduler.plugins.gavel.policies.cvx import cp`.

Its import (about 2 s of CPU, scipy.stats among it) was most of a scheduler daemon's
start, and a daemon whose policy solves no program (easyscale, rubick, the FIFO queue)
never needs it; the tests start such daemons by the hundred."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["cp", "load_cvxpy"]


def lazy_module(name: str) -> ModuleType:
    """The module `name`, its code run on the first attribute read (or now, if loaded)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_cvxpy() -> None:
    """Run cvxpy's code now if it has not run yet (any attribute read does)."""
    _ = cp.__version__


if TYPE_CHECKING:
    import cvxpy as cp
else:
    cp = lazy_module("cvxpy")
