"""Serving the dashboard with uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from gearshift.client.dashboard.app import create_app
from gearshift.client.dashboard.gateway import Gateway
from gearshift.client.dashboard.options import add_options
from gearshift.client.options import client_tls
from gearshift.common.config import host_port
from gearshift.common.errors import ValidationError


def bind(listen: str) -> socket.socket:
    """A listening socket at `listen` (port 0: any free one); ValueError/OSError say why not."""
    try:
        host, port = host_port(listen)
    except ValueError as exc:
        raise ValueError(f"--listen: {exc}") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(args: argparse.Namespace) -> int:
    """Serve until a signal; exit code 0, or 2 when the address cannot be used."""
    try:
        tls = client_tls(args)
    except ValidationError as exc:
        print(f"gearshift dashboard: {exc.message}", file=sys.stderr)
        return 2
    try:
        sock = bind(args.listen)
    except (ValueError, OSError) as exc:
        print(f"gearshift dashboard: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    gateway = Gateway(args.address, args.brain, args.token, timeout=args.rpc_timeout, tls=tls)
    config = uvicorn.Config(create_app(gateway), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    if args.ready_file:
        ready = Path(args.ready_file)
        tmp = ready.with_name(ready.name + ".tmp")
        tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
        tmp.replace(ready)
    print(f"gearshift dashboard: http://{address}/ (scheduler {args.address})", flush=True)

    def stop(signum: int, frame: object) -> None:
        server.should_exit = True

    # uvicorn handles SIGINT/SIGTERM while it serves, then raises the signal again for the
    # handler it found: this one (not the default, which would end the process with -15),
    # so that a stop is a clean exit 0.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    server.run(sockets=[sock])
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The dashboard's own command line (also walked by docs/reference/cli.md)."""
    parser = argparse.ArgumentParser(
        prog="python -m gearshift.client.dashboard",
        description="Web pages of Gearshift's jobs and cluster (as `gearshift dashboard`).",
    )
    add_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return serve(build_parser().parse_args(argv))
