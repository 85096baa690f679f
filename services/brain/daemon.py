"""The Brain daemon: flags, storage, servicer, serving; and its `migrate` and
`load-references` subcommands."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from gearshift.brain.references import gavel_references
from gearshift.brain.service import BrainService, ReferenceCache
from gearshift.brain.servicer import BrainServicer
from gearshift.brain.storage import SqlBrainStore
from gearshift.common.config import Option, build_parser, parse_bool
from gearshift.common.daemon import Daemon, run_daemon, server_options
from gearshift.common.db import create_engine, database_url, migrate
from gearshift.common.errors import GearshiftError
from gearshift.common.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from gearshift.common.server import register
from gearshift.v1 import brain_pb2, brain_pb2_grpc

log = logging.getLogger("gearshift.brain")

PROG = "gearshift-brain"
DEFAULT_PORT = 50052
DEFAULT_DATABASE = "sqlite:///.gearshift/brain.db"

DATABASE_OPTION = Option(
    "database_url",
    "database: postgresql://user:pass@host/db (psycopg2) or sqlite:///path.db",
    DEFAULT_DATABASE,
)
REFERENCES_OPTION = Option(
    "reference_throughputs",
    "Gavel-format throughputs JSON loaded into the reference table at start (empty: none)",
    "",
)
OPTIONS = [
    *server_options(DEFAULT_PORT),
    DATABASE_OPTION,
    Option(
        "migrate_on_start",
        "upgrade the schema to the newest revision before serving",
        True,
        parse_bool,
    ),
    REFERENCES_OPTION,
    Option(
        "default_steps_per_second",
        "throughput estimate when nothing is known about a job or its model type",
        1.0,
        float,
    ),
]
DESCRIPTION = (
    "Gearshift Brain: job histories, throughput estimates and resource plans over gRPC. "
    f"Subcommands: '{PROG} migrate [--database-url URL]' upgrades the schema and exits; "
    f"'{PROG} load-references FILE [--database-url URL]' loads a Gavel throughputs JSON "
    "into the reference table and exits."
)
_TOOL_OPTIONS = [
    DATABASE_OPTION,
    Option("log_level", "log level", "info", choices=LOG_LEVELS),
    Option("log_format", "log line format", "text", choices=LOG_FORMATS),
]


def _database(url: str) -> str:
    parsed = database_url(url)
    return parsed.render_as_string(hide_password=False)


def load_references(store: SqlBrainStore, path: str) -> int:
    """Load a Gavel throughputs file into the reference table; returns the rows written."""
    return store.put_references(gavel_references(path), source=Path(path).name)


def build(config: argparse.Namespace) -> Daemon:
    if config.default_steps_per_second <= 0:
        raise ValueError("--default-steps-per-second must be > 0")
    try:
        url = _database(config.database_url)
        if config.migrate_on_start:
            migrate(url)
        engine = create_engine(url)
        store = SqlBrainStore(engine)
        if config.reference_throughputs:
            count = load_references(store, config.reference_throughputs)
            log.info("references loaded", extra={"rows": count})
        service = BrainService(
            store,
            default_steps_per_second=config.default_steps_per_second,
            references=ReferenceCache(store),
        )
        service.references.model()  # build the reference model (if any) before serving
    except GearshiftError as exc:
        raise ValueError(exc.message) from None
    except sa.exc.SQLAlchemyError as exc:
        raise RuntimeError(f"database {config.database_url}: {exc}") from None
    name = brain_pb2.DESCRIPTOR.services_by_name["Brain"].full_name
    return Daemon(
        [register(brain_pb2_grpc.add_BrainServicer_to_server, BrainServicer(service), name)],
        on_stop=[engine.dispose],
    )


def _tool(command: str, argv: Sequence[str]) -> int:
    parser = build_parser(f"{PROG} {command}", DESCRIPTION, _TOOL_OPTIONS)
    if command == "load-references":
        parser.add_argument("file", help="Gavel-format throughputs JSON")
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        url = _database(args.database_url)
        if command == "migrate":
            migrate(url)
            print(f"{PROG}: schema at head on {database_url(url).render_as_string()}")
            return 0
        engine = create_engine(url)
        try:
            count = load_references(SqlBrainStore(engine), args.file)
        finally:
            engine.dispose()
        print(f"{PROG}: {count} reference throughputs loaded from {args.file}")
        return 0
    except GearshiftError as exc:
        print(f"{PROG} {command}: error: {exc.message}", file=sys.stderr)
    except sa.exc.SQLAlchemyError as exc:
        print(f"{PROG} {command}: error: {exc}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("migrate", "load-references"):
        return _tool(args[0], args[1:])
    return run_daemon(PROG, DESCRIPTION, OPTIONS, build, args)
