"""The life of a daemon process: parse settings, build the servicers, serve, stop cleanly.

Each service's `daemon.py` declares its own options and a `build` function;
everything else (flags common to all daemons, logging, TLS, the ready file,
signal handling, exit codes) is here, once.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gearshift.common.auth import ClientTls, ServerTls
from gearshift.common.config import Option, parse_config
from gearshift.common.errors import ValidationError
from gearshift.common.identity import Identity, JobTokens, TokenTable, hash_token, load_job_key
from gearshift.common.limits import LIMIT_FLAGS, Limits
from gearshift.common.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from gearshift.common.metrics import (
    METRICS_OPTION,
    MetricsEndpoint,
    serve_metrics,
    time_collections,
)
from gearshift.common.rpc_roles import Scopes
from gearshift.common.server import (
    MB,
    AioGrpcServer,
    GrpcServer,
    ServerSettings,
    ServiceRegistration,
)

log = logging.getLogger("gearshift.daemon")
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython: 700)


def limit_options() -> list[Option]:
    """How much one caller may ask of a daemon (the scheduler sets them in its file)."""
    return [
        Option("max_spec_kb", "largest job spec a caller may submit, KiB", 1024, int),
        Option(
            "max_submits_per_second",
            "job submissions a second per caller (tenant or token identity), burst twice that",
            20.0,
            float,
        ),
        Option("max_streams", "open streaming calls (watch, logs) per caller", 64, int),
    ]


def server_options(default_port: int, *, limits: bool = True) -> list[Option]:
    """The options every daemon has: where it listens and how it protects itself."""
    return [*_serving_options(default_port), *(limit_options() if limits else [])]


def _serving_options(default_port: int) -> list[Option]:
    return [
        Option(
            "listen",
            "host:port to serve gRPC on (port 0 picks a free port)",
            f"127.0.0.1:{default_port}",
        ),
        Option(
            "token", "bearer token that every call must carry (empty: no check)", "", secret=True
        ),
        Option(
            "tokens_file",
            "identities and roles: a file of token hashes (gearshift token create); every call "
            "is then checked against the RPC's roles, and --token counts as a service. SIGHUP "
            "reloads it (empty: the single --token, if any, opens everything)",
            "",
        ),
        Option(
            "job_key_file",
            "with --tokens-file: the key (gearshift token job-key) that the scheduler makes each "
            "training process's token with, scoped to its job, and the other daemons check it "
            "with; the same file for the scheduler, the Brain and the shard manager, never "
            "for workers",
            "",
        ),
        Option("tls_cert", "PEM certificate file; with --tls-key enables TLS", ""),
        Option("tls_key", "PEM private key file of --tls-cert", ""),
        Option(
            "tls_client_ca", "PEM CA file; clients must present a certificate it signed (mTLS)", ""
        ),
        Option(
            "tls_ca",
            "PEM CA file that signed the other daemons' certificates: this daemon's own calls "
            "to them use TLS (presenting --tls-cert/--tls-key, for mTLS)",
            "",
        ),
        Option("max_message_mb", "largest request or response, MiB", 64, int),
        Option("grace_seconds", "on SIGTERM, how long in-flight calls may finish", 10.0, float),
        Option("log_level", "log level", "info", choices=LOG_LEVELS),
        Option("log_format", "log line format", "json", choices=LOG_FORMATS),
        Option(
            "ready_file",
            "write {address, pid, metrics} as JSON here once serving (for launchers)",
            "",
        ),
        METRICS_OPTION,
    ]


@dataclass
class Daemon:
    """What a service contributes: its servicers, and hooks around serving.

    With `aio`, the servicers' methods are coroutines served by an
    AioGrpcServer (on_start is then not available: it takes a GrpcServer).
    """

    services: Sequence[ServiceRegistration]
    on_start: Callable[[GrpcServer], None] | None = None
    # Who owns the service's objects (jobs, tasks), for the tenant and worker checks.
    scopes: Callable[[], Scopes | None] = lambda: None
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    # Config files re-read on SIGHUP (beside the tokens file); each logs its own outcome.
    on_reload: list[Callable[[], None]] = field(default_factory=list)
    aio: bool = False
    # Server interceptors of the service's own (GrpcServer only), after the caller's checks.
    interceptors: Sequence[grpc.ServerInterceptor[Any, Any]] = ()


def job_tokens(config: argparse.Namespace) -> JobTokens | None:
    """The --job-key-file's tokens (None without one); ValueError names the flag and file."""
    if not config.job_key_file:
        return None
    try:
        return load_job_key(Path(config.job_key_file))
    except ValidationError as exc:
        raise ValueError(f"--job-key-file: {exc.field}: {exc.problem}") from None


