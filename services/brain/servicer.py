"""gRPC servicer of the Brain: validate the request, call the domain layer, build the reply.

Validation and conversion live in gearshift.brain.convert, the logic in
gearshift.brain.service; errors are gearshift.common.errors exceptions that the
server's interceptor maps to status codes.
"""

from __future__ import annotations

import grpc

from gearshift.brain import convert, layer_profiles, metrics
from gearshift.brain import rubick_messages as rm
from gearshift.brain.profile_messages import check_key
from gearshift.brain.service import BrainService
from gearshift.common.validation import page_size
from gearshift.v1 import brain_pb2, brain_pb2_grpc


class BrainServicer(brain_pb2_grpc.BrainServicer):
    """The Brain's RPCs over a BrainService."""

    def __init__(self, service: BrainService) -> None:
        self.service = service

    def ReportJobEvent(
        self, request: brain_pb2.ReportJobEventRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ReportJobEventResponse:
        recorded = self.service.report_event(convert.job_event(request))
        return brain_pb2.ReportJobEventResponse(recorded=recorded)

    def ReportSamples(
        self, request: brain_pb2.ReportSamplesRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ReportSamplesResponse:
        samples = convert.samples(request)
        accepted = self.service.report_samples(request.batch_id, request.job_id, samples)
        return brain_pb2.ReportSamplesResponse(accepted=accepted)

    def GetJobHistory(
        self, request: brain_pb2.GetJobHistoryRequest, context: grpc.ServicerContext
    ) -> brain_pb2.JobHistory:
        job_id, since_step, max_samples = convert.history_request(request)
        return convert.history_message(self.service.history(job_id, since_step, max_samples))

    def ListJobRecords(
        self, request: brain_pb2.ListJobRecordsRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ListJobRecordsResponse:
        size = page_size(request.page.page_size)
        where, after = convert.list_request(request)
        page = self.service.list_jobs(where, size, after)
        return brain_pb2.ListJobRecordsResponse(
            jobs=[convert.job_record(j) for j in page.jobs],
            next_page_token=convert.page_token(page.next),
        )

    def EstimateThroughput(
        self, request: brain_pb2.EstimateThroughputRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ThroughputEstimate:
        job_id, model_type, kind, count = convert.estimate_request(request)
        result = self.service.estimate(job_id, model_type, kind, count)
        metrics.estimate_answered(result.source)
        return convert.estimate_message(result)

    def PlanResources(
        self, request: brain_pb2.PlanResourcesRequest, context: grpc.ServicerContext
    ) -> brain_pb2.ResourcePlan:
        issued = self.service.plan_resources(convert.plan_request(request))
        return convert.plan_message(issued.plan, issued.plan_id)

    def PlanEsts(
        self, request: brain_pb2.PlanEstsRequest, context: grpc.ServicerContext
    ) -> brain_pb2.EstPlan:
        job_id, num_ests, offers, current, top_k = convert.est_request(request)
        result = self.service.plan_ests(job_id, num_ests, offers, current, top_k)
        return convert.est_message(result)

    def StoreLayerProfile(
        self, request: brain_pb2.StoreLayerProfileRequest, context: grpc.ServicerContext
    ) -> brain_pb2.StoreLayerProfileResponse:
        key, model_type, graph = layer_profiles.store_request(request)
        written, replaced = self.service.store_profile(
            key, model_type, graph, request.profile.device
        )
        return brain_pb2.StoreLayerProfileResponse(written=written, replaced=replaced)

    def GetLayerProfile(
        self, request: brain_pb2.GetLayerProfileRequest, context: grpc.ServicerContext
    ) -> brain_pb2.StoredLayerProfile:
        check_key(request.key, "key")
        return layer_profiles.stored_message(self.service.layer_profile(request.key))

    def PlanBurstParallel(
        self, request: brain_pb2.PlanBurstParallelRequest, context: grpc.ServicerContext
    ) -> brain_pb2.BurstParallelPlan:
        source, settings = layer_profiles.plan_request(request)
        return layer_profiles.plan_message(self.service.plan_burst(source, settings))

    def StoreRubickProfile(
        self, request: brain_pb2.StoreRubickProfileRequest, context: grpc.ServicerContext
    ) -> brain_pb2.StoreRubickProfileResponse:
        subject, workload, runs = rm.store_request(request)
        written, stored, replaced = self.service.store_rubick(subject, workload, runs)
        return brain_pb2.StoreRubickProfileResponse(
            runs_written=written, runs_stored=stored, workload_replaced=replaced
        )

    def FitModel(
        self, request: brain_pb2.FitModelRequest, context: grpc.ServicerContext
    ) -> brain_pb2.FittedModel:
        fit_request = rm.fit_request(request)
        reply = rm.fit_message(fit_request.subject, self.service.fit_rubick(fit_request))
        workload = self.service.rubick_model(fit_request.subject)[0]
        reply.workload.CopyFrom(rm.workload_message(workload))
        return reply

    def PredictPlan(
        self, request: brain_pb2.PredictPlanRequest, context: grpc.ServicerContext
    ) -> brain_pb2.PlanPrediction:
        subject, plan, resources = rm.predict_request(request)
        return rm.prediction_message(self.service.predict_rubick(subject, plan, resources))

    def GetSensitivity(
        self, request: brain_pb2.GetSensitivityRequest, context: grpc.ServicerContext
    ) -> brain_pb2.Sensitivity:
        sensitivity_request = rm.sensitivity_request(request)
        return rm.sensitivity_message(self.service.rubick_sensitivity(sensitivity_request))
