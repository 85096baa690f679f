"""The import rules. Run by `make lint` and by tests/unit/test_import_rule.py.

The service split: a service package never imports another service package. Only
gearshift.v1 (the contracts) and gearshift.common are shared. The client imports no
service either.

The scheduler's rooms (docs/architecture/round-hooks.md; `check_rooms`):

1. no import cycle among gearshift.scheduler's modules, imports under TYPE_CHECKING and
   inside functions included;
2. the bottom module, gearshift.scheduler.types, imports no other module of the scheduler;
3. plugins never import each other: a module of plugins/<seed>/ imports nothing of
   plugins/ outside its own seed (neither another seed nor the registry's modules, which
   import the seeds). A seed may import the types, state/, round/ (the stages' shared
   helpers: placement, the EST model, estimates) and gearshift.common;
4. the round and the state name no plugin: no module of round/ or state/ imports anything
   of plugins/, neither a seed nor the registry's modules (plugins/registry.py, stages.py,
   allocators.py, which import the seeds). A plugin reaches the round through the hooks of
   round/hooks.py and the protocols of the types; the service wires in what the registry
   builds. No exceptions.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection, Iterator
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


SCHEDULER = "gearshift.scheduler"
SCHEDULER_FOLDER = "services/scheduler"
BOTTOM = "gearshift.scheduler.types"
PLUGINS = "gearshift.scheduler.plugins"
# Rule 4: the rooms that import nothing of plugins/.
NO_PLUGINS = ("gearshift.scheduler.round", "gearshift.scheduler.state")


@dataclass(frozen=True)
class RoomViolation:
    path: Path
    line: int
    importer: str
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported} ({self.rule})"


def _seed(module: str) -> str | None:
    """The seed subpackage of plugins/ a module belongs to (None: not in one)."""
    parts = module.split(".")
    base = len(PLUGINS.split("."))
    if module.startswith(PLUGINS + ".") and len(parts) > base + 1:
        return parts[base]
    return None


def _module_imports(
    tree: ast.AST, module: str, is_package: bool, modules: Collection[str]
) -> Iterator[tuple[int, str]]:
    """The modules among `modules` an import names, as import-linter reads them: `import a.b`
    and `from a import b` name a.b when that is a module, else the module that holds it."""

    def holder(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, holder(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                if not is_package:
                    parts = parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                yield node.lineno, name if name in modules else holder(base)


def _scheduler_graph(
    root: Path, package: str, folder: str
) -> tuple[dict[str, Path], dict[str, list[tuple[int, str]]]]:
    """Every module of the package, and the package's modules each imports (first line)."""
    base = root / folder
    modules = {_module_name(package, base, p): p for p in sorted(base.rglob("*.py"))}
    edges: dict[str, list[tuple[int, str]]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        found: dict[str, int] = {}
        for line, target in _module_imports(tree, module, path.name == "__init__.py", modules):
            if target and target != module:
                found[target] = min(line, found.get(target, line))
        edges[module] = sorted((line, target) for target, line in found.items())
    return modules, edges


def _cycles(edges: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for _, w in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def check_rooms(
    root: Path = ROOT, package: str = SCHEDULER, folder: str = SCHEDULER_FOLDER
) -> list[RoomViolation]:
    """Every break of the scheduler's room rules (the module docstring)."""
    bottom = BOTTOM.replace(SCHEDULER, package, 1)
    plugins = PLUGINS.replace(SCHEDULER, package, 1)
    rooms = tuple(room.replace(SCHEDULER, package, 1) + "." for room in NO_PLUGINS)
    modules, edges = _scheduler_graph(root, package, folder)
    found: list[RoomViolation] = []

    def seed(module: str) -> str | None:
        return _seed(module.replace(package, SCHEDULER, 1))

    for module, imports in edges.items():
        rel = modules[module].relative_to(root)
        for line, imported in imports:
            if module == bottom:
                found.append(
                    RoomViolation(
                        rel,
                        line,
                        module,
                        imported,
                        "rule 2: the bottom module imports no other scheduler module",
                    )
                )
            mine, theirs = seed(module), seed(imported)
            if mine is not None and imported.startswith(plugins) and mine != theirs:
                found.append(
                    RoomViolation(
                        rel, line, module, imported, "rule 3: plugins never import each other"
                    )
                )
            if module.startswith(rooms) and (imported + ".").startswith(plugins + "."):
                found.append(
                    RoomViolation(
                        rel,
                        line,
                        module,
                        imported,
                        "rule 4: the round and the state name no plugin",
                    )
                )
    for cycle in _cycles(edges):
        first = cycle[0]
        line = next(n for n, m in edges[first] if m in cycle)
        found.append(
            RoomViolation(
                modules[first].relative_to(root),
                line,
                first,
                " -> ".join(cycle),
                "rule 1: an import cycle",
            )
        )
    return found


def main() -> int:
    violations: list[Violation | RoomViolation] = [*check(), *check_rooms()]
    for violation in violations:
        print(violation)
    if violations:
        print(f"{len(violations)} import-rule violation(s)", file=sys.stderr)
        return 1
    print("import rule: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
