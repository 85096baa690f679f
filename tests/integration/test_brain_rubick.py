"""Rubick's performance model through a real Brain process, on PostgreSQL and SQLite: runs
drawn from Eq. 1 with known parameters are fitted back (predictions within a few %), the
sensitivity curves and minRes are gearshift.common.rubick.sensitivity's, a restart keeps
the fit, runs come from a job's own runtime samples, bad input is refused naming the field
and changes nothing; and the shared measurements (Rubick's profiles) fitted through the RPC.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import sqlalchemy as sa

from gearshift.common.channel import connect
from gearshift.common.db import create_engine
from gearshift.common.rubick import sensitivity
from gearshift.common.rubick.data import load_model
from gearshift.common.rubick.model import (
    Config,
    ForwardSample,
    Params,
    Workload,
    fits,
    iter_time,
)
from gearshift.common.rubick.plans import Plan, Resources, Zero
from gearshift.common.rubick.validation import fit_runs
from gearshift.v1 import brain_pb2, brain_pb2_grpc, common_pb2
from tests.conftest import DaemonFactory

B = brain_pb2
TRUE = Params(k_bwd=2.2, k_sync=3.0, k_opt=0.02, k_opt_off=4.0, k_off=2.5, k_swap=3.5, k_const=15.0)
WORKLOAD = Workload(
    name="",
    params_m=350.0,
    global_batch=64,
    seq_hid_layers=512 * 1024 * 24,
    layers=24,
    forward=(ForwardSample(2, 21.0), ForwardSample(4, 40.0), ForwardSample(8, 78.0)),
)
ZERO = {
    Zero.NONE: B.ZERO_MODE_UNSPECIFIED,
    Zero.DP: B.ZERO_MODE_DP,
    Zero.OFFLOAD: B.ZERO_MODE_OFFLOAD,
}
# (plan, placement, CPUs per GPU): what a profiling run on one 8-GPU node covers.
PROFILED = [
    (Plan(dp=1), (1,), 1),
    (Plan(dp=2), (2,), 1),
    (Plan(dp=8), (8,), 1),
    (Plan(dp=4, gc=True), (4,), 1),
    (Plan(dp=4, zero=Zero.DP), (4,), 1),
    (Plan(dp=2, zero=Zero.OFFLOAD), (2,), 2),
    (Plan(dp=4, zero=Zero.OFFLOAD), (4,), 4),
    (Plan(dp=8, zero=Zero.OFFLOAD, gc=True), (8,), 1),
    (Plan(dp=2, tp=2, pp=2, micro_batches=4), (8,), 1),
    (Plan(dp=4, ga=2), (4,), 1),
]
UNSEEN = [
    (Plan(dp=8), (4, 4), 1),
    (Plan(dp=8, zero=Zero.DP, ga=2), (8,), 1),
    (Plan(dp=4, zero=Zero.OFFLOAD), (4,), 8),
    (Plan(dp=1, tp=4, pp=2, micro_batches=4), (8,), 1),
    (Plan(dp=16, gc=True), (8, 8), 1),
]


@pytest.fixture
def brain(daemons: DaemonFactory, db_url: str) -> Iterator[brain_pb2_grpc.BrainStub]:
    daemon = daemons("brain", ["--database-url", db_url])
    with connect(daemon.address, retry=False) as channel:
        yield brain_pb2_grpc.BrainStub(channel)


def workload_message(w: Workload = WORKLOAD) -> B.RubickWorkload:
    return B.RubickWorkload(
        params_millions=w.params_m,
        global_batch=w.global_batch,
        seq_hid_layers=w.seq_hid_layers,
        layers=w.layers,
        forward=[B.RubickForward(samples_per_gpu=s.work, milliseconds=s.ms) for s in w.forward],
    )


def plan_message(p: Plan) -> B.RubickPlan:
    return B.RubickPlan(
        dp=p.dp,
        tp=p.tp,
        pp=p.pp,
        ga=p.ga,
        gc=p.gc,
        zero=ZERO[p.zero],
        micro_batches=p.micro_batches,
    )


def resources_message(placement: tuple[int, ...], cpus: int) -> B.RubickResources:
    return B.RubickResources(placement=list(placement), cpus_per_gpu=cpus)


def run(plan: Plan, placement: tuple[int, ...], cpus: int, seconds: float, batch: int = 0):
    return B.RubickRun(
        plan=plan_message(plan),
        resources=resources_message(placement, cpus),
        iteration_seconds=seconds,
        global_batch=batch,
    )


def true_ms(plan: Plan, placement: tuple[int, ...], cpus: int, w: Workload = WORKLOAD) -> float:
    return iter_time(TRUE, w, Config(plan, Resources(placement, cpus)))


def synthetic_runs() -> list[B.RubickRun]:
    runs = [run(p, pl, c, true_ms(p, pl, c) / 1e3) for p, pl, c in PROFILED]
    # One run of the profiling sweep at another per-GPU batch (global batch 32).
    half = Workload("", WORKLOAD.params_m, 32, WORKLOAD.seq_hid_layers, 24, WORKLOAD.forward)
    runs.append(run(Plan(dp=4), (4,), 1, true_ms(Plan(dp=4), (4,), 1, half) / 1e3, 32))
    return runs


def params_of(message: B.RubickParams) -> Params:
    return Params(*(getattr(message, f) for f in Params.__dataclass_fields__))


def _fails(call, request, code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    assert info.value.code() == code, info.value.details()
    assert text in (info.value.details() or ""), info.value.details()


def test_fit_predict_and_sensitivity(brain: brain_pb2_grpc.BrainStub) -> None:
    runs = synthetic_runs()
    stored = brain.StoreRubickProfile(
        B.StoreRubickProfileRequest(
            model_key="gpt-350m", workload=workload_message(), runs=runs[:5]
        )
    )
    assert (stored.runs_written, stored.runs_stored, stored.workload_replaced) == (5, 5, False)
    again = brain.StoreRubickProfile(
        B.StoreRubickProfileRequest(model_key="gpt-350m", runs=runs[:5])
    )
    assert (again.runs_written, again.runs_stored) == (0, 5)  # a retry writes nothing

    fitted = brain.FitModel(B.FitModelRequest(model_key="gpt-350m", runs=runs[5:]))
    assert fitted.model_key == "gpt-350m" and fitted.run_count == len(runs)
    assert fitted.offload_runs == 3 and fitted.runs_from_samples == 0
    assert fitted.rmsle < 0.01 and 0 < fitted.fit_seconds < 10
    assert fitted.cluster.intra_node_gbps == 400 and fitted.cluster.gpu_memory_gb == 80
    assert fitted.workload == workload_message()  # what a caller predicts from (the scheduler)

    for plan, placement, cpus in UNSEEN:
        got = brain.PredictPlan(
            B.PredictPlanRequest(
                model_key="gpt-350m",
                plan=plan_message(plan),
                resources=resources_message(placement, cpus),
            )
        )
        want = true_ms(plan, placement, cpus) / 1e3
        assert got.iteration_seconds == pytest.approx(want, rel=0.03), plan.label
        assert got.samples_per_second == pytest.approx(64 / got.iteration_seconds)
        assert got.fits == fits(WORKLOAD, plan) and got.plan_label == plan.label
        assert 0 < got.gpu_memory_bytes < got.gpu_memory_limit_bytes
    # Sensitivity and minRes: the library's own, with the stored parameters.
    params = params_of(fitted.params)
    reply = brain.GetSensitivity(
        B.GetSensitivityRequest(
            model_key="gpt-350m",
            max_gpus=16,
            gpus_per_node=8,
            cpus_per_gpu=2,
            max_cpus_per_gpu=6,
            cpu_curve_placement=[4],
            allow_3d=True,
            original_plan=plan_message(Plan(dp=8)),
            original_resources=resources_message((8,), 4),
        )
    )
    curve = sensitivity.gpu_curve(WORKLOAD, params, 16, cpus_per_gpu=2, gpus_per_node=8)
    assert [p.samples_per_second for p in reply.gpu_curve] == pytest.approx(
        [p.throughput for p in curve], rel=1e-9
    )
    assert [p.slope for p in reply.gpu_curve] == pytest.approx(sensitivity.slopes(curve), abs=1e-9)
    assert [p.amount for p in reply.gpu_curve] == list(range(1, 17))
    cpu = sensitivity.cpu_curve(WORKLOAD, params, (4,), 6)
    assert [p.samples_per_second for p in reply.cpu_curve] == pytest.approx(
        [p.throughput for p in cpu], rel=1e-9
    )
    least = sensitivity.min_res(
        WORKLOAD, params, Config(Plan(dp=8), Resources((8,), 4)), gpus_per_node=8
    )
    mr = reply.min_res
    assert (mr.gpus, mr.cpus_per_gpu, mr.found) == (least.gpus, least.cpus_per_gpu, least.found)
    assert mr.plan == plan_message(least.choice.plan)
    assert mr.samples_per_second == pytest.approx(least.choice.throughput, rel=1e-9)
    assert mr.target_samples_per_second == pytest.approx(least.target, rel=1e-9)
    # ZeRO-DP on the 8 GPUs beats plain DP with 1 of the 4 cores per GPU asked for.
    assert least.found and (least.gpus, least.cpus_per_gpu) == (8, 1)

    # On 24 GB GPUs (a fit for another cluster), plain DP on one GPU runs out of memory.
    small = brain.FitModel(
        B.FitModelRequest(model_key="gpt-350m", cluster=B.RubickCluster(gpu_memory_gb=24))
    )
    assert small.cluster.gpu_memory_gb == 24 and small.cluster.intra_node_gbps == 400
    oom = brain.PredictPlan(
        B.PredictPlanRequest(
            model_key="gpt-350m",
            plan=plan_message(Plan(dp=1)),
            resources=resources_message((1,), 1),
        )
    )
    assert oom.fits is False and oom.gpu_memory_bytes > oom.gpu_memory_limit_bytes


def test_too_few_runs_bad_values_and_no_fit(brain: brain_pb2_grpc.BrainStub, db_url: str) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    runs = synthetic_runs()
    wl = workload_message()
    predict = B.PredictPlanRequest(
        model_key="m", plan=plan_message(Plan(dp=2)), resources=resources_message((2,), 1)
    )
    _fails(brain.PredictPlan, predict, grpc.StatusCode.FAILED_PRECONDITION, "no fitted Rubick")
    _fails(
        brain.FitModel,
        B.FitModelRequest(model_key="m", workload=wl, runs=runs[:6]),
        invalid,
        "runs: the fit needs >= 7 profiled runs; model key 'm' has 6 (0 stored, 6 given",
    )
    bad = list(runs)
    bad[3] = run(Plan(dp=4), (4,), 1, -1.0)
    _fails(
        brain.FitModel,
        B.FitModelRequest(model_key="m", workload=wl, runs=bad),
        invalid,
        "runs[3].iteration_seconds: must be > 0",
    )
    bad[3] = run(Plan(dp=4), (2,), 1, 1.0)
    _fails(
        brain.StoreRubickProfile,
        B.StoreRubickProfileRequest(model_key="m", workload=wl, runs=bad),
        invalid,
        "runs[3].resources.placement: holds 2 GPUs but the plan needs 4",
    )
    zero_tp = B.RubickRun(
        plan=B.RubickPlan(dp=2, tp=2, zero=B.ZERO_MODE_DP),
        resources=resources_message((4,), 1),
        iteration_seconds=1.0,
    )
    _fails(
        brain.StoreRubickProfile,
        B.StoreRubickProfileRequest(model_key="m", workload=wl, runs=[zero_tp]),
        invalid,
        "runs[0].plan.zero: ZeRO plans are data parallel only",
    )
    _fails(
        brain.StoreRubickProfile,
        B.StoreRubickProfileRequest(model_key="m", runs=runs),
        invalid,
        "workload: is required with the first runs of model key 'm'",
    )
    no_forward = workload_message()
    del no_forward.forward[:]
    _fails(
        brain.FitModel,
        B.FitModelRequest(model_key="m", workload=no_forward, runs=runs),
        invalid,
        "workload.forward: want 1-1,000, got 0",
    )
    _fails(
        brain.FitModel, B.FitModelRequest(runs=runs), invalid, "job_id: give job_id or model_key"
    )
    _fails(
        brain.FitModel,
        B.FitModelRequest(model_key="bad key", runs=runs),
        invalid,
        "model_key: 'bad key'",
    )
    _fails(
        brain.FitModel,
        B.FitModelRequest(model_key="m", workload=wl, runs=runs, include_runtime_samples=True),
        invalid,
        "include_runtime_samples: needs a job_id",
    )
    _fails(
        brain.GetSensitivity,
        B.GetSensitivityRequest(model_key="m", max_gpus=65),
        invalid,
        "max_gpus: must be 0-64",
    )
    _fails(brain.PredictPlan, predict, grpc.StatusCode.FAILED_PRECONDITION, "FitModel first")

    # Nothing was stored by any of these.
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            counts = [
                conn.execute(sa.text(f"SELECT COUNT(*) FROM {t}")).scalar()
                for t in ("brain_rubick_workloads", "brain_rubick_runs", "brain_rubick_fits")
            ]
    finally:
        engine.dispose()
    assert counts == [0, 0, 0]

    # Stored runs short of 7, then enough; a changed workload asks for a new fit.
    brain.StoreRubickProfile(B.StoreRubickProfileRequest(model_key="m", workload=wl, runs=runs[:4]))
    _fails(
        brain.FitModel,
        B.FitModelRequest(model_key="m"),
        invalid,
        "has 4 (4 stored, 0 given, 0 from its runtime samples)",
    )
    brain.FitModel(B.FitModelRequest(model_key="m", runs=runs[4:]))
    assert brain.PredictPlan(predict).iteration_seconds > 0
    changed = workload_message()
    changed.params_millions = 700
    replaced = brain.StoreRubickProfile(
        B.StoreRubickProfileRequest(model_key="m", workload=changed)
    )
    assert replaced.workload_replaced and replaced.runs_stored == len(runs)
    _fails(brain.PredictPlan, predict, grpc.StatusCode.FAILED_PRECONDITION, "call FitModel again")


def test_a_restart_keeps_the_fit(daemons: DaemonFactory, db_url: str) -> None:
    first = daemons("brain", ["--database-url", db_url])
    request = B.PredictPlanRequest(
        job_id="job-1", plan=plan_message(Plan(dp=8, ga=2)), resources=resources_message((8,), 1)
    )
    with connect(first.address, retry=False) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        fitted = stub.FitModel(
            B.FitModelRequest(job_id="job-1", workload=workload_message(), runs=synthetic_runs())
        )
        before = stub.PredictPlan(request)
    first.stop()
    second = daemons("brain", ["--database-url", db_url])
    with connect(second.address, retry=False) as channel:
        stub = brain_pb2_grpc.BrainStub(channel)
        after = stub.PredictPlan(request)
        refit = stub.FitModel(B.FitModelRequest(job_id="job-1"))  # from the stored runs
        again = stub.PredictPlan(request)
    assert after == before
    # k_sync is not identifiable from one node's runs: compare what the fit predicts.
    assert refit.run_count == fitted.run_count and refit.rmsle < 0.01
    assert again.iteration_seconds == pytest.approx(before.iteration_seconds, rel=1e-4)


def test_runs_from_the_jobs_runtime_samples(brain: brain_pb2_grpc.BrainStub) -> None:
    job = "job-samples"
    spec = common_pb2.JobSpec(
        name=job,
        tenant="team-a",
        model_type="gpt",
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=8,
        global_batch_size=64,
        total_steps=100,
        dataset=common_pb2.DatasetSpec(name="d", size=1000, shard_size=10),
    )
    brain.ReportJobEvent(
        B.ReportJobEventRequest(
            event_id="s", job_id=job, kind=B.JOB_EVENT_KIND_SUBMITTED, spec=spec
        )
    )
    samples = []
    spreads = [[1] * 8, [2] * 4, [4, 4], [8], [3, 5]]  # the last one uneven: skipped
    for i, ests in enumerate(spreads):
        d, k = len(ests), ests[0]
        ms = true_ms(Plan(dp=d, ga=k), (d,), 1)
        for j in range(3):
            rate = 1e3 / (ms * (1.0 + 0.01 * j))  # the median is the middle one
            samples.append(
                B.RuntimeSample(
                    time=1000.0 + 10 * i + j,
                    step=10 * i + j,
                    steps_per_second=rate,
                    samples_per_second=64 * rate,
                    accelerator_type="a800",
                    device_count=d,
                    ests_per_device=ests,
                )
            )
    brain.ReportSamples(B.ReportSamplesRequest(batch_id="b1", job_id=job, samples=samples))
    offload = [r for r in synthetic_runs() if r.plan.zero == B.ZERO_MODE_OFFLOAD]
    request = B.FitModelRequest(
        job_id=job,
        workload=workload_message(),
        runs=offload,
        include_runtime_samples=True,
        accelerator_type="a800",
        gpus_per_node=8,
    )
    fitted = brain.FitModel(request)
    assert (fitted.runs_from_samples, fitted.run_count, fitted.job_id) == (4, 7, job)
    assert fitted.rmsle < 0.02
    other = B.FitModelRequest()
    other.CopyFrom(request)
    other.accelerator_type = "v100"  # no samples of that type: 3 runs only
    _fails(brain.FitModel, other, grpc.StatusCode.INVALID_ARGUMENT, "0 from its runtime samples")


def test_shared_measurements_through_the_rpc(
    brain: brain_pb2_grpc.BrainStub, rubick_data: Path
) -> None:
    """Fit one model on 7 measured runs (validation.fit_runs), predict its other single-node
    DP-family runs; print the mean error (Table 2's gap: bench/rubick.py)."""
    data = load_model(rubick_data, "roberta")
    chosen = fit_runs(data)
    w = data.workload
    fitted = brain.FitModel(
        B.FitModelRequest(
            model_key="roberta",
            workload=workload_message(w),
            runs=[
                run(
                    m.config.plan,
                    m.config.resources.placement,
                    m.config.resources.cpus_per_gpu,
                    m.iter_ms / 1e3,
                )
                for m in chosen
            ],
        )
    )
    assert fitted.run_count == 7
    seen = {m.config for m in chosen}
    rest = [m for m in data.placements if m.config not in seen]
    errors, single = [], []
    for m in rest:
        res = m.config.resources
        got = brain.PredictPlan(
            B.PredictPlanRequest(
                model_key="roberta",
                plan=plan_message(m.config.plan),
                resources=resources_message(res.placement, res.cpus_per_gpu),
            )
        )
        errors.append(abs(got.iteration_seconds * 1e3 - m.iter_ms) / m.iter_ms)
        if len(res.placement) == 1:
            single.append(errors[-1])
    mean, mean_single = float(np.mean(errors)), float(np.mean(single))
    print(
        f"roberta: fit RMSLE {fitted.rmsle:.3f}; mean error {100 * mean:.1f}% over "
        f"{len(errors)} runs, {100 * mean_single:.1f}% over the {len(single)} single-node ones"
    )
    assert single and mean_single < 0.5
