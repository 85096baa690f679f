"""The RPC-roles table covers every RPC of every service, and its checks, by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gearshift.common.channel import connect
from gearshift.common.errors import NotFoundError, PermissionDeniedError, ValidationError
from gearshift.common.identity import (
    Identity,
    TokenTable,
    create_job_key,
    create_token,
    load_job_key,
    parse_role,
    parse_tokens,
)
from gearshift.common.rpc_roles import RULES, check_request, filter_response, rule_for
from gearshift.common.server import GrpcServer, ServerSettings, register
from gearshift.v1 import (
    brain_pb2,
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    shardmanager_pb2,
    worker_pb2,
)

FILES = (brain_pb2, scheduler_pb2, shardmanager_pb2, worker_pb2)
S = scheduler_pb2


def every_rpc() -> dict[str, bool]:
    """'/package.Service/Method' -> whether its requests are a client stream."""
    return {
        f"/{service.full_name}/{method.name}": method.client_streaming
        for module in FILES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_every_rpc_declares_its_roles_and_nothing_else_is_declared() -> None:
    rpcs = every_rpc()
    assert sorted(set(rpcs) - set(RULES)) == [], "RPCs without roles in rpc_roles.RULES"
    assert sorted(set(RULES) - set(rpcs)) == [], "roles for RPCs that do not exist"
    for method, streaming in rpcs.items():
        rule = RULES[method]
        assert "admin" in rule.roles, method
        if streaming or "ShardManager" in method:
            # Each message of a client stream is checked, and an aio server (the shard
            # manager, the relays) has no owners to look up: only a worker's own id.
            assert rule.scope in ("", "worker"), f"{method}: a scope that needs no owners"


def test_roles_and_scopes() -> None:
    alice, bob = Identity("tenant", "alice"), Identity("tenant", "bob")
    owners = {"job-a": "alice", "job-b": "bob"}

    class Owners:
        def job_tenant(self, job_id: str) -> str | None:
            return owners.get(job_id)

    get = "/gearshift.v1.JobService/GetJob"
    rule = rule_for(alice, get)
    check_request(alice, get, rule, S.GetJobRequest(job_id="job-a"), Owners())
    with pytest.raises(PermissionDeniedError, match="tenant:alice may not see or change job job-b"):
        check_request(alice, get, rule, S.GetJobRequest(job_id="job-b"), Owners())
    with pytest.raises(NotFoundError):
        check_request(alice, get, rule, S.GetJobRequest(job_id="job-x"), Owners())
    with pytest.raises(PermissionDeniedError, match="tenant:alice may not call"):
        rule_for(alice, "/gearshift.v1.WorkerRegistry/RegisterWorker")
    with pytest.raises(PermissionDeniedError, match="no roles are declared"):
        rule_for(Identity("admin"), "/gearshift.v1.JobService/Nope")

    submit = "/gearshift.v1.JobService/SubmitJob"
    request = S.SubmitJobRequest(spec=common_pb2.JobSpec(name="x"))
    check_request(bob, submit, rule_for(bob, submit), request, Owners())
    assert request.spec.tenant == "bob"  # filled in
    request.spec.tenant = "alice"
    with pytest.raises(PermissionDeniedError, match="may not submit as tenant 'alice'"):
        check_request(bob, submit, rule_for(bob, submit), request, Owners())

    listing = S.ListJobsRequest()
    check_request(
        bob,
        "/gearshift.v1.JobService/ListJobs",
        RULES["/gearshift.v1.JobService/ListJobs"],
        listing,
        None,
    )
    assert listing.tenant == "bob"

    w1 = Identity("worker", "w1")
    beat = "/gearshift.v1.WorkerRegistry/Heartbeat"
    check_request(w1, beat, rule_for(w1, beat), S.HeartbeatRequest(worker_id="w1"), None)
    with pytest.raises(PermissionDeniedError, match="worker:w1 may not speak for worker 'w2'"):
        check_request(w1, beat, rule_for(w1, beat), S.HeartbeatRequest(worker_id="w2"), None)
    job_a = Identity("service", "job-a")  # a job's token, as its training processes call
    samples = "/gearshift.v1.Brain/ReportSamples"
    rule = rule_for(job_a, samples)
    check_request(job_a, samples, rule, brain_pb2.ReportSamplesRequest(job_id="job-a"), None)
    with pytest.raises(PermissionDeniedError, match="may not act on job_id 'job-b'"):
        check_request(job_a, samples, rule, brain_pb2.ReportSamplesRequest(job_id="job-b"), None)
    with pytest.raises(PermissionDeniedError, match="a job's token\\) may not call"):
        rule_for(job_a, beat)

    state = S.ClusterState(
        allocations=[
            S.Allocation(job_id="job-a", job_name="a"),
            S.Allocation(job_id="job-b", job_name="b"),
        ]
    )
    cluster = RULES["/gearshift.v1.JobService/GetClusterState"]
    shown = filter_response(alice, cluster, state, Owners())
    assert [(a.job_id, a.job_name) for a in shown.allocations] == [("job-a", "a"), ("", "")]


def test_tokens_file_parsing_creation_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    alice = create_token(path, "tenant:alice")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert alice not in path.read_text()  # only its hash is kept
    made = [create_token(tmp_path / "many", "admin") for _ in range(300)]
    assert not [t for t in made if t.startswith("-")]  # each is a valid `--token` value
    table = TokenTable(path)
    assert table.identify(alice) == Identity("tenant", "alice")
    assert table.identify("guess") is None
    admin = create_token(path, "admin")
    assert table.identify(admin) is None  # not before a reload
    assert table.reload() == 2 and table.identify(admin) == Identity("admin")
    path.write_text(path.read_text() + "not-a-hash admin\n")
    with pytest.raises(ValidationError, match=r"tokens:3: expected"):
        table.reload()
    assert table.identify(admin) == Identity("admin")  # the old table stays
    for bad, problem in [
        ("tenant", "needs a name"),
        ("admin:x", "takes no name"),
        ("root", "the role is one of"),
    ]:
        with pytest.raises(ValidationError, match=problem):
            parse_role(bad)
    with pytest.raises(ValidationError, match="listed twice"):
        parse_tokens(f"{'a' * 64} admin\n{'a' * 64} service\n", "f")


def test_the_job_fields_a_rule_names_exist_on_its_request() -> None:
    """Every field path a rule gives a job's token to check is a string field of the
    method's request (a typo would refuse every training process), on service rules only;
    a client stream names one only on the aio shard manager, which checks each message."""
    services = {
        f"/{service.full_name}/{method.name}": method
        for module in FILES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert [m for m, r in RULES.items() if r.job], "no rule admits a job's token"
    for name, rule in RULES.items():
        method = services[name]
        if not rule.job:
            continue
        assert "service" in rule.roles, name
        assert not method.client_streaming or "ShardManager" in name, name
        for path in rule.job:
            descriptor = method.input_type
            *parents, leaf = path.split(".")
            for part in parents:
                descriptor = descriptor.fields_by_name[part].message_type
            assert (
                descriptor.fields_by_name[leaf].type == descriptor.fields_by_name[leaf].TYPE_STRING
            )


def test_job_tokens_name_their_job_and_cannot_be_forged(tmp_path: Path) -> None:
    key = tmp_path / "job.key"
    create_job_key(key)
    assert key.stat().st_mode & 0o777 == 0o600
    jobs = load_job_key(key)
    token = jobs.mint("job-a.b")  # a dot in the job id too
    assert jobs.verify(token) == "job-a.b"
    table = TokenTable(extra={}, jobs=jobs)
    assert table.identify(token) == Identity("service", "job-a.b")
    assert Identity("service", "job-a.b").job == "job-a.b" and not Identity("service").job
    assert not Identity("tenant", "alice").job
    for forged in (
        token[:-1] + ("0" if token[-1] != "0" else "1"),  # another MAC
        token.replace("job-a.b", "job-b.b"),  # another job, the same MAC
        "gsjob.job-a",  # no MAC
        "gsjob..",
    ):
        assert jobs.verify(forged) is None, forged
        assert table.identify(forged) is None
    other = tmp_path / "other.key"
    create_job_key(other)
    assert jobs.verify(load_job_key(other).mint("job-a.b")) is None
    assert TokenTable(extra={}).identify(token) is None  # a daemon without the key
    with pytest.raises(ValidationError, match="exists already"):
        create_job_key(key)
    bad = tmp_path / "bad.key"
    bad.write_text("not hex\n")
    with pytest.raises(ValidationError, match="expected a job key"):
        load_job_key(bad)


def test_a_jobs_token_passes_only_rules_that_name_its_job() -> None:
    job = Identity("service", "job-a")
    acquire = "/gearshift.v1.ShardManager/AcquireShard"
    rule = rule_for(job, acquire)
    check_request(
        job, acquire, rule, shardmanager_pb2.AcquireShardRequest(dataset_id="job-a"), None
    )
    check_request(
        job, acquire, rule, shardmanager_pb2.AcquireShardRequest(dataset_id="job-a/extra"), None
    )
    for other in ("job-b", "job-ab", "job-a-x", ""):
        with pytest.raises(PermissionDeniedError, match="its token is for job job-a"):
            check_request(
                job, acquire, rule, shardmanager_pb2.AcquireShardRequest(dataset_id=other), None
            )
    with pytest.raises(PermissionDeniedError, match=r"\(a job's token\) may not call"):
        rule_for(job, "/gearshift.v1.WorkerAgent/StartTask")
    with pytest.raises(PermissionDeniedError, match="may not call"):
        rule_for(Identity("worker", "w1"), acquire)  # the data is the job's, not the worker's


def test_rubick_rpcs_scope_named_jobs_only() -> None:
    """A tenant fits its own jobs' models (or a shared model key); a job's token only its own."""
    alice = Identity("tenant", "alice")
    owners = {"job-a": "alice", "job-b": "bob"}

    class Owners:
        def job_tenant(self, job_id: str) -> str | None:
            return owners.get(job_id)

    fit = "/gearshift.v1.Brain/FitModel"
    rule = rule_for(alice, fit)
    check_request(alice, fit, rule, brain_pb2.FitModelRequest(job_id="job-a"), Owners())
    check_request(alice, fit, rule, brain_pb2.FitModelRequest(model_key="gpt2"), Owners())
    with pytest.raises(PermissionDeniedError, match="may not see or change job job-b"):
        check_request(alice, fit, rule, brain_pb2.FitModelRequest(job_id="job-b"), Owners())
    with pytest.raises(NotFoundError):
        check_request(alice, fit, rule, brain_pb2.FitModelRequest(job_id="job-x"), Owners())
    token = Identity("service", "job-a")
    store = "/gearshift.v1.Brain/StoreRubickProfile"
    rule = rule_for(token, store)
    request = brain_pb2.StoreRubickProfileRequest(job_id="job-a")
    check_request(token, store, rule, request, None)
    for other in (
        brain_pb2.StoreRubickProfileRequest(job_id="job-b"),
        brain_pb2.StoreRubickProfileRequest(model_key="gpt2"),
    ):
        with pytest.raises(PermissionDeniedError, match="its token is for job job-a"):
            check_request(token, store, rule, other, None)


def test_a_sync_server_checks_each_message_of_a_scoped_client_stream(tmp_path: Path) -> None:
    """A client stream whose rule has a scope (HeartbeatStream: a worker's own id) is checked
    message by message on a thread-pool server too: its own id passes, another's ends the
    stream PERMISSION_DENIED naming it, before the servicer sees that message."""
    seen: list[str] = []

    class Echo(scheduler_pb2_grpc.WorkerRegistryServicer):
        def HeartbeatStream(
            self, request_iterator: Iterator[S.HeartbeatRequest], context: grpc.ServicerContext
        ) -> Iterator[S.HeartbeatResponse]:
            for request in request_iterator:
                seen.append(request.worker_id)
                yield S.HeartbeatResponse()

    echo = Echo()  # type: ignore[abstract]  # the one method this test calls
    path = tmp_path / "tokens"
    token = create_token(path, "worker:w1")
    service = scheduler_pb2.DESCRIPTOR.services_by_name["WorkerRegistry"].full_name
    server = GrpcServer(
        [register(scheduler_pb2_grpc.add_WorkerRegistryServicer_to_server, echo, service)],
        ServerSettings(tokens=TokenTable(path)),
    )
    server.start()
    try:
        with connect(server.address, token=token) as channel:
            replies = scheduler_pb2_grpc.WorkerRegistryStub(channel).HeartbeatStream(
                iter([S.HeartbeatRequest(worker_id="w1"), S.HeartbeatRequest(worker_id="w2")])
            )
            with pytest.raises(grpc.RpcError) as info:
                list(replies)
    finally:
        server.stop(0)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "w2" in (info.value.details() or "")
    assert seen == ["w1"]
