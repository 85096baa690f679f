"""Options the client's commands share: where the scheduler is, its bearer token, and TLS."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

import grpc

from gearshift.common.auth import CA_VARIABLE, CERT_VARIABLE, KEY_VARIABLE, ClientTls
from gearshift.common.channel import connect
from gearshift.common.errors import ValidationError

DEFAULT_SCHEDULER = "127.0.0.1:50051"
DEFAULT_BRAIN = "127.0.0.1:50052"
TLS_VARIABLES = (CA_VARIABLE, CERT_VARIABLE, KEY_VARIABLE)  # checked_tls's order


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
    given = {"--tls-ca": args.tls_ca, "--tls-cert": args.tls_cert, "--tls-key": args.tls_key}
    return checked_tls(given)


def environment_tls(env: Mapping[str, str]) -> ClientTls | None:
    """client_tls from GEARSHIFT_TLS_* alone (for a process with no flags, e.g. the
    operator under `kopf run`); errors name the variable."""
    return checked_tls({name: env.get(name, "") for name in TLS_VARIABLES})


def checked_tls(given: Mapping[str, str]) -> ClientTls | None:
    """ClientTls from the CA, certificate and key, in that order, keyed by what the user set
    them with (a flag or a variable, named by any error); None when no CA is given."""
    (ca_name, ca), (cert_name, cert), (key_name, key) = given.items()
    if not ca:
        if cert or key:
            raise ValidationError(ca_name, f"is required with {cert_name} / {key_name}")
        return None
    if bool(cert) != bool(key):
        raise ValidationError(cert_name, f"and {key_name} must be given together")
    return ClientTls(
        pem_file(ca_name, ca),
        pem_file(cert_name, cert) if cert else None,
        pem_file(key_name, key) if key else None,
    )


def pem_file(flag: str, value: str) -> Path:
    """A TLS file given with `flag`; ValidationError naming the flag when it is not a
    readable file."""
    path = Path(value)
    if not path.is_file():
        raise ValidationError(flag, f"{value} is not a file")
    if not os.access(path, os.R_OK):
        raise ValidationError(flag, f"{value} is not readable")
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
