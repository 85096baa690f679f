"""The GearshiftJob operator's kopf handlers: `kopf run -m gearshift.client.operator.handlers`
(or `gearshift-operator`, which sets the flags up).

It talks to the scheduler only through the SDK (gRPC), as any client does:
- create: validate the spec (a bad one gets Valid=False with the message and is never
  submitted), upload its code from a ConfigMap if it names one, submit with the object's
  uid as the idempotency key (a retry, or a restarted operator, never submits twice);
- a timer mirrors the job's state into status and its scheduler events as Kubernetes
  Events, until the job ends;
- delete: a finalizer holds the object until the job is cancelled (or has ended).
A scheduler that cannot be reached sets Submitted=False (SchedulerUnavailable) and the
handler is retried every GEARSHIFT_OPERATOR_RETRY_SECONDS until it answers.

Settings from the environment: GEARSHIFT_SCHEDULER (host:port), GEARSHIFT_TOKEN,
GEARSHIFT_TLS_CA (calls use TLS, trusting it) with GEARSHIFT_TLS_CERT and GEARSHIFT_TLS_KEY
(a client certificate, for mTLS) as the CLI reads them; GEARSHIFT_OPERATOR_POLL_SECONDS
(status mirroring, default 5), GEARSHIFT_OPERATOR_RETRY_SECONDS (default 5).
"""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

from gearshift.client.operator.code import CODE_LABEL, code_source, write_code
from gearshift.client.operator.shared_client import SharedClient
from gearshift.client.operator.status import (
    SUBMITTED,
    VALID,
    condition,
    event_record,
    job_conditions,
    job_status,
    merge_conditions,
)
from gearshift.client.options import environment_tls
from gearshift.client.sdk import Client
from gearshift.client.spec import spec_from_dict
from gearshift.common.errors import (
    DeadlineExceededError,
    NotFoundError,
    UnavailableError,
    ValidationError,
)
from gearshift.v1 import common_pb2

GROUP, VERSION, PLURAL = "gearshift.dev", "v1alpha1", "gearshiftjobs"
FINALIZER = "gearshift.dev/finalizer"
ENDED = ("succeeded", "failed", "cancelled")
_UNREACHABLE = (UnavailableError, DeadlineExceededError)


def _seconds(variable: str, default: float) -> float:
    text = os.environ.get(variable, "")
    try:
        value = float(text) if text else default
    except ValueError:
        raise SystemExit(f"{variable}={text!r}: must be a number of seconds") from None
    if value <= 0:
        raise SystemExit(f"{variable}={text!r}: must be > 0")
    return value


# Decorator arguments, hence read when the module is imported (kopf run imports it).
POLL_SECONDS = _seconds("GEARSHIFT_OPERATOR_POLL_SECONDS", 5.0)
RETRY_SECONDS = _seconds("GEARSHIFT_OPERATOR_RETRY_SECONDS", 5.0)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(status: Mapping[str, Any], *updates: dict[str, str]) -> list[dict[str, Any]]:
    return merge_conditions(status.get("conditions") or [], updates, _now())


