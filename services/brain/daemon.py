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
from gearshift.common.config import Option, build_parser
from gearshift.common.daemon import Daemon, run_daemon, server_options
from gearshift.common.db import (
    create_engine,
    database_options,
    migrate_main,
    open_database,
    tool_options,
)
from gearshift.common.errors import GearshiftError
from gearshift.common.logs import configure_logging
from gearshift.common.server import register
from gearshift.v1 import brain_pb2, brain_pb2_grpc

log = logging.getLogger("gearshift.brain")

PROG = "gearshift-brain"
DEFAULT_PORT = 50052
DEFAULT_DATABASE = "sqlite:///.gearshift/brain.db"

REFERENCES_OPTION = Option(
    "reference_throughputs",
    "Gavel-format throughputs JSON loaded into the reference table at start (empty: none)",
    "",
)
OPTIONS = [
    *server_options(DEFAULT_PORT),
    *database_options(DEFAULT_DATABASE),
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


def load_references(store: SqlBrainStore, path: str) -> int:
    """Load a Gavel throughputs file into the reference table; returns the rows written."""
    return store.put_references(gavel_references(path), source=Path(path).name)


def build(config: argparse.Namespace) -> Daemon:
    if config.default_steps_per_second <= 0:
        raise ValueError("--default-steps-per-second must be > 0")
    url = open_database(config.database_url, migrate_first=config.migrate_on_start)
    try:
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
        scopes=lambda: service,  # the tenants of recorded jobs, for Rubick's job-scoped RPCs
        on_stop=[engine.dispose],
    )


def load_references_parser() -> argparse.ArgumentParser:
    """`gearshift-brain load-references FILE`'s command line."""
    parser = build_parser(f"{PROG} load-references", DESCRIPTION, tool_options(DEFAULT_DATABASE))
    parser.add_argument("file", help="Gavel-format throughputs JSON")
    return parser


def _load_references_main(argv: Sequence[str]) -> int:
    args = load_references_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        engine = create_engine(open_database(args.database_url, migrate_first=False))
        try:
            count = load_references(SqlBrainStore(engine), args.file)
        finally:
            engine.dispose()
        print(f"{PROG}: {count} reference throughputs loaded from {args.file}")
        return 0
    except GearshiftError as exc:
        print(f"{PROG} load-references: error: {exc.message}", file=sys.stderr)
    except (ValueError, RuntimeError, sa.exc.SQLAlchemyError) as exc:
        print(f"{PROG} load-references: error: {exc}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["migrate"]:
        return migrate_main(PROG, DESCRIPTION, args[1:], DEFAULT_DATABASE)
    if args[:1] == ["load-references"]:
        return _load_references_main(args[1:])
    return run_daemon(PROG, DESCRIPTION, OPTIONS, build, args)
