"""JobService servicer: protobuf in, serde, plain handler, serde, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import ClassVar

import grpc
from google.protobuf import empty_pb2

from broker.api import serde, validation
from broker.api.handlers import jobs as job_handlers
from broker.api.handlers import queues as queue_views
from broker.api.handlers.submission import submit_jobs
from broker.api.ports import Gate, JobPorts, QueuePorts
from broker.api.serde_status import status_from_error
from broker.api.services.edge import Edge
from broker.domain.records import JobFilter, JobRecord, freeze_labels
from broker.tenancy.auth import AuditLog, Caller, Listener, Method
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc
from tandem.v1 import job_service_pb2_grpc as svc_grpc

__all__ = ["JobServicer", "get_job", "list_jobs", "watch_jobs", "cancel_job", "get_usage"]

_REPEATED_OVERHEAD = 6
"""Bytes a repeated message field adds per entry beyond the entry itself (tag and length)."""
_RESPONSE_MARGIN = 64 * 1024
"""Room kept in a ListJobs response for its other fields and gRPC's framing."""


class JobServicer(svc_grpc.JobServiceServicer):
    CHECKED_PER_ITEM: ClassVar[Mapping[str, frozenset[str]]] = {"SubmitJobs": frozenset({"items"})}
    """Fields whose enum numbers a method checks itself: one bad SubmitJobs item fails alone
    (validation.check_spec), not the whole call (the edge checks every other field of every request)."""

    def __init__(self, gate: Gate, jobs: JobPorts, queues: QueuePorts) -> None:
        self.gate = gate
        self.jobs = jobs
        self.queues = queues
        self.edge = Edge(gate, Listener.TENANT)

    async def SubmitJobs(
        self, request: svc.SubmitJobsRequest, context: grpc.aio.ServicerContext
    ) -> svc.SubmitJobsResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.SUBMIT_JOBS)
            parsed = serde.parse_items(request, caller.name, caller.is_admin)
            results = await submit_jobs(self.jobs, caller, parsed, request.validate_only)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.SUBMIT_JOBS, caller, job_set=request.job_set_id)
        out = svc.SubmitJobsResponse()
        # Item errors quote the caller's input: past half the largest message the listener sends, each is
        # cut to its first field violation, so the response always reaches the client.
        room = self.jobs.max_response_bytes // 2
        for r in results:
            item = out.results.add(index=r.index, idempotency_key=r.key, duplicate=r.duplicate)
            if r.error is not None:
                status = status_from_error(r.error)
                if status.ByteSize() > room:
                    status = status_from_error(r.error, size="minimal")
                room -= status.ByteSize()
                item.error.CopyFrom(status)
            elif r.valid:
                item.valid.CopyFrom(empty_pb2.Empty())
            else:
                item.job_id = r.job_id
        if not request.validate_only:
            self.gate.audit.record(
                caller,
                Method.SUBMIT_JOBS,
                "ok",
                job_set=request.job_set_id,
                jobs=[r.job_id for r in results if r.job_id],
                refused=sum(1 for r in results if r.error is not None),
            )
        return out

    async def GetJob(self, request: svc.GetJobRequest, context: grpc.aio.ServicerContext) -> svc.GetJobResponse:
        try:
            return await get_job(self.jobs, self.edge.caller(context, Method.GET_JOB), request)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.GET_JOB)

    async def ListJobs(self, request: svc.ListJobsRequest, context: grpc.aio.ServicerContext) -> svc.ListJobsResponse:
        try:
            return await list_jobs(self.jobs, self.edge.caller(context, Method.LIST_JOBS), request)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.LIST_JOBS)

    async def WatchJobs(
        self, request: svc.WatchJobsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.JobEvent]:
        try:
            async for event in watch_jobs(self.jobs, self.edge.caller(context, Method.WATCH_JOBS), request):
                yield event
        except Exception as exc:
            await self.edge.fail(context, exc, Method.WATCH_JOBS)

    async def CancelJob(
        self, request: svc.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> svc.CancelJobResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.CANCEL_JOB)
            return await cancel_job(self.jobs, self.gate.audit, caller, request)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.CANCEL_JOB, caller, job_id=request.job_id)

    async def CancelJobSet(
        self, request: svc.CancelJobSetRequest, context: grpc.aio.ServicerContext
    ) -> svc.CancelJobSetResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.CANCEL_JOB_SET)
            validation.raise_if(validation.check_cancel_job_set(request))
            ids, terminal = await job_handlers.cancel_job_set(
                self.jobs, caller, request.tenant, request.job_set_id, request.reason
            )
        except Exception as exc:
            await self.edge.fail(context, exc, Method.CANCEL_JOB_SET, caller, job_set=request.job_set_id)
        self.gate.audit.record(caller, Method.CANCEL_JOB_SET, "ok", job_set=request.job_set_id, jobs=ids)
        return svc.CancelJobSetResponse(cancelled_job_ids=ids, already_terminal_count=terminal)

    # ------------------------------------------------------------------ operations

    async def GetUsage(self, request: svc.GetUsageRequest, context: grpc.aio.ServicerContext) -> svc.GetUsageResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.GET_USAGE)
            return get_usage(self.queues, self.gate.audit, caller, request)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.GET_USAGE, caller, tenant=request.tenant)

    async def ExportUsage(
        self, request: svc.ExportUsageRequest, context: grpc.aio.ServicerContext
    ) -> svc.ExportUsageResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.EXPORT_USAGE)
            validation.raise_if(validation.check_export_usage(request))
            since = request.since.ToNanoseconds() / 1e9 if request.HasField("since") else None
            until = request.until.ToNanoseconds() / 1e9 if request.HasField("until") else None
            rows, lo, hi = await queue_views.export_usage(self.queues, caller, request.tenant, since, until)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.EXPORT_USAGE, caller, tenant=request.tenant)
        out = svc.ExportUsageResponse()
        out.since.CopyFrom(serde.ts(lo))
        out.until.CopyFrom(serde.ts(hi))
        for r in rows:
            out.records.add(tenant=r.tenant, gpu_model=r.gpu_model, cluster=r.cluster, gpu_hours=r.gpu_hours)
        self.gate.audit.record(
            caller, Method.EXPORT_USAGE, "ok", tenant=request.tenant, since=lo, until=hi, rows=len(rows)
        )
        return out

    async def RequeueJob(
        self, request: svc.RequeueJobRequest, context: grpc.aio.ServicerContext
    ) -> svc.RequeueJobResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.REQUEUE_JOB)
            validation.raise_if(validation.check_job_request(request))
            job = await job_handlers.requeue_job(self.jobs, caller, request.job_id, request.reason)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.REQUEUE_JOB, caller, job_id=request.job_id)
        self.gate.audit.record(
            caller,
            Method.REQUEUE_JOB,
            "ok",
            job_id=request.job_id,
            reason=request.reason,
            attempt=job.attempt,
            state=job.state.value,
        )
        return svc.RequeueJobResponse(state=serde.state_to_proto(job.state))  # type: ignore[arg-type]

    async def SetJobPriority(
        self, request: svc.SetJobPriorityRequest, context: grpc.aio.ServicerContext
    ) -> svc.SetJobPriorityResponse:
        caller: Caller | None = None
        priority = request.priority if request.HasField("priority") else None
        try:
            caller = self.edge.caller(context, Method.SET_JOB_PRIORITY)
            validation.raise_if(validation.check_set_job_priority(request))
            job = await job_handlers.set_job_priority(
                self.jobs, caller, request.job_id, priority, request.priority_band, request.reason
            )
        except Exception as exc:
            await self.edge.fail(context, exc, Method.SET_JOB_PRIORITY, caller, job_id=request.job_id)
        self.gate.audit.record(
            caller,
            Method.SET_JOB_PRIORITY,
            "ok",
            job_id=request.job_id,
            priority=priority,
            priority_band=request.priority_band,
            reason=request.reason,
        )
        return svc.SetJobPriorityResponse(job=self._basic(job))

    async def HoldJob(self, request: svc.HoldJobRequest, context: grpc.aio.ServicerContext) -> svc.HoldJobResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.HOLD_JOB)
            validation.raise_if(validation.check_job_request(request))
            job, changed = await job_handlers.hold_job(self.jobs, caller, request.job_id, request.reason)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.HOLD_JOB, caller, job_id=request.job_id)
        self.gate.audit.record(
            caller, Method.HOLD_JOB, "ok", job_id=request.job_id, reason=request.reason, changed=changed
        )
        return svc.HoldJobResponse(job=self._basic(job), already_held=not changed)

    async def ReleaseJob(
        self, request: svc.ReleaseJobRequest, context: grpc.aio.ServicerContext
    ) -> svc.ReleaseJobResponse:
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, Method.RELEASE_JOB)
            validation.raise_if(validation.check_job_request(request))
            job, changed = await job_handlers.release_job(self.jobs, caller, request.job_id, request.reason)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.RELEASE_JOB, caller, job_id=request.job_id)
        self.gate.audit.record(
            caller, Method.RELEASE_JOB, "ok", job_id=request.job_id, reason=request.reason, changed=changed
        )
        return svc.ReleaseJobResponse(job=self._basic(job), was_not_held=not changed)

    def _basic(self, job: JobRecord) -> job_pb2.Job:
        return serde.job_to_proto(job, queue_info=queue_views.queue_info(self.jobs.reads, job), full=False)


