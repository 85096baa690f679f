"""The import rule holds for the repository, and the checker does catch a violation."""

from __future__ import annotations

from pathlib import Path

from tools.check_imports import check, check_rooms


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


def test_scheduler_follows_the_room_rules() -> None:
    violations = check_rooms()
    assert not violations, "\n".join(map(str, violations))


def _rooms(tmp_path: Path, files: dict[str, str]) -> Path:
    """A scheduler tree with the rooms, plus `files` (path -> source)."""
    base = tmp_path / "sched"
    for package in ("", "round", "state", "plugins", "plugins/gavel", "plugins/rubick"):
        (base / package).mkdir(parents=True, exist_ok=True)
        (base / package / "__init__.py").write_text("")
    (base / "types.py").write_text("from gearshift.common import errors\n")
    for path, source in files.items():
        (base / path).write_text(source)
    return tmp_path


def _rules(tmp_path: Path, files: dict[str, str]) -> list[str]:
    root = _rooms(tmp_path, files)
    found = check_rooms(root, "gearshift.scheduler", "sched")
    return sorted(f"{v.rule.split(':')[0]} {v.importer} {v.imported}" for v in found)


def test_rooms_rule_1_catches_a_cycle_even_under_type_checking(tmp_path: Path) -> None:
    files = {
        "state/a.py": "from gearshift.scheduler.state.b import B\n",
        "state/b.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from gearshift.scheduler.state.a import A\n"
        ),
    }
    assert _rules(tmp_path, files) == [
        "rule 1 gearshift.scheduler.state.a "
        "gearshift.scheduler.state.a -> gearshift.scheduler.state.b"
    ]


def test_rooms_rule_2_keeps_the_bottom_module_alone(tmp_path: Path) -> None:
    files = {"types.py": "def f() -> None:\n    from gearshift.scheduler.round import x\n"}
    files["round/x.py"] = ""
    assert _rules(tmp_path, files) == [
        "rule 2 gearshift.scheduler.types gearshift.scheduler.round.x"
    ]


def test_rooms_rule_3_keeps_plugins_apart(tmp_path: Path) -> None:
    files = {
        "plugins/gavel/g.py": "from gearshift.scheduler.types import *\n",
        "plugins/rubick/r.py": (
            "from gearshift.scheduler.plugins.gavel import g\n"  # another seed
            "from gearshift.scheduler.plugins.rubick import s\n"  # its own seed: fine
            "from gearshift.scheduler.plugins import registry\n"  # the registry: no
            "from gearshift.scheduler.round import p\n"  # the round's helpers: fine
        ),
        "plugins/rubick/s.py": "",
        "plugins/registry.py": "",
        "round/p.py": "",
    }
    assert _rules(tmp_path, files) == [
        "rule 3 gearshift.scheduler.plugins.rubick.r gearshift.scheduler.plugins.gavel.g",
        "rule 3 gearshift.scheduler.plugins.rubick.r gearshift.scheduler.plugins.registry",
    ]


def test_rooms_rule_4_keeps_plugins_out_of_the_round_and_the_state(tmp_path: Path) -> None:
    files = {
        "round/rounds.py": (
            "import gearshift.scheduler.plugins.gavel.g\n"
            "from gearshift.scheduler.plugins.rubick.r import R\n"
            "from gearshift.scheduler.plugins import registry\n"  # the registry: no either
            "from gearshift.scheduler.round import hooks\n"  # the round's own: fine
        ),
        "round/hooks.py": "from gearshift.scheduler.state import s\n",  # the state: fine
        "state/s.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from gearshift.scheduler.plugins.gavel.g import G\n"
        ),
        "plugins/gavel/g.py": "",
        "plugins/rubick/r.py": "from gearshift.scheduler.round import hooks\n",  # fine
        "plugins/registry.py": "",
    }
    assert _rules(tmp_path, files) == [
        "rule 4 gearshift.scheduler.round.rounds gearshift.scheduler.plugins.gavel.g",
        "rule 4 gearshift.scheduler.round.rounds gearshift.scheduler.plugins.registry",
        "rule 4 gearshift.scheduler.round.rounds gearshift.scheduler.plugins.rubick.r",
        "rule 4 gearshift.scheduler.state.s gearshift.scheduler.plugins.gavel.g",
    ]