def server_settings(config: argparse.Namespace) -> ServerSettings:
    """ServerSettings from the parsed common options; ValueError names a bad TLS combination."""
    tls = None
    if config.tls_cert or config.tls_key:
        if not (config.tls_cert and config.tls_key):
            raise ValueError("--tls-cert and --tls-key must be given together")
        tls = ServerTls(
            Path(config.tls_cert),
            Path(config.tls_key),
            Path(config.tls_client_ca) if config.tls_client_ca else None,
        )
    elif config.tls_client_ca:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
    if config.max_message_mb <= 0:
        raise ValueError("--max-message-mb must be > 0")
    tokens = None
    if config.job_key_file and not config.tokens_file:
        raise ValueError("--job-key-file needs --tokens-file (job tokens are identities)")
    if config.tokens_file:
        own = {hash_token(config.token): Identity("service")} if config.token else {}
        jobs = job_tokens(config)
        try:
            tokens = TokenTable(Path(config.tokens_file), extra=own, jobs=jobs)
        except ValidationError as exc:
            raise ValueError(f"--tokens-file: {exc.field}: {exc.problem}") from None
    if config.max_spec_kb <= 0 or config.max_streams <= 0:
        raise ValueError("--max-spec-kb and --max-streams must be > 0")
    if config.max_submits_per_second <= 0:
        raise ValueError("--max-submits-per-second must be > 0")
    limits = Limits(
        submits_per_second=config.max_submits_per_second,
        submit_burst=max(1, int(2 * config.max_submits_per_second)),
        streams=config.max_streams,
        spec_bytes=config.max_spec_kb * 1024,
        named=getattr(config, "limits_named", LIMIT_FLAGS),
    )
    return ServerSettings(
        listen=config.listen,
        token=config.token or None,
        tokens=tokens,
        limits=limits,
        tls=tls,
        max_message_bytes=config.max_message_mb * MB,
        grace_seconds=config.grace_seconds,
        rpc_metrics=bool(config.metrics_listen),
    )


def _reload_on_sighup(tokens: TokenTable | None, hooks: Sequence[Callable[[], None]]) -> None:
    """SIGHUP re-reads the tokens file (a bad file is logged and the old table kept) and
    runs the daemon's own reload hooks."""

    def reload(signum: int, frame: object) -> None:
        for hook in hooks:
            hook()
        if tokens is None:
            return
        try:
            count = tokens.reload()
        except ValidationError as exc:
            log.error("tokens file refused; the old one stays", extra={"error": exc.message})
            return
        log.info("tokens file reloaded", extra={"identities": count})

    signal.signal(signal.SIGHUP, reload)


def outgoing_tls(config: argparse.Namespace) -> ClientTls | None:
    """TLS for this daemon's calls to other daemons (None: plaintext, when --tls-ca is unset)."""
    if not config.tls_ca:
        return None
    return ClientTls(
        Path(config.tls_ca),
        Path(config.tls_cert) if config.tls_cert else None,
        Path(config.tls_key) if config.tls_key else None,
    )


def _write_ready_file(path: str, address: str, metrics: str) -> None:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid(), "metrics": metrics}))
    tmp.replace(target)


def run_daemon(
    prog: str,
    description: str,
    options: Sequence[Option],
    build: Callable[[argparse.Namespace], Daemon],
    argv: Sequence[str] | None = None,
    *,
    preset: Mapping[str, object] | None = None,
) -> int:
    """Run a daemon until SIGTERM/SIGINT; returns the process exit code (0 on a clean stop).
    `preset`: settings of the common options that this daemon takes from elsewhere (the
    scheduler's limits come from its configuration file) instead of flags."""
    config = parse_config(prog, description, options, argv)
    for name, value in (preset or {}).items():
        setattr(config, name, value)
    configure_logging(config.log_level, config.log_format)
    try:
        settings = server_settings(config)
        daemon = build(config)
        server: GrpcServer | AioGrpcServer
        if daemon.aio:
            if daemon.on_start is not None or daemon.interceptors:
                raise ValueError("on_start and interceptors need a GrpcServer, not an aio one")
            server = AioGrpcServer(daemon.services, settings)
        else:
            server = GrpcServer(
                daemon.services, settings, scopes=daemon.scopes, interceptors=daemon.interceptors
            )
        endpoint: MetricsEndpoint | None = None
        if config.metrics_listen:
            endpoint = serve_metrics(config.metrics_listen)
            daemon.on_stop.append(endpoint.close)
        server.start()
    except (OSError, RuntimeError, ValueError) as exc:
        log.error("cannot start", extra={"service": prog, "error": str(exc)})
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    if daemon.on_start is not None:
        assert isinstance(server, GrpcServer)
        try:
            daemon.on_start(server)
        except (OSError, RuntimeError, ValueError) as exc:  # e.g. a helper process that failed
            log.error("cannot start", extra={"service": prog, "error": str(exc)})
            print(f"{prog}: error: {exc}", file=sys.stderr)
            for hook in daemon.on_stop:
                hook()
            server.stop()
            return 1
    metrics = endpoint.address if endpoint is not None else ""
    quiet_collector()  # before "ready": a launcher may signal the daemon from then on
    if config.ready_file:
        _write_ready_file(config.ready_file, server.address, metrics)
    log.info("ready", extra={"service": prog, "address": server.address, "metrics": metrics})

    def stop_hooks() -> None:
        for hook in daemon.on_stop:
            hook()

    if settings.tokens is not None or daemon.on_reload:
        _reload_on_sighup(settings.tokens, daemon.on_reload)
    server.serve_until_signal(on_stop=stop_hooks)
    return 0


def quiet_collector() -> None:
    """Keep the cycle collector's full passes off the RPCs' latency.

    A full pass walks every tracked object with the GIL held; under load (a thousand
    heartbeats a second, thousands of queued jobs) the scheduler's took about 100 ms every
    few seconds, which was its RPCs' p99 (bench/load.py). What is alive once the daemon
    is ready (modules, functions, recovered state) is frozen out of those passes, and the
    youngest generation is collected less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    time_collections(
        lambda generation, seconds, collected: log.info(
            "long gc pause",
            extra={"generation": generation, "ms": round(seconds * 1000), "collected": collected},
        )
    )
