"""Which identities may call each RPC, and on which objects: one table for every service.

Every RPC of every service has a Rule (tests/unit/test_rpc_roles.py fails for one that
has none, and the interceptor refuses a method it does not find: fail closed). A rule
names the roles allowed and, for roles limited to their own objects, the scope:

- `job`: a tenant's calls about a job (`job_id`) pass only for its own jobs;
- `named_job`: likewise when the request names a job (`job_id` not empty); one about a
  model key instead (the Brain's Rubick models) passes, as layer profiles do;
- `submit`: a tenant submits as itself (`spec.tenant` empty is filled in, another is
  refused); `list`: a tenant lists its own jobs (the `tenant` filter likewise);
- `worker`: a worker identity speaks only for its own `worker_id`;
- `cluster`: a tenant sees other tenants' jobs in the cluster state only as counts
  (their allocations' job ids and names are blanked).

Admin and service pass every scope. A job's token (`service:<job id>`, minted by the
scheduler for a training process) passes only the rules that name where the request says
which job it is about (`job`: the job id, or a dataset id, which is the job's own id or
starts with it and "/"), and only for its own job; each message of a request stream is
checked. `mutates` marks the calls the audit log records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gearshift.common.errors import NotFoundError, PermissionDeniedError
from gearshift.common.identity import Identity

ADMIN, TENANT, WORKER, SERVICE = "admin", "tenant", "worker", "service"


class Scopes(Protocol):
    """What a service knows of its objects' owners (the scheduler provides it)."""

    def job_tenant(self, job_id: str) -> str | None: ...


@dataclass(frozen=True)
class Rule:
    roles: frozenset[str]
    scope: str = ""  # "", job, named_job, submit, list, worker, cluster
    mutates: bool = False
    job: tuple[str, ...] = ()  # the request's fields that name its job, for a job's token


def _rule(*roles: str, scope: str = "", mutates: bool = False, job: str = "") -> Rule:
    return Rule(frozenset({ADMIN, *roles}), scope, mutates, tuple(job.split()) if job else ())


_DATASET = "dataset_id"  # the training processes' data: a job's token, for its own datasets


_JOBS = "/gearshift.v1.JobService/"
_REGISTRY = "/gearshift.v1.WorkerRegistry/"
_AGENT = "/gearshift.v1.WorkerAgent/"
_BRAIN = "/gearshift.v1.Brain/"
_SHARDS = "/gearshift.v1.ShardManager/"

RULES: Mapping[str, Rule] = {
    _JOBS + "SubmitJob": _rule(TENANT, scope="submit", mutates=True),
    _JOBS + "GetJob": _rule(TENANT, scope="job"),
    _JOBS + "ListJobs": _rule(TENANT, scope="list"),
    _JOBS + "CancelJob": _rule(TENANT, scope="job", mutates=True),
    _JOBS + "WatchJob": _rule(TENANT, scope="job"),
    _JOBS + "GetClusterState": _rule(TENANT, SERVICE, scope="cluster"),
    _JOBS + "StreamJobLogs": _rule(TENANT, scope="job"),
    _JOBS + "StreamJobSteps": _rule(TENANT, scope="job"),
    _JOBS + "HasCode": _rule(TENANT),
    _JOBS + "UploadCode": _rule(TENANT, mutates=True),
    _JOBS + "ScaleJob": _rule(TENANT, scope="job", mutates=True),
    _REGISTRY + "RegisterWorker": _rule(WORKER, SERVICE, scope="worker", mutates=True),
    _REGISTRY + "Heartbeat": _rule(WORKER, SERVICE, scope="worker"),
    _REGISTRY + "RenewLease": _rule(WORKER, SERVICE, scope="worker"),
    _REGISTRY + "TaskFinished": _rule(WORKER, SERVICE, scope="worker", mutates=True),
    _REGISTRY + "FetchCode": _rule(WORKER, SERVICE),
    _REGISTRY + "HeartbeatBatch": _rule(SERVICE),  # the scheduler's relays
    _REGISTRY + "HeartbeatStream": _rule(WORKER, SERVICE, scope="worker"),  # at relays
    _AGENT + "StartTask": _rule(SERVICE, mutates=True),
    _AGENT + "StopTask": _rule(SERVICE, mutates=True),
    _AGENT + "ChangeMembership": _rule(SERVICE, mutates=True),
    _AGENT + "GetTaskStatus": _rule(SERVICE),
    _AGENT + "DescribeWorker": _rule(SERVICE),
    _AGENT + "StreamTaskLogs": _rule(SERVICE),
    _AGENT + "ReadStepLog": _rule(SERVICE),
    _BRAIN + "ReportJobEvent": _rule(SERVICE, mutates=True),
    _BRAIN + "ReportSamples": _rule(SERVICE, job="job_id"),  # from training processes
    _BRAIN + "GetJobHistory": _rule(SERVICE),
    _BRAIN + "ListJobRecords": _rule(SERVICE),
    _BRAIN + "EstimateThroughput": _rule(SERVICE),
    _BRAIN + "PlanResources": _rule(SERVICE, mutates=True),
    _BRAIN + "PlanEsts": _rule(SERVICE),
    # Layer profiles are not a tenant's private data (a key is a digest of a job's code and
    # config); a tenant profiles its own jobs (`gearshift profile`) and asks for plans.
    _BRAIN + "StoreLayerProfile": _rule(TENANT, SERVICE, mutates=True, job="job_id"),
    _BRAIN + "GetLayerProfile": _rule(TENANT, SERVICE),
    _BRAIN + "PlanBurstParallel": _rule(TENANT, SERVICE),
    # Rubick's models: the scheduler's, a tenant's for its own jobs (or a shared model key),
    # and a job's token for its own job (its profiling run stores, fits and asks).
    _BRAIN + "StoreRubickProfile": _rule(
        TENANT, SERVICE, scope="named_job", mutates=True, job="job_id"
    ),
    _BRAIN + "FitModel": _rule(TENANT, SERVICE, scope="named_job", mutates=True, job="job_id"),
    _BRAIN + "PredictPlan": _rule(TENANT, SERVICE, scope="named_job", job="job_id"),
    _BRAIN + "GetSensitivity": _rule(TENANT, SERVICE, scope="named_job", job="job_id"),
    _SHARDS + "CreateDataset": _rule(SERVICE, mutates=True, job="dataset_id config.job_id"),
    _SHARDS + "DescribeDataset": _rule(SERVICE, job=_DATASET),
    _SHARDS + "DeleteDataset": _rule(SERVICE, mutates=True, job=_DATASET),
    _SHARDS + "DeleteJobDatasets": _rule(SERVICE, mutates=True),
    _SHARDS + "AcquireShard": _rule(SERVICE, job=_DATASET),
    _SHARDS + "StreamShards": _rule(SERVICE, job="acquire.dataset_id"),  # each message
    _SHARDS + "AckShard": _rule(SERVICE, job=_DATASET),
    _SHARDS + "CoverShards": _rule(SERVICE, job=_DATASET),
    _SHARDS + "RenewLeases": _rule(SERVICE, job=_DATASET),
    _SHARDS + "ReleaseHolder": _rule(SERVICE, job=_DATASET),
    _SHARDS + "GetShardsAt": _rule(SERVICE, job=_DATASET),
    _SHARDS + "CheckpointDataset": _rule(SERVICE, mutates=True, job=_DATASET),
    _SHARDS + "RestoreDataset": _rule(SERVICE, mutates=True, job=_DATASET),
}


