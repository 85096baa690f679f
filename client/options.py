"""Options the client's commands share: where the scheduler is, its bearer token, and TLS."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import grpc

from gearshift.common.auth import CA_VARIABLE, CERT_VARIABLE, KEY_VARIABLE, ClientTls
from gearshift.common.channel import connect
from gearshift.common.errors import ValidationError

DEFAULT_SCHEDULER = "127.0.0.1:50051"
DEFAULT_BRAIN = "127.0.0.1:50052"


def add_scheduler_options(
    parser: argparse.ArgumentParser, *, token_help: str = "bearer token", timeout: float = 30.0
) -> None:
    """--address (GEARSHIFT_SCHEDULER), --token (GEARSHIFT_TOKEN), TLS and --rpc-timeout."""
    parser.add_argument(
        "--address",
        default=os.environ.get("GEARSHIFT_SCHEDULER", DEFAULT_SCHEDULER),
        help="scheduler host:port, or several IP:PORT comma-separated (a leader and its "
        "standbys) [env GEARSHIFT_SCHEDULER] (default %(default)s)",
    )
    add_token_option(parser, token_help)
    add_tls_options(parser)
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


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    """--tls-ca, --tls-cert, --tls-key (GEARSHIFT_TLS_*): how to call daemons that serve TLS."""
    for flag, variable, what in (
        ("--tls-ca", CA_VARIABLE, "PEM CA that signed the daemons' certificates: calls use TLS"),
        ("--tls-cert", CERT_VARIABLE, "PEM client certificate, for daemons that require mTLS"),
        ("--tls-key", KEY_VARIABLE, "PEM private key of --tls-cert"),
    ):
        parser.add_argument(
            flag, default=os.environ.get(variable, ""), help=f"{what} [env {variable}]"
        )


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The TLS settings of add_tls_options (None: plaintext); a missing file is named."""
    if not args.tls_ca:
        if args.tls_cert or args.tls_key:
            raise ValidationError("--tls-ca", "is required with --tls-cert / --tls-key")
        return None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValidationError("--tls-cert", "and --tls-key must be given together")
    return ClientTls(
        pem_file("--tls-ca", args.tls_ca),
        pem_file("--tls-cert", args.tls_cert) if args.tls_cert else None,
        pem_file("--tls-key", args.tls_key) if args.tls_key else None,
    )


def pem_file(flag: str, value: str) -> Path:
    """A TLS file given with `flag`; ValidationError naming the flag when it is not a file."""
    path = Path(value)
    if not path.is_file():
        raise ValidationError(flag, f"{value} is not a file")
    return path


def add_brain_options(parser: argparse.ArgumentParser, token_help: str = "bearer token") -> None:
    """--brain (GEARSHIFT_BRAIN), --token, TLS and --rpc-timeout: the commands that ask the
    Brain (see brain_channel)."""
    parser.add_argument(
        "--brain",
        default=os.environ.get("GEARSHIFT_BRAIN", DEFAULT_BRAIN),
        help="Brain host:port [env GEARSHIFT_BRAIN] (default %(default)s)",
    )
    add_token_option(parser, token_help)
    add_tls_options(parser)
    parser.add_argument("--rpc-timeout", type=float, default=30.0, help="seconds per call")


def brain_channel(args: argparse.Namespace, tls: ClientTls | None) -> grpc.Channel:
    """A channel to the Brain of add_brain_options (`tls`: client_tls(args), checked first)."""
    return connect(args.brain, token=args.token or None, tls=tls, timeout=args.rpc_timeout)
