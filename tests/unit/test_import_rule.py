"""The import rule holds for the repository, and the checker does catch a violation."""

from __future__ import annotations

from pathlib import Path

from tools.check_imports import check


def test_repository_follows_the_import_rule() -> None:
    violations = check()
    assert not violations, "\n".join(map(str, violations))


def test_checker_catches_cross_service_imports(tmp_path: Path) -> None:
    (tmp_path / "brain").mkdir()
    (tmp_path / "brain" / "__init__.py").write_text("")
    (tmp_path / "brain" / "x.py").write_text(
        "import gearshift.scheduler.plugins.gavel.policies\n"
        "from gearshift import worker\n"
        "from gearshift.common import errors\n"
        "from gearshift.v1 import brain_pb2\n"
        "from . import y\n"
        "from .. import client\n"
    )
    found = check(tmp_path, {"gearshift.brain": "brain"})
    assert sorted(v.imported for v in found) == [
        "gearshift.client",
        "gearshift.scheduler.plugins.gavel.policies",
        "gearshift.worker",
    ]
