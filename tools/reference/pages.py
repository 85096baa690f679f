"""Every generated page of docs/reference/ and the function that writes it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gearshift.scheduler.config.cli import render_defaults, render_plugins
from tools.reference import cli, helm, jobspec, metrics, rpcs
from tools.reference.markdown import page, table

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "reference"


# Page -> (title, what it is generated from, renderer). index.md lists them in this order.
CONTENT: dict[str, tuple[str, str, Callable[[], str]]] = {
    "cli.md": ("Command lines", "the argparse parsers of `gearshift` and every daemon", cli.render),
    "jobspec.md": (
        "Job spec",
        "the JobSpec message, its validation and defaults",
        jobspec.render,
    ),
    "rpcs.md": (
        "RPCs and messages",
        "protos/gearshift/v1/\\*.proto and their comments",
        rpcs.render,
    ),
    "metrics.md": ("Metrics", "each service's Prometheus collectors", metrics.render),
    "scheduler-plugins.md": (
        "Scheduler plugins",
        "the scheduler's plugin registry and each plugin's argument class",
        lambda: render_plugins(markdown=True),
    ),
    "helm-values.md": (
        "Helm chart values",
        "deploy/helm/gearshift's values.schema.json and values.yaml",
        helm.render,
    ),
    "scheduler.yaml": (
        "Scheduler configuration file (defaults)",
        "the SchedulerConfiguration model; `gearshift config defaults` prints it",
        render_defaults,
    ),
}


def render_index() -> str:
    lines = [
        "# Reference",
        "",
        "Every page here is generated from the code by `make reference` "
        "(tools/reference/); do not edit them by hand. "
        "tests/unit/test_reference_docs.py fails when one is stale.",
        "",
        *table(
            ["page", "generated from"],
            ([f"[{title}]({name})", source] for name, (title, source, _) in CONTENT.items()),
        ),
    ]
    return page(lines)


PAGES: dict[str, Callable[[], str]] = {
    "index.md": render_index,
    **{name: render for name, (_, _, render) in CONTENT.items()},
}
