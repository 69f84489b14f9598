"""The services have the agreed methods and streaming kinds, and the generated stubs work over a real loopback server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import ModuleType

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import cluster_service_pb2_grpc as cs_grpc
from tandem.v1 import job_service_pb2 as js
from tandem.v1 import job_service_pb2_grpc as js_grpc
from tests.protos import builders as b
from tests.protos import builders_cluster as bc

UNARY, SERVER_STREAM, BIDI = (False, False), (False, True), (True, True)

Methods = dict[str, tuple[tuple[bool, bool], str, str]]
EXPECTED: dict[str, tuple[ModuleType, Methods]] = {
    "JobService": (
        js,
        {
            "SubmitJobs": (UNARY, "SubmitJobsRequest", "SubmitJobsResponse"),
            "GetJob": (UNARY, "GetJobRequest", "GetJobResponse"),
            "ListJobs": (UNARY, "ListJobsRequest", "ListJobsResponse"),
            "WatchJobs": (SERVER_STREAM, "WatchJobsRequest", "JobEvent"),
            "CancelJob": (UNARY, "CancelJobRequest", "CancelJobResponse"),
            "CancelJobSet": (UNARY, "CancelJobSetRequest", "CancelJobSetResponse"),
            "GetUsage": (UNARY, "GetUsageRequest", "GetUsageResponse"),
            "ExportUsage": (UNARY, "ExportUsageRequest", "ExportUsageResponse"),
            "RequeueJob": (UNARY, "RequeueJobRequest", "RequeueJobResponse"),
            "SetJobPriority": (UNARY, "SetJobPriorityRequest", "SetJobPriorityResponse"),
            "HoldJob": (UNARY, "HoldJobRequest", "HoldJobResponse"),
            "ReleaseJob": (UNARY, "ReleaseJobRequest", "ReleaseJobResponse"),
        },
    ),
    "ClusterService": (
        cs,
        {
            "Connect": (BIDI, "AgentMessage", "BrokerMessage"),
            "ListClusters": (UNARY, "ListClustersRequest", "ListClustersResponse"),
            "GetCluster": (UNARY, "GetClusterRequest", "GetClusterResponse"),
            "Cordon": (UNARY, "CordonRequest", "CordonResponse"),
            "Uncordon": (UNARY, "UncordonRequest", "UncordonResponse"),
        },
    ),
}


@pytest.mark.parametrize("service", list(EXPECTED))
def test_service_methods_and_streaming_kinds(service: str) -> None:
    module, expected = EXPECTED[service]
    descriptor = module.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == f"tandem.v1.{service}"
    actual = {
        m.name: ((m.client_streaming, m.server_streaming), m.input_type.name, m.output_type.name)
        for m in descriptor.methods
    }
    assert actual == expected


def test_generated_grpc_modules_expose_stubs_and_servicers() -> None:
    for grpc_module, service in [(js_grpc, "JobService"), (cs_grpc, "ClusterService")]:
        assert hasattr(grpc_module, f"{service}Stub")
        assert hasattr(grpc_module, f"{service}Servicer")
        assert hasattr(grpc_module, f"add_{service}Servicer_to_server")


def _invalid_argument_status() -> grpc.Status:
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field="job_id", description="not a DNS-1035 label")
            ]
        )
    )
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="bad job id", details=[detail])
    return rpc_status.to_status(status)


class _Jobs(js_grpc.JobServiceServicer):
    async def SubmitJobs(self, request: js.SubmitJobsRequest, context: object) -> js.SubmitJobsResponse:
        return js.SubmitJobsResponse(
            results=[
                js.SubmitJobResult(index=i, idempotency_key=item.idempotency_key, job_id=f"job-{i}")
                for i, item in enumerate(request.items)
            ]
        )

    async def GetJob(self, request: js.GetJobRequest, context: grpc.aio.ServicerContext) -> js.GetJobResponse:
        await context.abort_with_status(_invalid_argument_status())
        raise AssertionError("unreachable")

    async def WatchJobs(
        self, request: js.WatchJobsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[js.JobEvent]:
        if request.from_revision < 100:
            info = error_details_pb2.ErrorInfo(
                reason="REVISION_COMPACTED", domain="tandem.dev", metadata={"compact_revision": "100"}
            )
            detail = any_pb2.Any()
            detail.Pack(info)
            status = status_pb2.Status(code=code_pb2.OUT_OF_RANGE, message="revision compacted", details=[detail])
            await context.abort_with_status(rpc_status.to_status(status))
        for revision in range(request.from_revision + 1, request.from_revision + 4):
            yield js.JobEvent(revision=revision, type=js.JOB_EVENT_TYPE_STATE_CHANGED, job_id="train-7f3k")


class _Clusters(cs_grpc.ClusterServiceServicer):
    async def Connect(
        self, request_iterator: AsyncIterator[cs.AgentMessage], context: object
    ) -> AsyncIterator[cs.BrokerMessage]:
        sequence = 0
        async for message in request_iterator:
            sequence += 1
            if message.WhichOneof("body") == "hello":
                yield cs.BrokerMessage(sequence=sequence, welcome=cs.Welcome(protocol_version=1))
            else:
                yield cs.BrokerMessage(sequence=sequence, ack=cs.Ack(acked_agent_sequence=message.sequence))


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    # Only the methods under test are implemented; the rest answer UNIMPLEMENTED.
    js_grpc.add_JobServiceServicer_to_server(_Jobs(), server)  # type: ignore[abstract]
    cs_grpc.add_ClusterServiceServicer_to_server(_Clusters(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as chan:
            yield chan
    finally:
        await server.stop(grace=None)


async def test_unary_call_over_loopback(channel: grpc.aio.Channel) -> None:
    stub = js_grpc.JobServiceStub(channel)
    response = await stub.SubmitJobs(b.submit_jobs_request())
    assert [(r.index, r.idempotency_key, r.job_id) for r in response.results] == [(0, "launch-42/shard-3", "job-0")]


async def test_error_details_travel_as_google_rpc_status(channel: grpc.aio.Channel) -> None:
    stub = js_grpc.JobServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetJob(js.GetJobRequest(job_id="Bad_Id"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(info.value)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert [v.field for v in bad.field_violations] == ["job_id"]


async def test_watch_streams_revisions_and_reports_compaction(channel: grpc.aio.Channel) -> None:
    stub = js_grpc.JobServiceStub(channel)
    events = [e async for e in stub.WatchJobs(js.WatchJobsRequest(from_revision=200))]
    assert [e.revision for e in events] == [201, 202, 203]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        _ = [e async for e in stub.WatchJobs(js.WatchJobsRequest(from_revision=5))]
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    status = rpc_status.from_call(info.value)
    assert status is not None
    error_info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(error_info)
    assert (error_info.reason, error_info.metadata["compact_revision"]) == ("REVISION_COMPACTED", "100")


async def test_bidirectional_connect_over_loopback(channel: grpc.aio.Channel) -> None:
    stub = cs_grpc.ClusterServiceStub(channel)
    sent = bc.agent_messages()  # Hello first, then every other body kind, fully populated

    async def agent() -> AsyncIterator[cs.AgentMessage]:
        for message in sent:
            yield message

    replies = [m async for m in stub.Connect(agent())]
    assert replies[0].WhichOneof("body") == "welcome"
    assert [r.ack.acked_agent_sequence for r in replies[1:]] == [m.sequence for m in sent[1:]]
