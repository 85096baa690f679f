"""Daemon configuration: command-line flags with `GEARSHIFT_*` environment fallbacks.

Each daemon declares its options once as `Option`s; the same list builds the
`--help` text, reads the environment, and tells the docker-compose test which
variables a daemon reads. Precedence: flag, then environment, then default.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "GEARSHIFT_"


def parse_bool(text: str) -> bool:
    """Parse an environment boolean (1/0, true/false, yes/no, on/off)."""
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


@dataclass(frozen=True)
class Option:
    """One setting of a daemon: a flag `--name` and a variable `GEARSHIFT_NAME`."""

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] = str
    choices: Sequence[str] | None = None
    secret: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


class ConfigError(ValueError):
    """A setting has a bad value; the message names the flag or variable."""


def _from_env(option: Option, environ: Mapping[str, str]) -> Any:
    raw = environ.get(option.env)
    if raw is None:
        return option.default
    try:
        value = option.type(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{option.env}={raw!r}: {exc}") from None
    if option.choices is not None and value not in option.choices:
        raise ConfigError(f"{option.env}={raw!r}: must be one of {', '.join(option.choices)}")
    return value


def build_parser(
    prog: str,
    description: str,
    options: Sequence[Option],
    environ: Mapping[str, str] | None = None,
) -> argparse.ArgumentParser:
    """An argparse parser whose defaults come from the environment."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog="Every flag can also be set with the environment variable shown in its help.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for option in options:
        default = _from_env(option, env)
        help_text = f"{option.help} [env {option.env}]"
        if option.secret:
            # A '%(default)' in the text stops the formatter from printing the value.
            help_text += "%(default).0s"
        if option.type is parse_bool:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=help_text,
            )
            continue
        parser.add_argument(
            option.flag,
            dest=option.dest,
            type=option.type,
            choices=option.choices,
            default=default,
            help=help_text,
        )
    return parser


def parse_config(
    prog: str,
    description: str,
    options: Sequence[Option],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """Parse flags over environment defaults; exits with status 2 and a clear message on error."""
    try:
        parser = build_parser(prog, description, options, environ)
    except ConfigError as exc:
        raise SystemExit(f"{prog}: error: {exc}") from None
    return parser.parse_args(argv)


def env_vars(options: Iterable[Option]) -> set[str]:
    """Every environment variable a list of options reads."""
    return {option.env for option in options}


def host_port(address: str) -> tuple[str, int]:
    """Split "host:port" (IPv6 hosts in brackets); raises ValueError naming the address."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def advertise_address(listen_host: str, port: int, hostnames: Sequence[str] = ()) -> str:
    """What others dial to reach a daemon: the listen host, or this host's name for a
    wildcard."""
    host = listen_host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = next(iter(hostnames), "") or socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}"


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` laid over `base`, mapping into mapping: how a launcher or a test changes a few
    keys of a configuration file (`merged(file, {"round": {"seconds": 1}})`)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
