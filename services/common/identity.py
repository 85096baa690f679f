"""Who is calling: bearer tokens mapped to identities with roles, from a tokens file.

The file holds one token a line, never the token itself, only its SHA-256:

    # sha256-of-token                                                 role[:subject]
    9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  admin
    2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae  tenant:alice
    fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9  worker:node-1
    baa5a0964d3320fbc0c6a922140453c8513ea24ab8fd0577034804a967248096  service

Roles: `admin` (everything), `tenant:<name>` (its own jobs), `worker:<worker id>` (the
workers API for that worker id), `service` (daemon-to-daemon and training-process
calls). `gearshift token create --role ...` appends a line and prints the token once;
a daemon reloads the file on SIGHUP (a file that does not parse is refused, naming
the line, and the old table stays).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from gearshift.common.errors import ValidationError

ROLES = ("admin", "tenant", "worker", "service")
_SUBJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Identity:
    role: str
    subject: str = ""  # the tenant, the worker id; empty for admin and service

    def __str__(self) -> str:
        return f"{self.role}:{self.subject}" if self.subject else self.role


ADMIN = Identity("admin")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_role(text: str, field: str = "role") -> Identity:
    """`admin`, `service`, `tenant:<name>` or `worker:<id>`; ValidationError names the problem."""
    role, _, subject = text.partition(":")
    if role not in ROLES:
        raise ValidationError(field, f"{text!r}: the role is one of {', '.join(ROLES)}")
    needs_subject = role in ("tenant", "worker")
    if needs_subject and not _SUBJECT.match(subject):
        raise ValidationError(field, f"{text!r}: {role} needs a name, as in {role}:NAME")
    if not needs_subject and subject:
        raise ValidationError(field, f"{text!r}: {role} takes no name")
    return Identity(role, subject)


def parse_tokens(text: str, source: str) -> dict[str, Identity]:
    """A tokens file's lines as {token hash: identity}."""
    table: dict[str, Identity] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        parts = line.split()
        if len(parts) != 2 or not _HASH.match(parts[0]):
            raise ValidationError(where, "expected '<sha256 of the token, 64 hex> <role>'")
        if parts[0] in table:
            raise ValidationError(where, "this token hash is listed twice")
        table[parts[0]] = parse_role(parts[1], where)
    return table


class TokenTable:
    """The identities a daemon accepts; `reload()` swaps in the file's new content."""

    def __init__(self, path: Path | None = None, extra: dict[str, Identity] | None = None) -> None:
        self.path = path
        self._extra = dict(extra or {})  # e.g. the daemon's own --token, as a service
        self._lock = threading.Lock()
        self._table: dict[str, Identity] = {}
        self.reload()

    def reload(self) -> int:
        """Read the file again; raises ValidationError (keeping the old table) if it is bad."""
        table = dict(self._extra)
        if self.path is not None:
            try:
                text = self.path.read_text()
            except OSError as exc:
                raise ValidationError(str(self.path), f"cannot read: {exc.strerror}") from None
            table.update(parse_tokens(text, str(self.path)))
        with self._lock:
            self._table = table
        return len(table)

    def identify(self, token: str) -> Identity | None:
        digest = hash_token(token)
        with self._lock:
            for known, identity in self._table.items():
                if hmac.compare_digest(known, digest):
                    return identity
        return None


def create_token(path: Path, role: str) -> str:
    """A new random token for `role`, its hash appended to the file (created 0600)."""
    identity = parse_role(role, "--role")
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{hash_token(token)} {identity}\n")
    return token
