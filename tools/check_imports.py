"""The import rule: a service package never imports another service package.

Only gearshift.v1 (the contracts) and gearshift.common are shared. The client
imports no service either. Run by `make lint` and by tests/unit/test_import_rule.py.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# gearshift.migrations is the Alembic history (scripts run by gearshift.common.db), not a service.
SHARED = {"gearshift", "gearshift.v1", "gearshift.common", "gearshift.migrations"}
# Checked package -> its folder. Each may import only itself and SHARED.
CHECKED: dict[str, str] = {
    "gearshift.brain": "services/brain",
    "gearshift.scheduler": "services/scheduler",
    "gearshift.shardmanager": "services/shardmanager",
    "gearshift.worker": "services/worker",
    "gearshift.client": "client",
    "gearshift.common": "services/common",
}


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    importer: str
    imported: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.importer} imports {self.imported} "
            f"(services share only gearshift.v1 and gearshift.common)"
        )


def _module_name(package: str, folder: Path, path: Path) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from gearshift import brain`
                yield node.lineno, f"{target}.{alias.name}"


def _allowed(importer_pkg: str, imported: str) -> bool:
    if not imported.startswith("gearshift"):
        return True
    if imported == "gearshift" or imported.startswith("gearshift.__"):
        return True
    top = ".".join(imported.split(".")[:2])
    return top == importer_pkg or top in SHARED or top == "gearshift.__version__"


def check(root: Path = ROOT, checked: dict[str, str] | None = None) -> list[Violation]:
    """Every import in a checked package that breaks the rule."""
    found: list[Violation] = []
    for package, rel in (checked or CHECKED).items():
        folder = root / rel
        for path in sorted(folder.rglob("*.py")):
            module = _module_name(package, folder, path)
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, imported in _imports(tree, module, path.name == "__init__.py"):
                if not _allowed(package, imported):
                    found.append(Violation(path.relative_to(root), line, module, imported))
    return found


def main() -> int:
    violations = check()
    for violation in violations:
        print(violation)
    if violations:
        print(f"{len(violations)} import-rule violation(s)", file=sys.stderr)
        return 1
    print("import rule: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