@kopf.on.startup()
def configure(*, settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Gearshift's own finalizer and annotation prefix; one SDK client for every handler."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # kopf's own handler chatter stays in the log; Events carry the job's story.
    settings.posting.level = logging.WARNING
    address = os.environ.get("GEARSHIFT_SCHEDULER", "127.0.0.1:50051")
    try:
        tls = environment_tls(os.environ)
    except ValidationError as exc:  # a bad file is not retried: the operator does not start
        raise kopf.PermanentError(str(exc)) from None
    token = os.environ.get("GEARSHIFT_TOKEN") or None
    memo.client = SharedClient(Client(address, token, tls=tls, timeout=10.0))


@kopf.on.cleanup()
def close(*, memo: kopf.Memo, **_: Any) -> None:
    memo.client.close()


@kopf.index("", "v1", "configmaps", labels={CODE_LABEL: "true"})
def code_maps(*, namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """ConfigMaps that hold jobs' code (labelled gearshift.dev/code=true), by (ns, name)."""
    return {(namespace, name): {"metadata": {"name": name}, **dict(body)}}


class CodeNotFoundError(Exception):
    """The spec's ConfigMap is not (yet) there: retried, as it may be created after the job."""


def _code_sha256(
    client: Client,
    spec: Mapping[str, Any],
    namespace: str | None,
    code_maps: kopf.Index[Any, Any],
) -> str:
    """Upload the ConfigMap's code (if the spec names one) and return its hash ("": none)."""
    name = code_source(spec)
    if name is None:
        return ""
    found = list(code_maps.get((namespace, name), []))
    if not found:
        raise CodeNotFoundError(
            f"ConfigMap {namespace}/{name} not found (or not labelled {CODE_LABEL}=true)"
        )
    with tempfile.TemporaryDirectory(prefix="gearshift-code-") as folder:
        write_code(found[0], Path(folder))
        return client.upload_code(folder).sha256


def _invalid(body: kopf.Body, status: Mapping[str, Any], patch: kopf.Patch, exc: Exception) -> None:
    message = str(exc)
    patch.status["conditions"] = _conditions(
        status,
        condition(VALID, False, "InvalidSpec", message),
        condition(SUBMITTED, False, "InvalidSpec", "nothing was submitted"),
    )
    kopf.warn(body, reason="InvalidSpec", message=message)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def submit(
    *,
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    namespace: str | None,
    name: str,
    uid: str,
    **kwargs: Any,
) -> None:
    """Submit the job once; a spec changed after that is not resubmitted (a Warning says so)."""
    if status.get("jobId"):
        kopf.warn(
            body,
            reason="SpecIgnored",
            message=f"job {status['jobId']} runs as submitted; delete and create to change it",
        )
        return
    client: Client = memo.client
    data = {key: value for key, value in dict(spec).items() if key != "code"}
    try:
        job_spec = spec_from_dict(data)
        # kopf passes an index by its function's name (not in the handler protocol's types).
        sha = _code_sha256(client, spec, namespace, kwargs["code_maps"])
        if sha:
            job_spec.entrypoint.code_sha256 = sha
        job = client.submit(job_spec, idempotency_key=f"k8s-{uid or f'{namespace}/{name}'}")
    except ValidationError as exc:  # the spec, its code, or the scheduler's own checks
        _invalid(body, status, patch, exc)
        return
    except CodeNotFoundError as exc:
        patch.status["conditions"] = _conditions(
            status,
            condition(VALID, True, "Valid"),
            condition(SUBMITTED, False, "CodeNotFound", str(exc)),
        )
        raise kopf.TemporaryError(str(exc), delay=RETRY_SECONDS) from None
    except _UNREACHABLE as exc:
        message = f"scheduler {client.address} unreachable: {exc}"
        patch.status["conditions"] = _conditions(
            status,
            condition(VALID, True, "Valid"),
            condition(SUBMITTED, False, "SchedulerUnavailable", message),
        )
        raise kopf.TemporaryError(message, delay=RETRY_SECONDS) from None
    patch.status.update(job_status(job))
    patch.status["lastSequence"] = 0
    patch.status["codeSha256"] = job_spec.entrypoint.code_sha256
    patch.status["conditions"] = _conditions(status, *job_conditions(job))
    kopf.info(body, reason="Submitted", message=f"submitted as job {job.job_id}")


def _mirroring(status: kopf.Status, **_: Any) -> bool:
    return bool(status.get("jobId")) and status.get("state") not in ENDED


@kopf.timer(GROUP, VERSION, PLURAL, interval=POLL_SECONDS, when=_mirroring)
def mirror(
    *, body: kopf.Body, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo, **_: Any
) -> None:
    """The job's state into status, its new scheduler events into Kubernetes Events.

    One GetJob a tick; the event stream is read only when the job has new events, and
    status is patched only where it changed (every write is a watch event for every
    watcher of GearshiftJobs)."""
    client: Client = memo.client
    job_id = str(status["jobId"])
    after = int(status.get("lastSequence") or 0)
    try:
        job = client.get(job_id)
        events = client.events(job_id, after_sequence=after) if job.last_sequence > after else []
    except NotFoundError:
        patch.status["conditions"] = _conditions(
            status, condition(SUBMITTED, False, "JobNotFound", f"the scheduler has no {job_id}")
        )
        return
    except _UNREACHABLE as exc:  # tried again at the next tick
        logging.getLogger(__name__).warning("scheduler unreachable: %s", exc)
        return
    for event in events:
        kind, reason, message = event_record(event)
        kopf.event(body, type=kind, reason=reason, message=message)
        after = max(after, event.sequence)
    fresh = {
        **job_status(job),
        "lastSequence": after,
        "conditions": _conditions(status, *job_conditions(job)),
    }
    patch.status.update({key: value for key, value in fresh.items() if status.get(key) != value})


@kopf.on.delete(GROUP, VERSION, PLURAL)
def cancel(
    *,
    body: kopf.Body,
    status: kopf.Status,
    memo: kopf.Memo,
    namespace: str | None,
    name: str,
    **_: Any,
) -> None:
    """Cancel the job before the finalizer lets the object go."""
    job_id = status.get("jobId")
    if not job_id:
        return
    client: Client = memo.client
    try:
        job = client.get(job_id)
        if job.state in (
            common_pb2.JOB_STATE_SUCCEEDED,
            common_pb2.JOB_STATE_FAILED,
            common_pb2.JOB_STATE_CANCELLED,
        ):
            return
        client.cancel(job_id, reason=f"GearshiftJob {namespace}/{name} deleted")
    except NotFoundError:
        return
    except _UNREACHABLE as exc:
        raise kopf.TemporaryError(
            f"cannot cancel {job_id}: scheduler unreachable: {exc}", delay=RETRY_SECONDS
        ) from None
    kopf.info(body, reason="Cancelled", message=f"job {job_id} cancelled")