# The calls both edges make (gRPC here, the fleet view's HTTP in broker.web): an authorised caller and a
# decoded request in, the response message out. Validation, the plain handler, serde and the "ok" audit
# record live here once; authentication and the mapping of errors stay with each edge.


async def get_job(jobs: JobPorts, caller: Caller, request: svc.GetJobRequest) -> svc.GetJobResponse:
    validation.raise_if(validation.check_job_id(request.job_id))
    full = request.view != svc.JOB_VIEW_BASIC
    view = await job_handlers.get_job(jobs, caller, request.job_id, full)
    return svc.GetJobResponse(
        job=serde.job_to_proto(view.job, view.attempts, view.history, view.queue_info, full, view.templates)
    )


async def list_jobs(jobs: JobPorts, caller: Caller, request: svc.ListJobsRequest) -> svc.ListJobsResponse:
    validation.raise_if(validation.check_list_jobs(request))
    flt = JobFilter(
        tenant=request.tenant or None,
        states=frozenset(serde.state_from_proto(s) for s in request.states if s),
        queue=request.queue or None,
        job_set=request.job_set_id or None,
        labels=freeze_labels(dict(request.label_selector)),
        cluster=request.cluster or None,
        gpu_model=request.gpu_model or None,
    )
    full = request.view == svc.JOB_VIEW_FULL
    built: dict[str, tuple[JobRecord, job_pb2.Job]] = {}

    def encoded_size(job: JobRecord) -> int:
        message = serde.job_to_proto(job, queue_info=queue_views.queue_info(jobs.reads, job), full=full)
        built[job.job_id] = (job, message)
        return message.ByteSize() + _REPEATED_OVERHEAD

    page, revision = await job_handlers.list_jobs(
        jobs,
        caller,
        flt,
        request.page_size,
        request.page_token,
        size_of=encoded_size,
        max_bytes=jobs.max_response_bytes - _RESPONSE_MARGIN,
    )
    out = svc.ListJobsResponse(next_page_token=page.next_page_token, revision=revision)
    for job in page.jobs:
        record, message = built.get(job.job_id, (None, None))
        if record is not job or message is None:  # a cut page was read again: build from what it read
            message = serde.job_to_proto(job, queue_info=queue_views.queue_info(jobs.reads, job), full=full)
        out.jobs.append(message)
    return out


