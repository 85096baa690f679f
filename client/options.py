"""Options the client's commands share: where the scheduler is, and its bearer token."""

from __future__ import annotations

import argparse
import os

DEFAULT_SCHEDULER = "127.0.0.1:50051"


def add_scheduler_options(
    parser: argparse.ArgumentParser, *, token_help: str = "bearer token", timeout: float = 30.0
) -> None:
    """--address (GEARSHIFT_SCHEDULER), --token (GEARSHIFT_TOKEN) and --rpc-timeout."""
    parser.add_argument(
        "--address",
        default=os.environ.get("GEARSHIFT_SCHEDULER", DEFAULT_SCHEDULER),
        help="scheduler host:port [env GEARSHIFT_SCHEDULER] (default %(default)s)",
    )
    add_token_option(parser, token_help)
    parser.add_argument(
        "--rpc-timeout",
        type=float,
        default=timeout,
        help="seconds per call (default %(default)s)",
    )


def add_token_option(parser: argparse.ArgumentParser, token_help: str = "bearer token") -> None:
    """--token (GEARSHIFT_TOKEN), for whichever daemon the command calls."""
    parser.add_argument(
        "--token",
        default=os.environ.get("GEARSHIFT_TOKEN", ""),
        help=f"{token_help} [env GEARSHIFT_TOKEN]",
    )
