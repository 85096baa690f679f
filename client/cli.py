"""The `gearshift` command line.

Exit codes: 0 success; 1 the operation failed (an unhealthy daemon, a server
error); 2 bad usage or input (argparse's convention).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gearshift import __version__
from gearshift.client.processes import SERVICES, DaemonError, DaemonProcess, start_daemon
from gearshift.common.health import health_status
from gearshift.common.signals import wait_for_signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _print_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_health(args: argparse.Namespace) -> int:
    rows = [(address, health_status(address, timeout=args.timeout)) for address in args.addresses]
    _print_table(rows, ("ADDRESS", "HEALTH"))
    return EXIT_OK if all(status == "SERVING" for _, status in rows) else EXIT_FAILED


def _stop_all(daemons: Sequence[DaemonProcess]) -> list[tuple[str, int]]:
    # Workers first, the scheduler last: nothing calls a daemon that already left.
    return [(d.name, d.stop()) for d in reversed(daemons)]


def cmd_up(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    daemons: list[DaemonProcess] = []
    print(f"gearshift up: starting {', '.join(SERVICES)} (logs in {run_dir}/)", flush=True)
    try:
        for offset, name in enumerate(SERVICES):
            port = args.base_port + offset if args.base_port else 0
            daemons.append(start_daemon(name, run_dir=run_dir, listen=f"{args.host}:{port}"))
        for daemon in daemons:
            daemon.wait_ready(timeout=args.timeout)
    except (DaemonError, TimeoutError) as exc:
        print(f"gearshift up: {exc}", file=sys.stderr)
        _stop_all(daemons)
        return EXIT_FAILED

    rows = [(d.name, d.address, health_status(d.address), str(d.log_path)) for d in daemons]
    _print_table(rows, ("SERVICE", "ADDRESS", "HEALTH", "LOG"))
    healthy = all(row[2] == "SERVING" for row in rows)
    print(f"{sum(row[2] == 'SERVING' for row in rows)}/{len(rows)} daemons healthy.", flush=True)
    if args.check or not healthy:
        stopped = _stop_all(daemons)
        clean = all(code == 0 for _, code in stopped)
        print("stopped: " + ", ".join(f"{name} (exit {code})" for name, code in stopped))
        return EXIT_OK if healthy and clean else EXIT_FAILED

    print("Press Ctrl-C to stop the cluster.", flush=True)
    try:
        wait_for_signal()
    finally:
        stopped = _stop_all(daemons)
        print("\nstopped: " + ", ".join(f"{name} (exit {code})" for name, code in stopped))
    return EXIT_OK


SIMULATOR_MODULE = "gearshift.scheduler.simulate"


def cmd_simulate(argv: Sequence[str]) -> int:
    """Run the scheduler's simulator as a subprocess (the client imports no service package)
    and pass its exit code through; needs the `scheduler` extra installed."""
    return subprocess.call([sys.executable, "-m", SIMULATOR_MODULE, *argv])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gearshift",
        description="Gearshift: elastic, bitwise-deterministic training on shared GPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"gearshift {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="run the dev cluster as local processes",
        description="Start every daemon on this machine, wait until each serves, print their "
        "addresses, and stop them all on Ctrl-C.",
    )
    up.add_argument("--host", default="127.0.0.1", help="interface the daemons listen on")
    up.add_argument(
        "--base-port",
        type=int,
        default=50051,
        help="scheduler port; brain, shard manager and worker take the next ones (0: free ports)",
    )
    up.add_argument("--run-dir", default=".gearshift/run", help="folder for logs and state")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each daemon")
    up.add_argument(
        "--check", action="store_true", help="start, print health, stop (exit 0 if all healthy)"
    )
    up.set_defaults(func=cmd_up)

    health = sub.add_parser(
        "health",
        help="show the gRPC health of daemons",
        description="Ask each daemon for its health; exit 0 only if all are SERVING.",
    )
    health.add_argument("addresses", nargs="+", metavar="HOST:PORT")
    health.add_argument("--timeout", type=float, default=2.0, help="seconds per daemon")
    health.set_defaults(func=cmd_health)

    sub.add_parser(
        "simulate",
        help="simulate a workload with the scheduler's policies (see `gearshift simulate -h`)",
        description="Forwarded to python -m gearshift.scheduler.simulate.",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["simulate"]:
        return cmd_simulate(arguments[1:])
    args = build_parser().parse_args(arguments)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
