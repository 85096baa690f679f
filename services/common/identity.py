"""Who is calling: bearer tokens mapped to identities with roles, from a tokens file.

The file holds one token a line, never the token itself, only its SHA-256:

    # sha256-of-token                                                 role[:subject]
    9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  admin
    2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae  tenant:alice
    fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9  worker:node-1
    baa5a0964d3320fbc0c6a922140453c8513ea24ab8fd0577034804a967248096  service

Roles: `admin` (everything), `tenant:<name>` (its own jobs), `worker:<worker id>` (the
workers API for that worker id), `service` (daemon-to-daemon calls). `gearshift token
create --role ...` appends a line and prints the token once; a daemon reloads the file
on SIGHUP (a file that does not parse is refused, naming the line, and the old table
stays).

A training process calls as its job: `service:<job id>`, a service scoped to that one
job. Its token is minted by the scheduler for each task (`JobTokens`, an HMAC of the job
id under a key that the control-plane daemons share, `--job-key-file`, and workers never
see) and handed to the worker with StartTask; the other daemons check it with the same
key, with no table to keep.
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
    subject: str = ""  # the tenant, the worker id, a job's service's job; empty: admin, service

    def __str__(self) -> str:
        return f"{self.role}:{self.subject}" if self.subject else self.role

    @property
    def job(self) -> str:
        """The job a job's token speaks for ("" for every other identity)."""
        return self.subject if self.role == "service" else ""


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


JOB_TOKEN_PREFIX = "gsjob."
# A random urlsafe token starts with "-" one time in 64, and `--token -x...` is then an
# argparse usage error; a fixed prefix also lets secret scanners recognise a token.
TOKEN_PREFIX = "gstok."
JOB_KEY_BYTES = 32


class JobTokens:
    """Tokens that name one job, made and checked with a key the control plane shares."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a job key has at least 16 bytes")
        self._key = key

    def _mac(self, job_id: str) -> str:
        return hmac.new(self._key, f"gearshift-job:{job_id}".encode(), hashlib.sha256).hexdigest()

    def mint(self, job_id: str) -> str:
        return f"{JOB_TOKEN_PREFIX}{job_id}.{self._mac(job_id)}"

    def verify(self, token: str) -> str | None:
        """The job a token was minted for, or None for a token that is not a valid one."""
        job_id, dot, mac = token.removeprefix(JOB_TOKEN_PREFIX).rpartition(".")
        if not token.startswith(JOB_TOKEN_PREFIX) or not dot or not _SUBJECT.match(job_id):
            return None
        return job_id if hmac.compare_digest(mac, self._mac(job_id)) else None


def load_job_key(path: Path) -> JobTokens:
    """The key file `create_job_key` writes (64 hex digits); ValidationError names the file."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ValidationError(str(path), f"cannot read: {exc.strerror}") from None
    if not re.fullmatch(r"[0-9a-f]{32,128}", text):
        raise ValidationError(str(path), "expected a job key: 32-128 hex digits on one line")
    return JobTokens(bytes.fromhex(text))


def create_job_key(path: Path) -> None:
    """A new random job key in a new file (0600); refuses to overwrite one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ValidationError(
            str(path), "exists already; a new key would void every job token"
        ) from None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(JOB_KEY_BYTES) + "\n")


class TokenTable:
    """The identities a daemon accepts; `reload()` swaps in the file's new content."""

    def __init__(
        self,
        path: Path | None = None,
        extra: dict[str, Identity] | None = None,
        jobs: JobTokens | None = None,
    ) -> None:
        self.path = path
        self.jobs = jobs  # job tokens are known when the daemon has the job key
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
        if token.startswith(JOB_TOKEN_PREFIX):
            job_id = self.jobs.verify(token) if self.jobs is not None else None
            return Identity("service", job_id) if job_id else None
        digest = hash_token(token)
        with self._lock:
            for known, identity in self._table.items():
                if hmac.compare_digest(known, digest):
                    return identity
        return None


def create_token(path: Path, role: str) -> str:
    """A new random token for `role`, its hash appended to the file (created 0600)."""
    identity = parse_role(role, "--role")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{hash_token(token)} {identity}\n")
    return token
