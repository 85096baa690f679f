"""`gearshift-operator` (python -m gearshift.client.operator): run the GearshiftJob operator.

Flags set the environment the handlers read (gearshift.client.operator.handlers), then
kopf runs them: against the in-cluster service account, or the kubeconfig outside one. The
token and TLS files come from the environment only (GEARSHIFT_TOKEN, GEARSHIFT_TLS_CA,
GEARSHIFT_TLS_CERT, GEARSHIFT_TLS_KEY), as for the CLI.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

import kopf

from gearshift.client.options import environment_tls
from gearshift.common.errors import ValidationError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gearshift-operator", description=__doc__)
    p.add_argument(
        "--scheduler",
        default=os.environ.get("GEARSHIFT_SCHEDULER", "127.0.0.1:50051"),
        help="scheduler host:port [env GEARSHIFT_SCHEDULER] (default %(default)s)",
    )
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch this namespace (repeatable; a glob such as team-* too); "
        "default: every namespace",
    )
    p.add_argument(
        "--poll-seconds",
        type=float,
        default=float(os.environ.get("GEARSHIFT_OPERATOR_POLL_SECONDS", "5")),
        help="how often a job's status and events are mirrored "
        "[env GEARSHIFT_OPERATOR_POLL_SECONDS] (default %(default)s)",
    )
    p.add_argument(
        "--liveness",
        default="",
        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz",
    )
    p.add_argument(
        "--peering",
        action="store_true",
        help="coordinate replicas through kopf's peering objects (default: standalone, "
        "run one replica)",
    )
    p.add_argument("--verbose", action="store_true", help="debug logging")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.poll_seconds <= 0:
        parser().error("--poll-seconds: must be > 0")
    try:  # checked again by the handlers: here a bad file stops the start before kopf's
        environment_tls(os.environ)
    except ValidationError as exc:
        parser().error(str(exc))
    os.environ["GEARSHIFT_SCHEDULER"] = args.scheduler
    os.environ["GEARSHIFT_OPERATOR_POLL_SECONDS"] = str(args.poll_seconds)
    kopf.configure(verbose=args.verbose)
    importlib.import_module("gearshift.client.operator.handlers")  # registers the handlers
    kopf.run(
        standalone=not args.peering,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
