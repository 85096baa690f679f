"""docs/reference/ is what the code generates (make reference), and stays valid Markdown."""

from __future__ import annotations

import re
from functools import cache

import pytest

from tools.reference import markdown
from tools.reference.pages import FOLDER, PAGES


@cache
def rendered(name: str) -> str:
    return PAGES[name]()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_committed_page_is_what_the_code_generates(name: str) -> None:
    path = FOLDER / name
    assert path.exists(), f"docs/reference/{name} is missing: run `make reference`"
    stale = f"docs/reference/{name} is stale: run `make reference`"
    assert path.read_text() == rendered(name), stale


def test_every_generated_page_is_listed_in_the_index() -> None:
    index = (FOLDER / "index.md").read_text()
    for name in PAGES:
        if name != "index.md":
            assert f"]({name})" in index
    assert sorted(p.name for p in FOLDER.iterdir()) == sorted(PAGES)


def test_links_within_and_across_pages_name_existing_headings() -> None:
    """What `mkdocs build --strict` would report as a broken link or anchor."""
    headings = {
        name: {markdown.anchor(h) for h in re.findall(r"^#+ (.+)$", rendered(name), re.M)}
        for name in PAGES
        if name.endswith(".md")
    }
    for name in headings:
        for target, fragment in re.findall(r"\]\(([\w.-]*)#?([\w-]*)\)", rendered(name)):
            page = target or name
            assert page in PAGES, f"{name} links to {page}, which is no generated page"
            if fragment:
                assert fragment in headings[page], f"{name} links to {page}#{fragment}"


def test_the_cli_page_does_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = rendered("cli.md")
    monkeypatch.setenv("GEARSHIFT_SCHEDULER", "elsewhere:1")
    monkeypatch.setenv("GEARSHIFT_LOG_LEVEL", "debug")
    assert PAGES["cli.md"]() == before
    import os

    assert os.environ["GEARSHIFT_SCHEDULER"] == "elsewhere:1"  # put back afterwards


def test_markdown_text_escapes_what_would_not_show_as_written() -> None:
    assert markdown.text("a | b <id> 2 * 3 -> `x|y` `<z>`") == (
        "a \\| b &lt;id\\> 2 \\* 3 -\\> `x\\|y` `<z>`"
    )
    assert markdown.text("two\n   lines") == "two lines"
    assert markdown.anchor("gearshift config defaults") == "gearshift-config-defaults"
    assert markdown.anchor("JobEvent.Kind") == "jobeventkind"


def test_an_element_without_a_comment_is_shown_and_counted() -> None:
    from tools.reference import rpcs

    assert rpcs.comment("gearshift.v1.NoSuchMessage.field") == rpcs.NO_COMMENT
    count = len(rpcs.undocumented())
    assert f"Elements without a comment: {count}." in rendered("rpcs.md")


def test_every_gearshift_metric_of_the_daemons_is_on_the_metrics_page() -> None:
    """A metric defined outside the modules metrics.MODULES names would be left off."""
    import prometheus_client

    from tools.reference import cli, metrics

    assert cli.programs()  # every daemon's modules imported, and with them their metrics
    documented = {
        name for module in metrics.MODULES.values() for name, *_ in metrics.metrics(module)
    }
    registered = {
        family.name
        for family in prometheus_client.REGISTRY.collect()
        if family.name.startswith("gearshift_")
    }
    assert registered <= documented, f"not on metrics.md: {sorted(registered - documented)}"
