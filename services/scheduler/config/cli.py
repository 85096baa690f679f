"""`gearshift config`: the scheduler's configuration file, printed, checked and explained.

    gearshift config defaults         the default file, a comment on every key
    gearshift config check FILE       validate a file (exit 2 with its problems)
    gearshift config plugins [--markdown]
                                      every plugin of every extension point, with its
                                      arguments, generated from the registry

Exit codes: 0 done; 2 bad usage or an invalid file.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gearshift.scheduler.config.configuration import (
    ConfigurationError,
    Profile,
    SchedulerConfiguration,
    load,
)
from gearshift.scheduler.plugins.registry import Plugin, Point, names, plugin, plugins

EXIT_OK, EXIT_USAGE = 0, 2
WIDTH = 92


def _comment(text: str, indent: str) -> list[str]:
    width = WIDTH - len(indent)
    return [f"{indent}# {line}" for line in textwrap.wrap(" ".join(text.split()), width)]


def _scalar(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) or not value else value


def _fields(model: type[BaseModel], values: BaseModel, indent: str) -> Iterator[str]:
    for name, info in model.model_fields.items():
        key = info.alias or name
        value = getattr(values, name)
        yield from _comment(info.description or "", indent)
        if isinstance(value, BaseModel):
            yield f"{indent}{key}:"
            yield from _fields(type(value), value, indent + "  ")
        else:
            dumped = value if not isinstance(value, dict) else (value or {})
            yield f"{indent}{key}: {_scalar(dumped)}"


def _plugin_lines(point: Point, name: str, indent: str) -> Iterator[str]:
    found = plugin(point, name)
    assert found is not None
    info: FieldInfo = Profile.model_fields[point.value]
    others = [n for n in names(point) if n != name]
    yield from _comment(f"{info.description}: {found.doc}", indent)
    if others:
        yield from _comment("other plugins: " + ", ".join(others), indent)
    yield f"{indent}{point.key}:"
    yield f"{indent}  name: {name}"
    defaults = found.args()
    if not found.args.model_fields:
        return
    yield f"{indent}  args:"
    yield from _fields(found.args, defaults, indent + "    ")


def render_defaults() -> str:
    """The default configuration file, every key with its comment."""
    config = SchedulerConfiguration()
    out = [
        "# Gearshift scheduler configuration (gearshift config defaults).",
        "# Every key is optional: a key left out takes the value shown here.",
    ]
    for name, info in SchedulerConfiguration.model_fields.items():
        key = info.alias or name
        value = getattr(config, name)
        if name == "profile":
            out += _comment(info.description or "", "")
            out.append("profile:")
            for point, plugin_name, _ in config.profile.refs():
                out += list(_plugin_lines(point, plugin_name, "  "))
            continue
        if isinstance(value, BaseModel):
            out += _comment(info.description or "", "")
            out.append(f"{key}:")
            out += list(_fields(type(value), value, "  "))
        else:
            out.append(f"{key}: {_scalar(value)}")
    return "\n".join(out) + "\n"


def _args_rows(found: Plugin) -> Iterator[tuple[str, str, str, str]]:
    defaults = found.args()
    for name, info in found.args.model_fields.items():
        if get_origin(info.annotation) is Literal:  # the values a key takes: one of them
            kind = " or ".join(json.dumps(v) for v in get_args(info.annotation))
        else:
            kind = getattr(info.annotation, "__name__", None) or str(info.annotation)
        default = json.dumps(getattr(defaults, name))
        # A Markdown cell holds no bare pipe: `bool | None` reads `bool or null`.
        kind = kind.replace("typing.", "").replace(" | None", " or null")
        meaning = (info.description or "").replace("|", "\\|")
        yield info.alias or name, kind, default, meaning


def render_plugins(markdown: bool = False) -> str:
    """Every registered plugin with its arguments (text, or the docs' Markdown page)."""
    out: list[str] = []
    if markdown:
        out += [
            "# Scheduler plugins",
            "",
            "Generated from the plugin registry (`gearshift config plugins --markdown`); "
            "do not edit by hand.",
            "",
        ]
    for point in Point:
        out += [f"## {point.key}", ""] if markdown else [f"{point.key}:"]
        for found in plugins(point):
            can = ", ".join(sorted(found.can(found.args()))) or "-"
            if markdown:
                out += [f"### `{found.name}`", "", " ".join(found.doc.split()), ""]
                out += [f"Can: {can}. From: {', '.join(found.tags) or '-'}.", ""]
                rows = list(_args_rows(found))
                if rows:
                    out += ["| argument | type | default | meaning |", "|---|---|---|---|"]
                    out += [f"| `{a}` | {t} | `{d}` | {m} |" for a, t, d, m in rows]
                    out.append("")
            else:
                out.append(f"  {found.name}  [{can}]")
                out += _comment(found.doc, "      ")
                for a, t, d, m in _args_rows(found):
                    out.append(f"      {a}: {t} = {d}")
                    out += _comment(m, "          ")
        if not markdown:
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gearshift config",
        description="The scheduler's configuration file (kind: SchedulerConfiguration): the "
        "defaults, a check, and the plugins each extension point can name.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="ACTION")
    sub.add_parser("defaults", help="print the default file, with a comment on every key")
    check = sub.add_parser("check", help="validate a file; exit 2 naming each problem's line")
    check.add_argument("file", type=Path)
    listing = sub.add_parser("plugins", help="list every plugin with its arguments")
    listing.add_argument("--markdown", action="store_true", help="as the docs' Markdown page")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "defaults":
        sys.stdout.write(render_defaults())
    elif args.command == "plugins":
        sys.stdout.write(render_plugins(args.markdown))
    else:
        try:
            loaded = load(args.file)
        except ConfigurationError as exc:
            print(f"gearshift config: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        points = ", ".join(f"{p.key} {loaded.name(p)}" for p in Point)
        print(f"{args.file}: valid ({points})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
