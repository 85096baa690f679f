"""The dashboard's command-line options, shared by `gearshift dashboard` and
`python -m gearshift.client.dashboard` (no web library imported here)."""

from __future__ import annotations

import argparse
import os

from gearshift.client.options import add_scheduler_options

DEFAULT_LISTEN = "127.0.0.1:8080"


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default=os.environ.get("GEARSHIFT_DASHBOARD_LISTEN", DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help="where to serve the pages [env GEARSHIFT_DASHBOARD_LISTEN] (default %(default)s; "
        "port 0: any free port)",
    )
    parser.add_argument(
        "--brain",
        default=os.environ.get("GEARSHIFT_BRAIN", ""),
        metavar="ADDRESS",
        help="Brain host:port: the job page then shows its samples/s record [env GEARSHIFT_BRAIN]",
    )
    add_scheduler_options(
        parser,
        token_help="bearer token used for a browser that has not logged in (without it, "
        "pages ask for the scheduler's token once)",
        timeout=10.0,
    )
    parser.add_argument(
        "--ready-file", default="", help="write {address, pid} as JSON here once serving"
    )
