"""docs/reference/cli.md: every command line, walked from its argparse parser.

argparse has no public API to walk a parser, so this reads the attributes its own help
formatter reads (`_actions`, `_SubParsersAction.choices`, `_mutually_exclusive_groups`).
Defaults are those of an environment without any GEARSHIFT_* variable, so the page is
the same on every machine.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gearshift.brain import daemon as brain
from gearshift.client import cli as client
from gearshift.client.dashboard import server as dashboard
from gearshift.common.config import build_parser
from gearshift.common.db import migrate_parser
from gearshift.scheduler import daemon as scheduler
from gearshift.scheduler.api import heartbeat_relay as relay
from gearshift.scheduler.config import cli as config
from gearshift.scheduler.sim import simulate
from gearshift.shardmanager import daemon as shardmanager
from gearshift.worker import daemon as worker
from tools.reference.markdown import anchor, code, page, table, text

_ENV = re.compile(r"\s*\[env (GEARSHIFT_[A-Z0-9_]+)\]")


@dataclass(frozen=True)
class Program:
    """One executable's command line: how it is run and how its parser is built."""

    name: str
    run: str  # how a user starts it
    parser: Callable[[], argparse.ArgumentParser]


def programs() -> list[Program]:
    """Every command line Gearshift installs."""

    def daemon(module: Any) -> Callable[[], argparse.ArgumentParser]:
        return lambda: build_parser(module.PROG, module.DESCRIPTION, module.OPTIONS, {})

    def migrate(module: Any) -> Callable[[], argparse.ArgumentParser]:
        return lambda: migrate_parser(module.PROG, module.DESCRIPTION, module.DEFAULT_DATABASE)

    return [
        Program("gearshift", "console script `gearshift`", client.build_parser),
        Program("gearshift-scheduler", "`python -m gearshift.scheduler`", daemon(scheduler)),
        Program("gearshift-scheduler migrate", "a subcommand", migrate(scheduler)),
        Program(
            "gearshift-scheduler relay",
            "a subcommand the scheduler runs (its file's heartbeats.relays)",
            daemon(relay),
        ),
        Program("gearshift-brain", "`python -m gearshift.brain`", daemon(brain)),
        Program("gearshift-brain migrate", "a subcommand", migrate(brain)),
        Program("gearshift-brain load-references", "a subcommand", brain.load_references_parser),
        Program(
            "gearshift-shardmanager", "`python -m gearshift.shardmanager`", daemon(shardmanager)
        ),
        Program("gearshift-worker", "`python -m gearshift.worker`", daemon(worker)),
        Program(
            "python -m gearshift.client.dashboard",
            "the dashboard alone (as `gearshift dashboard`)",
            dashboard.build_parser,
        ),
    ]


def forwarded() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """`gearshift` subcommands that hand their arguments to another module's parser."""
    return {"simulate": simulate.build_parser, "config": config.build_parser}


@contextmanager
def bare_environment() -> Iterator[None]:
    """No GEARSHIFT_* variable while parsers are built (their defaults read them)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("GEARSHIFT_")}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


# "(default %(default)s)" in a help text: the page's default column says it.
_SAYS_DEFAULT = re.compile(r"\s*\(default %\(default\)s\)|default %\(default\)s;\s*")


def _help(action: argparse.Action, prog: str) -> str:
    """The help text as argparse prints it (its %-placeholders filled in)."""
    if not action.help:
        return ""
    raw = _SAYS_DEFAULT.sub("", action.help)
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    for key, value in params.items():
        if callable(value) and hasattr(value, "__name__"):
            params[key] = value.__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return raw % params


def _default(action: argparse.Action) -> str:
    value = action.default
    if isinstance(action, argparse.BooleanOptionalAction) and isinstance(value, bool):
        return code(str(value).lower())  # --x / --no-x: which one holds without either
    if value is None or value is argparse.SUPPRESS or action.nargs == 0:
        return ""
    if "%(default)." in (action.help or ""):  # "%(default).0s": a secret's value is hidden
        return ""
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, list | tuple):
        return code(", ".join(str(v) for v in value)) if value else ""
    return code(str(value)) if str(value) != "" else ""


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _usage_of(action: argparse.Action) -> str:
    name = _metavar(action)
    if action.nargs == "?":
        return f"[{name}]"
    if action.nargs == "*":
        return f"[{name} ...]"
    if action.nargs == "+":
        return f"{name} [{name} ...]"
    return name


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _documented(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and a.help is not argparse.SUPPRESS
    ]


def _parser_lines(
    parser: argparse.ArgumentParser, prog: str, depth: int, replace: dict[str, Any]
) -> Iterator[str]:
    yield f"{'#' * depth} {prog}"
    yield ""
    if parser.description:
        yield text(parser.description)
        yield ""
    actions = _documented(parser)
    positionals = [a for a in actions if not a.option_strings]
    options = [a for a in actions if a.option_strings]
    sub = _subparsers(parser)
    usage = [prog, *(["[options]"] if options else []), *(_usage_of(a) for a in positionals)]
    if sub is not None:
        usage.append(f"{sub.metavar or 'COMMAND'} ...")
    yield "Usage: " + code(" ".join(usage))
    yield ""
    if positionals:
        yield from table(
            ["argument", "help"],
            ([code(_usage_of(a)), text(_help(a, prog))] for a in positionals),
        )
        yield ""
    if options:
        rows = []
        for a in options:
            help_text = _help(a, prog)
            env = _ENV.search(help_text)
            help_text = _ENV.sub("", help_text)
            if a.required:
                help_text += " (required)"
            value = _metavar(a)
            flags = ", ".join(code(f + (f" {value}" if value else "")) for f in a.option_strings)
            rows.append([flags, _default(a), code(env.group(1)) if env else "", text(help_text)])
        yield from table(["option", "default", "environment", "help"], rows)
        yield ""
    for group in parser._mutually_exclusive_groups:
        flags = ", ".join(code(a.option_strings[0]) for a in group._group_actions)
        yield ("Exactly one of " if group.required else "At most one of ") + flags + "."
        yield ""
    if parser.epilog:
        yield text(parser.epilog)
        yield ""
    if sub is None:
        return
    helps = {c.dest: c.help or "" for c in sub._choices_actions}
    names = sorted(sub.choices)
    yield from table(
        ["command", "summary"],
        ([f"[{name}](#{anchor(f'{prog} {name}')})", text(helps.get(name, ""))] for name in names),
    )
    yield ""
    for name in names:
        child = replace[name]() if name in replace else sub.choices[name]
        yield from _parser_lines(child, f"{prog} {name}", depth + 1, {})


def render() -> str:
    """The page: each program, then its subcommands, in a fixed order."""
    lines = [
        "# Command lines",
        "",
        "Generated by `make reference` from the argparse parsers (tools/reference/cli.py); "
        "do not edit. Defaults are shown as they are with no `GEARSHIFT_*` variable set; "
        "a flag's environment variable, where it has one, sets its default.",
        "",
    ]
    with bare_environment():
        built = [(p, p.parser()) for p in programs()]
        replace = forwarded()
        lines += table(
            ["program", "started as"],
            ([f"[{p.name}](#{anchor(p.name)})", text(p.run)] for p, _ in built),
        )
        lines.append("")
        for program, parser in built:
            subcommands = replace if program.name == "gearshift" else {}
            lines += _parser_lines(parser, program.name, 2, subcommands)
    return page(lines)
