"""`gearshift run train.py ...`: a one-file job without a YAML file.

The file must define `build(config) -> gearshift.worker.runtime.Job`. The spec needs
the dataset's size (the shard manager splits indices 0..size-1); the client reads it
from `--data-size` or from a top-level `DATASET_SIZE = N` in the file, found without
importing the file (the client has no torch).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

from gearshift.client.spec import JobFile, job_from_dict
from gearshift.common.errors import ValidationError
from gearshift.common.facts import DEFAULT_DETERMINISM


@dataclass(frozen=True)
class RunOptions:
    file: Path
    ests: int
    steps: int
    data_size: int = 0  # 0: DATASET_SIZE from the file
    batch_size: int = 0  # 0: 8 per EST
    min_devices: int = 1
    max_devices: int = 0  # 0: one per EST
    name: str = ""
    config: str = "{}"
    determinism: str = DEFAULT_DETERMINISM
    types: tuple[str, ...] = ()
    seed: int = 0
    shard_size: int = 32


def declared_size(file: Path) -> int:
    """`DATASET_SIZE = N` at the top level of a Python file, or 0."""
    try:
        tree = ast.parse(file.read_text(), filename=str(file))
    except SyntaxError as exc:
        problem = f"is not valid Python: line {exc.lineno}: {exc.msg}"
        raise ValidationError(str(file), problem) from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DATASET_SIZE" for t in node.targets
        ):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                return value.value
            raise ValidationError(str(file), "DATASET_SIZE must be a plain integer")
    return 0


def run_job(options: RunOptions) -> JobFile:
    """The job `gearshift run` submits; ValidationError names the option at fault."""
    file = options.file
    if not file.is_file() or file.suffix != ".py":
        raise ValidationError("FILE", f"{file} is not a Python file")
    size = options.data_size or declared_size(file)
    if size <= 0:
        raise ValidationError(
            "--data-size",
            f"say how many samples the dataset of {file.name} has: --data-size N, or "
            "DATASET_SIZE = N at the top of the file",
        )
    try:
        config = json.loads(options.config)
    except ValueError as exc:
        raise ValidationError("--config", f"is not JSON: {exc}") from None
    data: dict[str, object] = {
        "name": options.name or file.stem.replace("_", "-"),
        "entrypoint": {"path": str(file.resolve()), "config": config},
        "num_ests": options.ests,
        "global_batch_size": options.batch_size or 8 * options.ests,
        "total_steps": options.steps,
        "dataset": {
            "name": file.stem,
            "size": size,
            "shard_size": options.shard_size,
            "seed": options.seed,
        },
        "determinism": options.determinism,
        "elastic": {
            "min_devices": options.min_devices,
            "max_devices": options.max_devices or options.ests,
        },
    }
    if options.types:
        data["accelerator_types"] = list(options.types)
    return job_from_dict(data, file.parent)
