"""Packaging: every package is shipped, and the client-only install stays light."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "torch", "cvxpy", "sqlalchemy", "redis", "numpy", "scipy", "alembic",
    "matplotlib", "starlette", "uvicorn", "prometheus_client",
)  # fmt: skip
CLIENT_PROBE = f"""
import importlib.util, json, sys
import gearshift.client, gearshift.client.cli, gearshift.client.processes
from gearshift.client import Client
print(json.dumps({{
    "imported": [m for m in {HEAVY!r} if m in sys.modules],
    "installed": [m for m in {HEAVY!r} if importlib.util.find_spec(m) is not None],
}}))
"""


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_in_pyproject() -> None:
    setup = _pyproject()["tool"]["setuptools"]
    listed = set(setup["packages"])
    found: set[str] = set()
    for package, folder in setup["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([package, *rel.parts]))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_client_imports_no_heavy_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT_PROBE], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out)["imported"] == []


@pytest.mark.slow
def test_plain_pip_install_gives_a_light_working_client(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(ROOT)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    out = subprocess.run(
        [str(python), "-c", CLIENT_PROBE], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout
    result = json.loads(out)
    assert result == {"imported": [], "installed": []}
    help_text = subprocess.run(
        [str(env_dir / "bin" / "gearshift"), "--help"], check=True, capture_output=True, text=True
    ).stdout
    assert "up" in help_text
    # A CLI call that needs no server still works and says what it found.
    down = subprocess.run(
        [str(env_dir / "bin" / "gearshift"), "health", "127.0.0.1:1", "--timeout", "0.5"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert down.returncode == 1
    assert "UNREACHABLE" in down.stdout