async def watch_jobs(
    jobs: JobPorts, caller: Caller, request: svc.WatchJobsRequest
) -> AsyncGenerator[svc.JobEvent, None]:
    validation.raise_if(validation.check_watch_jobs(request))
    stream = job_handlers.watch_jobs(
        jobs,
        caller,
        request.from_revision,
        request.tenant,
        request.queue,
        request.job_set_id,
        frozenset(request.job_ids),
        float(request.bookmark_interval_seconds or 30),
    )
    async for revision, event, job in stream:
        if event is None:
            yield serde.bookmark(revision, jobs.clock())
        else:
            yield serde.event_to_proto(event, job)


async def cancel_job(
    jobs: JobPorts, audit: AuditLog, caller: Caller, request: svc.CancelJobRequest
) -> svc.CancelJobResponse:
    validation.raise_if(validation.check_cancel_job(request))
    state, already = await job_handlers.cancel_job(jobs, caller, request.job_id, request.reason)
    audit.record(caller, Method.CANCEL_JOB, "ok", job_id=request.job_id, reason=request.reason)
    return svc.CancelJobResponse(state=serde.state_to_proto(state), already_terminal=already)  # type: ignore[arg-type]


def get_usage(
    queues: QueuePorts, audit: AuditLog, caller: Caller, request: svc.GetUsageRequest
) -> svc.GetUsageResponse:
    validation.raise_if(validation.check_get_usage(request))
    view = queue_views.usage(queues, caller, request.tenant)
    out = svc.GetUsageResponse(capacity_cost=view.capacity_cost)
    out.evaluate_time.CopyFrom(serde.ts(view.at))
    for r in view.rows:
        out.tenants.add(
            tenant=r.tenant,
            weight=r.weight,
            gpus=dict(r.gpus),
            quotas=dict(r.quotas),
            borrowed=dict(r.borrowed),
            usage_cost=r.usage_cost,
            fair_share_cost=r.fair_share_cost,
            demand_cost=r.demand_cost,
        )
    audit.record(caller, Method.GET_USAGE, "ok", tenant=request.tenant, rows=len(view.rows))
    return out
