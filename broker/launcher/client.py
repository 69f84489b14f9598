"""A small async client for training launchers and operators: submit / get / list / watch / cancel, usage,
requeue / priority / hold / release; bearer token + TLS."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from grpc_status import rpc_status

from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import cluster_service_pb2_grpc as cs_grpc
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc
from tandem.v1 import job_service_pb2_grpc as svc_grpc

__all__ = ["BrokerClient", "SubmitItem", "Submitted", "status_details"]


@dataclass(frozen=True)
class SubmitItem:
    key: str
    spec: job_pb2.JobSpec


@dataclass(frozen=True)
class Submitted:
    index: int
    key: str
    job_id: str = ""
    duplicate: bool = False
    valid: bool = False
    error_code: int = 0
    error_message: str = ""


def status_details(err: grpc.aio.AioRpcError | grpc.RpcError) -> list[object]:
    """The google.rpc detail messages (BadRequest, QuotaFailure, ErrorInfo, ...) of a failed call, unpacked."""
    from google.rpc import error_details_pb2

    status = rpc_status.from_call(err)
    out: list[object] = []
    if status is None:
        return out
    for any_ in status.details:
        for cls in (
            error_details_pb2.BadRequest,
            error_details_pb2.QuotaFailure,
            error_details_pb2.ErrorInfo,
            error_details_pb2.PreconditionFailure,
            error_details_pb2.RetryInfo,
        ):
            if any_.Is(cls.DESCRIPTOR):
                msg = cls()
                any_.Unpack(msg)
                out.append(msg)
    return out


class BrokerClient:
    """`async with BrokerClient(addr, token=..., ca=...) as c: await c.submit(...)`."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        ca_pem: bytes | None = None,
        client_cert_pem: bytes | None = None,
        client_key_pem: bytes | None = None,
        server_name: str | None = None,
        timeout_s: float = 30.0,
        max_message_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        options: list[tuple[str, object]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if ca_pem is not None or client_cert_pem is not None:
            creds = grpc.ssl_channel_credentials(ca_pem, client_key_pem, client_cert_pem)
            self.channel = grpc.aio.secure_channel(address, creds, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s
        self.jobs = svc_grpc.JobServiceStub(self.channel)
        self.clusters = cs_grpc.ClusterServiceStub(self.channel)

    async def __aenter__(self) -> BrokerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def submit(
        self, job_set_id: str, items: Sequence[SubmitItem], *, validate_only: bool = False
    ) -> list[Submitted]:
        req = svc.SubmitJobsRequest(job_set_id=job_set_id, validate_only=validate_only)
        for it in items:
            req.items.add(idempotency_key=it.key, spec=it.spec)
        resp = await self.jobs.SubmitJobs(req, metadata=self.metadata, timeout=self.timeout_s)
        out = []
        for r in resp.results:
            which = r.WhichOneof("result")
            out.append(
                Submitted(
                    r.index,
                    r.idempotency_key,
                    job_id=r.job_id if which == "job_id" else "",
                    duplicate=r.duplicate,
                    valid=which == "valid",
                    error_code=r.error.code if which == "error" else 0,
                    error_message=r.error.message if which == "error" else "",
                )
            )
        return out

    async def submit_raw(self, req: svc.SubmitJobsRequest) -> svc.SubmitJobsResponse:
        resp: svc.SubmitJobsResponse = await self.jobs.SubmitJobs(req, metadata=self.metadata, timeout=self.timeout_s)
        return resp

    async def get(self, job_id: str, *, full: bool = True) -> job_pb2.Job:
        view = svc.JOB_VIEW_FULL if full else svc.JOB_VIEW_BASIC
        resp = await self.jobs.GetJob(
            svc.GetJobRequest(job_id=job_id, view=view), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp.job  # type: ignore[no-any-return]

    async def list(self, **filters: object) -> svc.ListJobsResponse:
        resp: svc.ListJobsResponse = await self.jobs.ListJobs(
            svc.ListJobsRequest(**filters),  # type: ignore[arg-type]
            metadata=self.metadata,
            timeout=self.timeout_s,
        )
        return resp

    async def watch(self, from_revision: int = 0, **filters: object) -> AsyncIterator[svc.JobEvent]:
        call = self.jobs.WatchJobs(
            svc.WatchJobsRequest(from_revision=from_revision, **filters),  # type: ignore[arg-type]
            metadata=self.metadata,
        )
        try:
            async for ev in call:
                yield ev
        finally:
            call.cancel()

    async def cancel(self, job_id: str, reason: str = "") -> svc.CancelJobResponse:
        resp: svc.CancelJobResponse = await self.jobs.CancelJob(
            svc.CancelJobRequest(job_id=job_id, reason=reason), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp

    async def cancel_set(self, job_set_id: str, reason: str = "", tenant: str = "") -> svc.CancelJobSetResponse:
        resp: svc.CancelJobSetResponse = await self.jobs.CancelJobSet(
            svc.CancelJobSetRequest(job_set_id=job_set_id, reason=reason, tenant=tenant),
            metadata=self.metadata,
            timeout=self.timeout_s,
        )
        return resp

    async def usage(self, tenant: str = "") -> svc.GetUsageResponse:
        resp: svc.GetUsageResponse = await self.jobs.GetUsage(
            svc.GetUsageRequest(tenant=tenant), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp

    async def export_usage(
        self, *, since: float | None = None, until: float | None = None, tenant: str = ""
    ) -> svc.ExportUsageResponse:
        """GPU-hours per (tenant, model, cluster) in [since, until] (seconds since the epoch; None = open)."""
        req = svc.ExportUsageRequest(tenant=tenant)
        if since is not None:
            req.since.FromNanoseconds(round(since * 1e9))
        if until is not None:
            req.until.FromNanoseconds(round(until * 1e9))
        resp: svc.ExportUsageResponse = await self.jobs.ExportUsage(req, metadata=self.metadata, timeout=self.timeout_s)
        return resp

    async def requeue(self, job_id: str, reason: str = "") -> svc.RequeueJobResponse:
        resp: svc.RequeueJobResponse = await self.jobs.RequeueJob(
            svc.RequeueJobRequest(job_id=job_id, reason=reason), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp

    async def set_priority(
        self, job_id: str, *, priority: int | None = None, band: str = "", reason: str = ""
    ) -> job_pb2.Job:
        req = svc.SetJobPriorityRequest(job_id=job_id, priority_band=band, reason=reason)
        if priority is not None:
            req.priority = priority
        resp = await self.jobs.SetJobPriority(req, metadata=self.metadata, timeout=self.timeout_s)
        return resp.job  # type: ignore[no-any-return]

    async def hold(self, job_id: str, reason: str = "") -> svc.HoldJobResponse:
        resp: svc.HoldJobResponse = await self.jobs.HoldJob(
            svc.HoldJobRequest(job_id=job_id, reason=reason), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp

    async def release(self, job_id: str, reason: str = "") -> svc.ReleaseJobResponse:
        resp: svc.ReleaseJobResponse = await self.jobs.ReleaseJob(
            svc.ReleaseJobRequest(job_id=job_id, reason=reason), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp

    async def list_clusters(self) -> cs.ListClustersResponse:
        resp: cs.ListClustersResponse = await self.clusters.ListClusters(
            cs.ListClustersRequest(), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp

    async def get_cluster(self, name: str) -> cs.GetClusterResponse:
        resp: cs.GetClusterResponse = await self.clusters.GetCluster(
            cs.GetClusterRequest(name=name), metadata=self.metadata, timeout=self.timeout_s
        )
        return resp

    async def cordon(self, name: str, reason: str, *, on: bool = True) -> cs.ClusterSummary:
        if on:
            resp = await self.clusters.Cordon(
                cs.CordonRequest(name=name, reason=reason), metadata=self.metadata, timeout=self.timeout_s
            )
        else:
            resp = await self.clusters.Uncordon(
                cs.UncordonRequest(name=name, reason=reason), metadata=self.metadata, timeout=self.timeout_s
            )
        return resp.cluster  # type: ignore[no-any-return]
