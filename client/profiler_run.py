"""Run one of the worker's profilers on a job file in a child Python, and read its output.

The client imports no service package (nor torch): the profilers run as
`python -m <module>` with the job's module, config, seed and code folder, and write a
file this reads back.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gearshift.client.spec import JobFile
from gearshift.common.errors import ValidationError


def run_profiler(
    module: str, job: JobFile, args: Sequence[str], *, flag: str, source: str, what: str
) -> str:
    """The text the profiler `module` wrote to its `--out` file. `flag` is the option a
    missing torch is blamed on, `source` the job file and `what` the run in a failure."""
    if importlib.util.find_spec("torch") is None:
        raise ValidationError(flag, "profiling needs torch: pip install 'gearshift[worker]'")
    spec = job.spec
    code_dir = [] if job.code is None else [
        "--code-dir", str(job.code if job.code.is_dir() else job.code.parent)
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gearshift-profile-") as folder:
        out = Path(folder) / "out.json"
        command = [
            sys.executable, "-m", module,
            "--job", spec.entrypoint.module,
            "--config", spec.entrypoint.config_json or "{}",
            "--seed", str(spec.dataset.seed),
            "--out", str(out),
            *args,
            *code_dir,
        ]  # fmt: skip
        code = subprocess.call(command)
        if code != 0:
            raise ValidationError(source, f"{what} failed (exit {code}); see above")
        return out.read_text()
