"""Markdown that MkDocs renders as written: escaped cells, tables, heading anchors."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_SPECIAL = re.compile(r"([\\|*>])")
_SPAN = re.compile(r"(`[^`]*`)")


def _plain(value: str) -> str:
    return _SPECIAL.sub(r"\\\1", value).replace("<", "&lt;")


def text(value: str) -> str:
    """Prose on one line: whitespace collapsed, Markdown's characters escaped so a help
    text's `<worker-id>` or `2 * 3` shows as written; `code spans` stay code."""
    parts = _SPAN.split(" ".join(value.split()))
    return "".join(
        part.replace("|", "\\|") if part.startswith("`") else _plain(part) for part in parts
    )


def code(value: str) -> str:
    """An inline code span, whatever backticks the value holds; `|` escaped for tables."""
    fence = "``" if "`" in value else "`"
    pad = " " if "`" in value else ""
    return f"{fence}{pad}{value}{pad}{fence}".replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A pipe table; cells are already Markdown (see text and code)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return out


def anchor(heading: str) -> str:
    """The id Python-Markdown's toc extension gives a heading (its default slugify), for
    links within and across pages."""
    slug = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", slug)


def page(lines: Iterable[str]) -> str:
    """The page's text: one trailing newline, no trailing spaces, no runs of blank lines."""
    out: list[str] = []
    for raw in lines:
        line = raw.rstrip()
        if line or (out and out[-1]):
            out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"