def rule_for(identity: Identity, method: str) -> Rule:
    """The method's rule if the identity's role may call it; PermissionDeniedError else."""
    rule = RULES.get(method)
    if rule is None:
        raise PermissionDeniedError(f"{method}: no roles are declared for it; refused")
    if identity.role not in rule.roles:
        raise PermissionDeniedError(f"{identity} may not call {method}")
    if identity.job and not rule.job:
        raise PermissionDeniedError(f"{identity} (a job's token) may not call {method}")
    return rule


def check_job(identity: Identity, rule: Rule, message: Any) -> None:
    """A job's token acts for its own job only: every field the rule names must be it."""
    job = identity.job
    for path in rule.job:
        value: Any = message
        for name in path.split("."):
            value = getattr(value, name)
        if value != job and not str(value).startswith(job + "/"):
            raise PermissionDeniedError(
                f"{identity} may not act on {path} {value!r}: its token is for job {job}"
            )


def check_request(
    identity: Identity, method: str, rule: Rule, request: Any, scopes: Scopes | None
) -> None:
    """Refuse a call on another's object; fill in a tenant's own name where it was left out."""
    if identity.job:
        check_job(identity, rule, request)
        return
    if identity.role in (ADMIN, SERVICE) or not rule.scope:
        return
    who = identity.subject
    if rule.scope == "named_job" and not request.job_id:
        return  # about a model key, not a job
    if rule.scope in ("job", "named_job") and identity.role == TENANT:
        owner = scopes.job_tenant(request.job_id) if scopes else None
        if owner is None:
            raise NotFoundError("job", request.job_id)
        if owner != who:
            raise PermissionDeniedError(f"{identity} may not see or change job {request.job_id}")
    elif rule.scope == "submit":
        if not request.spec.tenant:
            request.spec.tenant = who
        elif request.spec.tenant != who:
            raise PermissionDeniedError(
                f"{identity} may not submit as tenant {request.spec.tenant!r}"
            )
    elif rule.scope == "list":
        if not request.tenant:
            request.tenant = who
        elif request.tenant != who:
            raise PermissionDeniedError(f"{identity} may not list tenant {request.tenant!r}'s jobs")
    elif rule.scope == "worker" and request.worker_id != who:
        raise PermissionDeniedError(f"{identity} may not speak for worker {request.worker_id!r}")


def filter_response(identity: Identity, rule: Rule, response: Any, scopes: Scopes | None) -> Any:
    """What a tenant may see of a reply: other tenants' jobs only as counts."""
    if rule.scope != "cluster" or identity.role != TENANT:
        return response
    for allocation in response.allocations:
        owner = scopes.job_tenant(allocation.job_id) if scopes else None
        if owner != identity.subject:
            allocation.job_id = ""
            allocation.job_name = ""
    return response
