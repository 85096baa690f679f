"""The Brain daemon as a real process over real gRPC, on the real PostgreSQL and on SQLite:
ingest, history, listing, estimates, resource and EST plans, bad input, subcommands."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from gearshift.common import codepkg
from gearshift.common.channel import connect
from gearshift.common.db import create_engine
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2
from tests.conftest import DaemonFactory

GIB = 1024**3


@pytest.fixture
def brain(
    daemons: DaemonFactory, db_url: str, gavel_data: Path
) -> Iterator[brain_pb2_grpc.BrainStub]:
    daemon = daemons(
        "brain",
        [
            "--database-url",
            db_url,
            "--reference-throughputs",
            str(gavel_data / "simulation_throughputs.json"),
        ],
    )
    with connect(daemon.address, retry=False) as channel:
        yield brain_pb2_grpc.BrainStub(channel)


def spec(name: str = "j", model: str = "wd", dataset: str = "criteo", ests: int = 4):
    return common_pb2.JobSpec(
        name=name,
        tenant="team-a",
        model_type=model,
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=ests,
        global_batch_size=ests * 8,
        total_steps=100,
        dataset=common_pb2.DatasetSpec(name=dataset, size=1000, shard_size=10),
    )


def submit(stub, job_id: str, **kw) -> None:
    reply = stub.ReportJobEvent(
        brain_pb2.ReportJobEventRequest(
            event_id=f"{job_id}-submitted",
            job_id=job_id,
            kind=brain_pb2.JOB_EVENT_KIND_SUBMITTED,
            spec=spec(job_id, **kw),
        )
    )
    assert reply.recorded


def event(stub, job_id: str, kind: brain_pb2.JobEventKind.ValueType, **kw) -> bool:
    return bool(
        stub.ReportJobEvent(
            brain_pb2.ReportJobEventRequest(
                event_id=f"{job_id}-{kind}-{kw.get('node', brain_pb2.JobNode()).node_id}",
                job_id=job_id,
                kind=kind,
                **kw,
            )
        ).recorded
    )


def samples(n: int, rate: float, start: int = 0, kind: str = "v100", count: int = 2, **kw):
    now = time.time()
    return [
        brain_pb2.RuntimeSample(
            time=now + i,
            step=start + i,
            steps_per_second=rate,
            accelerator_type=kind,
            device_count=count,
            **kw,
        )
        for i in range(n)
    ]


def report(stub, batch: str, job_id: str, rows) -> int:
    return int(
        stub.ReportSamples(
            brain_pb2.ReportSamplesRequest(batch_id=batch, job_id=job_id, samples=rows)
        ).accepted
    )


def test_ingest_history_estimates_and_plans(brain) -> None:
    stub = brain
    submit(stub, "past")
    assert event(stub, "past", brain_pb2.JOB_EVENT_KIND_STARTED)
    node = brain_pb2.JobNode(
        node_id="worker-0",
        role=brain_pb2.NODE_ROLE_WORKER,
        resources=common_pb2.Resources(cpu_cores=3, memory_bytes=2 * GIB),
    )
    assert event(stub, "past", brain_pb2.JOB_EVENT_KIND_NODE_STARTED, node=node)
    plan = stub.PlanResources(
        brain_pb2.PlanResourcesRequest(
            job_id="past",
            stage=brain_pb2.PLAN_STAGE_OPTIMIZE,
            cpu_total=200,
            cpu_max_per_node=32,
            metrics=brain_pb2.PsJobMetrics(
                worker_cores_needed=2.5, ps_cores_per_worker=5.7, steps_per_second=12
            ),
        )
    )
    assert (plan.workers.count, plan.workers.cpu_cores, plan.ps.count, plan.ps.cpu_cores) == (
        24,
        3,
        8,
        16,
    )
    assert plan.plan_id and plan.source == brain_pb2.PLAN_SOURCE_OPTIMIZER
    rows = samples(100, 10.0, node_id="worker-0", memory_bytes_used=GIB)
    assert report(stub, "past-1", "past", rows) == 100
    assert report(stub, "past-1", "past", rows) == 0  # retried batch
    assert event(stub, "past", brain_pb2.JOB_EVENT_KIND_SUCCEEDED)

    history = stub.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id="past", max_samples=5))
    assert history.job.status == "succeeded" and history.job.spec.model_type == "wd"
    assert [s.step for s in history.samples] == [95, 96, 97, 98, 99]
    assert [n.node_id for n in history.nodes] == ["worker-0"]
    assert [p.plan_id for p in history.plans] == [plan.plan_id]
    assert history.plans[0].plan.workers.count == 24

    submit(stub, "new")
    initial = stub.PlanResources(
        brain_pb2.PlanResourcesRequest(
            job_id="new", stage=brain_pb2.PLAN_STAGE_INITIAL, cpu_total=200, cpu_max_per_node=32
        )
    )
    assert initial.source == brain_pb2.PLAN_SOURCE_HISTORY and "past" in initial.reason
    assert (initial.workers.count, initial.ps.count) == (24, 8)
    assert initial.workers.memory_bytes == math.ceil(GIB * 1.2 / 2**20) * 2**20  # observed

    listed = stub.ListJobRecords(
        brain_pb2.ListJobRecordsRequest(model_type="wd", page=common_pb2.PageRequest(page_size=1))
    )
    assert [j.job_id for j in listed.jobs] == ["new"] and listed.next_page_token
    rest = stub.ListJobRecords(
        brain_pb2.ListJobRecordsRequest(
            model_type="wd", page=common_pb2.PageRequest(page_token=listed.next_page_token)
        )
    )
    assert [j.job_id for j in rest.jobs] == ["past"] and not rest.next_page_token

    history_estimate = stub.EstimateThroughput(
        brain_pb2.EstimateThroughputRequest(job_id="new", accelerator_type="v100", device_count=2)
    )
    assert history_estimate.source == brain_pb2.ESTIMATE_SOURCE_MODEL_HISTORY
    assert history_estimate.steps_per_second == pytest.approx(10.0)
    report(stub, "new-1", "new", samples(10, 14.0))
    own = stub.EstimateThroughput(
        brain_pb2.EstimateThroughputRequest(job_id="new", accelerator_type="v100", device_count=2)
    )
    assert own.source == brain_pb2.ESTIMATE_SOURCE_OWN_SAMPLES
    assert own.steps_per_second == pytest.approx(14.0)
    completed = stub.EstimateThroughput(
        brain_pb2.EstimateThroughputRequest(job_id="new", accelerator_type="k80", device_count=4)
    )
    assert completed.source == brain_pb2.ESTIMATE_SOURCE_MATRIX_COMPLETION
    assert completed.relative_error > 0 and "nearest references" in completed.detail
    reference = stub.EstimateThroughput(
        brain_pb2.EstimateThroughputRequest(
            model_type="resnet-18-bs16", accelerator_type="v100", device_count=1
        )
    )
    assert reference.source == brain_pb2.ESTIMATE_SOURCE_MATRIX_COMPLETION
    assert reference.steps_per_second == pytest.approx(32.353, abs=1e-3)
    default = stub.EstimateThroughput(
        brain_pb2.EstimateThroughputRequest(
            model_type="unknown-model", accelerator_type="t4", device_count=1
        )
    )
    assert default.source == brain_pb2.ESTIMATE_SOURCE_DEFAULT
    assert (default.steps_per_second, default.relative_error) == (1.0, 1.0)


def test_plan_ests_rpc(brain) -> None:
    stub = brain
    # 2 V100 (C=2) + 1 P100 (C=1), 4 ESTs: both V100s with 2 ESTs each, 4 mini-batches/s.
    plan = stub.PlanEsts(
        brain_pb2.PlanEstsRequest(
            num_ests=4,
            devices=[
                brain_pb2.DeviceCapability(
                    accelerator_type="v100", available=2, minibatches_per_second=2
                ),
                brain_pb2.DeviceCapability(
                    accelerator_type="p100", available=1, minibatches_per_second=1
                ),
            ],
        )
    )
    assert [(a.accelerator_type, list(a.ests_per_device)) for a in plan.assignments] == [
        ("v100", [2, 2])
    ]
    assert plan.predicted_minibatches_per_second == pytest.approx(4.0)
    # Running on 2 V100s with 8 ESTs: +2 V100 doubles the speed, the best proposal.
    grown = stub.PlanEsts(
        brain_pb2.PlanEstsRequest(
            num_ests=8,
            devices=[
                brain_pb2.DeviceCapability(
                    accelerator_type="v100", available=2, minibatches_per_second=2
                ),
                brain_pb2.DeviceCapability(
                    accelerator_type="p100", available=2, minibatches_per_second=1
                ),
            ],
            current=[common_pb2.DeviceGroup(accelerator_type="v100", count=2)],
            top_k=3,
        )
    )
    assert grown.predicted_minibatches_per_second == pytest.approx(4.0)
    assert len(grown.proposals) == 3
    best = grown.proposals[0]
    assert (best.accelerator_type, best.additional_devices) == ("v100", 2)
    assert best.speedup == pytest.approx(2.0)
    assert sum(sum(a.ests_per_device) for a in best.assignments) == 8
    # A capability of 0 is estimated from the job's samples: 3 steps/s x 2 ESTs per device.
    submit(stub, "est", ests=4)
    report(stub, "est-1", "est", samples(10, 3.0, ests_per_device=[2, 2]))
    estimated = stub.PlanEsts(
        brain_pb2.PlanEstsRequest(
            job_id="est",
            num_ests=4,
            devices=[brain_pb2.DeviceCapability(accelerator_type="v100", available=4)],
        )
    )
    assert estimated.estimated[0].minibatches_per_second == pytest.approx(6.0)
    assert estimated.estimated[0].source == brain_pb2.ESTIMATE_SOURCE_OWN_SAMPLES
    assert estimated.predicted_minibatches_per_second == pytest.approx(24.0)


def _rows(url: str, table: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"select count(*) from {table}")).scalar_one())
    finally:
        engine.dispose()


def _fails(call, request, code: grpc.StatusCode, field: str) -> None:
    with pytest.raises(grpc.RpcError) as exc:
        call(request)
    details = str(exc.value.details())
    assert exc.value.code() == code, details
    assert field in details, details


def test_bad_input_names_the_field_and_writes_nothing(brain, db_url: str) -> None:
    stub = brain
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    malformed = spec("bad")
    malformed.ClearField("entrypoint")
    _fails(
        stub.ReportJobEvent,
        brain_pb2.ReportJobEventRequest(
            event_id="e1", job_id="bad", kind=brain_pb2.JOB_EVENT_KIND_SUBMITTED, spec=malformed
        ),
        invalid,
        "spec.entrypoint: is required",
    )
    no_ests = spec("bad")
    no_ests.num_ests = 0
    _fails(
        stub.ReportJobEvent,
        brain_pb2.ReportJobEventRequest(
            event_id="e2", job_id="bad", kind=brain_pb2.JOB_EVENT_KIND_SUBMITTED, spec=no_ests
        ),
        invalid,
        "spec.num_ests:",
    )
    _fails(
        stub.ReportJobEvent,
        brain_pb2.ReportJobEventRequest(
            event_id="e3", job_id="ghost", kind=brain_pb2.JOB_EVENT_KIND_STARTED
        ),
        grpc.StatusCode.NOT_FOUND,
        "job 'ghost' not found",
    )
    _fails(
        stub.ReportSamples,
        brain_pb2.ReportSamplesRequest(batch_id="b", job_id="ghost", samples=samples(3, 1.0)),
        grpc.StatusCode.NOT_FOUND,
        "job 'ghost' not found",
    )
    submit(stub, "ok")
    negative_node = brain_pb2.JobNode(
        node_id="w0",
        role=brain_pb2.NODE_ROLE_WORKER,
        resources=common_pb2.Resources(cpu_cores=-2),
    )
    _fails(
        stub.ReportJobEvent,
        brain_pb2.ReportJobEventRequest(
            event_id="e4",
            job_id="ok",
            kind=brain_pb2.JOB_EVENT_KIND_NODE_STARTED,
            node=negative_node,
        ),
        invalid,
        "node.resources.cpu_cores: must be >= 0",
    )
    rows = samples(3, 1.0)
    rows[2].memory_bytes_used = -1
    _fails(
        stub.ReportSamples,
        brain_pb2.ReportSamplesRequest(batch_id="b", job_id="ok", samples=rows),
        invalid,
        "samples[2].memory_bytes_used: must be >= 0",
    )
    _fails(
        stub.ReportSamples,
        brain_pb2.ReportSamplesRequest(batch_id="b", job_id="ok"),
        invalid,
        "samples: at least one sample",
    )
    _fails(
        stub.PlanResources,
        brain_pb2.PlanResourcesRequest(
            job_id="ok", stage=brain_pb2.PLAN_STAGE_INITIAL, cpu_total=-1, cpu_max_per_node=8
        ),
        invalid,
        "cpu_total: must be > 0",
    )
    _fails(
        stub.PlanResources,
        brain_pb2.PlanResourcesRequest(
            job_id="ok",
            stage=brain_pb2.PLAN_STAGE_ADJUST,
            cpu_total=100,
            cpu_max_per_node=8,
            metrics=brain_pb2.PsJobMetrics(
                worker_cores_needed=1, ps_cores_per_worker=1, ps_cores_used=[1, -3]
            ),
            current=brain_pb2.ResourcePlan(
                workers=brain_pb2.NodeGroupPlan(count=2, cpu_cores=2),
                ps=brain_pb2.NodeGroupPlan(count=2, cpu_cores=4),
            ),
        ),
        invalid,
        "metrics.ps_cores_used[1]: must be >= 0",
    )
    _fails(
        stub.PlanResources,
        brain_pb2.PlanResourcesRequest(
            job_id="ghost", stage=brain_pb2.PLAN_STAGE_INITIAL, cpu_total=10, cpu_max_per_node=8
        ),
        grpc.StatusCode.NOT_FOUND,
        "job 'ghost' not found",
    )
    _fails(stub.PlanEsts, brain_pb2.PlanEstsRequest(num_ests=4), invalid, "devices: at least one")
    _fails(
        stub.PlanEsts,
        brain_pb2.PlanEstsRequest(
            num_ests=4,
            devices=[brain_pb2.DeviceCapability(accelerator_type="v100", available=-1)],
        ),
        invalid,
        "devices[0].available: must be >= 0",
    )
    _fails(
        stub.EstimateThroughput,
        brain_pb2.EstimateThroughputRequest(job_id="ok", accelerator_type="v100"),
        invalid,
        "device_count:",
    )
    _fails(
        stub.GetJobHistory,
        brain_pb2.GetJobHistoryRequest(job_id="ghost"),
        grpc.StatusCode.NOT_FOUND,
        "job 'ghost' not found",
    )
    _fails(
        stub.ListJobRecords,
        brain_pb2.ListJobRecordsRequest(page=common_pb2.PageRequest(page_token="garbage!")),
        invalid,
        "page.page_token",
    )
    # Nothing but the one good submission was written.
    assert _rows(db_url, "brain_jobs") == 1
    assert _rows(db_url, "brain_job_events") == 1
    for table in ("brain_job_nodes", "brain_samples", "brain_sample_batches", "brain_plans"):
        assert _rows(db_url, table) == 0, table


def test_migrate_and_load_references_subcommands(tmp_path: Path, gavel_data: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        [str(bin_dir / "gearshift-brain"), "migrate", "--database-url", url],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert {"brain_jobs", "brain_samples", "alembic_version"} <= set(
        sa.inspect(sa.create_engine(url)).get_table_names()
    )
    loaded = subprocess.run(
        [
            sys.executable,
            "-m",
            "gearshift.brain",
            "load-references",
            str(gavel_data / "simulation_throughputs.json"),
            "--database-url",
            url,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "411 reference throughputs" in loaded.stdout
    assert _rows(url, "brain_reference_throughputs") == 411
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "gearshift.brain",
            "load-references",
            str(tmp_path / "no.json"),
            "--database-url",
            url,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert missing.returncode == 1 and "cannot read throughputs" in missing.stderr


def test_a_data_parallel_jobs_adjust_stage_measures_its_own_samples(brain) -> None:
    """No metrics given and no PS in `current`: the Brain reads the job's samples since its
    last plan; an idle process is shrunk, and the next job of the type starts from it."""
    stub = brain
    submit(stub, "dp", model="mlp", dataset="digits")
    current = brain_pb2.ResourcePlan(
        workers=brain_pb2.NodeGroupPlan(count=1, cpu_cores=4, loader_procs=2)
    )
    ask = brain_pb2.PlanResourcesRequest(
        job_id="dp",
        stage=brain_pb2.PLAN_STAGE_ADJUST,
        cpu_total=4,
        cpu_max_per_node=4,
        current=current,
    )
    unmeasured = stub.PlanResources(ask)
    assert unmeasured.workers.cpu_cores == 4 and "no CPU measurement" in unmeasured.reason
    rows = samples(10, 5.0, node_id="rank-0", cpu_cores_used=0.5, memory_bytes_used=GIB // 4)
    assert report(stub, "dp-1", "dp", rows) == 10
    shrunk = stub.PlanResources(ask)
    assert (shrunk.workers.cpu_cores, shrunk.workers.loader_procs, shrunk.ps.count) == (1, 0, 0)
    assert shrunk.workers.memory_bytes == math.ceil(GIB / 4 * 1.2 / 2**20) * 2**20
    assert "cores 4 -> 1" in shrunk.reason
    assert shrunk.predicted_steps_per_second == pytest.approx(5.0)
    assert event(stub, "dp", brain_pb2.JOB_EVENT_KIND_SUCCEEDED)

    submit(stub, "dp-next", model="mlp", dataset="digits")
    initial = stub.PlanResources(
        brain_pb2.PlanResourcesRequest(
            job_id="dp-next", stage=brain_pb2.PLAN_STAGE_INITIAL, cpu_total=4, cpu_max_per_node=4
        )
    )
    assert initial.source == brain_pb2.PLAN_SOURCE_HISTORY
    assert (initial.workers.cpu_cores, initial.workers.loader_procs, initial.ps.count) == (1, 0, 0)
    # Memory from the measured peak of rank 0 (a sample of no recorded node: a worker's).
    assert initial.workers.memory_bytes == math.ceil(GIB / 4 * 1.2 / 2**20) * 2**20

    bad = brain_pb2.PlanResourcesRequest()
    bad.CopyFrom(ask)
    bad.current.workers.loader_procs = -1
    with pytest.raises(grpc.RpcError) as caught:
        stub.PlanResources(bad)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "current.workers.loader_procs" in str(caught.value.details())


def test_two_train_py_without_a_model_type_share_no_history(brain, tmp_path: Path) -> None:
    """Two users' `train.py` (different code, no model_type) are two models to the Brain:
    the first's finished 1-device run neither plans nor estimates the second; the same code
    again does."""
    stub: brain_pb2_grpc.BrainStub = brain

    def code(user: str, source: str) -> str:
        folder = tmp_path / user
        folder.mkdir()
        (folder / "train.py").write_text(source)
        return codepkg.package(folder / "train.py").sha256

    def submit_train(job_id: str, digest: str) -> None:
        anonymous = spec(job_id, model="", dataset="data")
        anonymous.entrypoint.CopyFrom(common_pb2.Entrypoint(module="train", code_sha256=digest))
        request = brain_pb2.ReportJobEventRequest(
            event_id=f"{job_id}-submitted",
            job_id=job_id,
            kind=brain_pb2.JOB_EVENT_KIND_SUBMITTED,
            spec=anonymous,
        )
        assert stub.ReportJobEvent(request).recorded

    def initial(job_id: str) -> brain_pb2.ResourcePlan:
        return stub.PlanResources(
            brain_pb2.PlanResourcesRequest(
                job_id=job_id, stage=brain_pb2.PLAN_STAGE_INITIAL, cpu_total=8, cpu_max_per_node=2
            )
        )

    def estimate(job_id: str) -> brain_pb2.ThroughputEstimate:
        return stub.EstimateThroughput(
            brain_pb2.EstimateThroughputRequest(
                job_id=job_id, accelerator_type="cpu", device_count=1
            )
        )

    alice, bob = code("alice", "LAYERS = 2\n"), code("bob", "LAYERS = 3\n")
    submit_train("alice-1", alice)
    assert event(stub, "alice-1", brain_pb2.JOB_EVENT_KIND_STARTED)
    rows = samples(10, 7.0, kind="cpu", count=1, node_id="rank-0", cpu_cores_used=1.0)
    assert report(stub, "alice-1-1", "alice-1", rows) == 10
    assert event(stub, "alice-1", brain_pb2.JOB_EVENT_KIND_SUCCEEDED)
    known = stub.GetJobHistory(brain_pb2.GetJobHistoryRequest(job_id="alice-1", max_samples=1))
    assert known.job.spec.model_type == f"train-{alice[:8]}"

    submit_train("bob-1", bob)
    theirs = initial("bob-1")
    assert theirs.source == brain_pb2.PLAN_SOURCE_DEFAULT, theirs.reason
    assert "no similar job in history" in theirs.reason
    assert estimate("bob-1").source != brain_pb2.ESTIMATE_SOURCE_MODEL_HISTORY
    listed = stub.ListJobRecords(brain_pb2.ListJobRecordsRequest(model_type=f"train-{bob[:8]}"))
    assert [j.job_id for j in listed.jobs] == ["bob-1"]

    submit_train("alice-2", alice)  # the same code: the same model, its history applies
    mine = initial("alice-2")
    assert mine.source == brain_pb2.PLAN_SOURCE_HISTORY and "alice-1" in mine.reason
    assert mine.workers.count == 1
    assert estimate("alice-2").source == brain_pb2.ESTIMATE_SOURCE_MODEL_HISTORY
