"""Build .typecheck/gearshift: the installed package layout as symlinks into the source folders.

mypy cannot follow setuptools' editable-install import hook, and our package
folders are mapped (services/brain -> gearshift.brain), so `make lint` points
mypy at this tree instead. It is rebuilt on every run and never committed.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".typecheck"


def build() -> Path:
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    top = TREE / "gearshift"
    top.mkdir(parents=True)
    for package, folder in mapping.items():
        source = ROOT / folder
        if package == "gearshift":
            for entry in source.iterdir():
                (top / entry.name).symlink_to(entry)
            continue
        (top / package.split(".", 1)[1]).symlink_to(source, target_is_directory=True)
    return TREE


if __name__ == "__main__":
    print(build())
