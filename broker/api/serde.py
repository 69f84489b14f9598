"""JobService protobuf <-> broker/core domain, in one place: nothing else in the broker touches job messages."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence

from google.protobuf import duration_pb2, timestamp_pb2

from broker.api import validation
from broker.domain import errors, jobstatus
from broker.domain.errors import FieldViolation, TandemError
from broker.domain.records import AttemptRecord, JobRecord, NewJob, WatchEvent, freeze_labels
from broker.domain.states import JobState
from placement.errors import PodSpecError
from placement.model import GPU_PRODUCT_LABEL, WHOLE_GPU_MILLI, DraRequest, JobRequest, PodSet, PodShape
from placement.podspec import GPU_MILLI_RESOURCE, GPU_RESOURCE, MIG_RESOURCE_PREFIX, shape_from_pod
from placement.usage import shape_gpus
from tandem.v1 import common_pb2, job_pb2, job_service_pb2

__all__ = [
    "ts",
    "spec_from_bytes",
    "parse_items",
    "ParsedItem",
    "request_from_spec",
    "request_from_record",
    "respec_priority",
    "job_to_proto",
    "event_to_proto",
]

pb = job_pb2
svc = job_service_pb2
_log = logging.getLogger("tandem.broker.serde")


def ts(t: float) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromNanoseconds(int(t * 1e9))
    return out


def _dur_s(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def spec_from_bytes(raw: bytes) -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec()
    spec.ParseFromString(raw)
    return spec


# ----------------------------------------------------------------------------- submissions


class ParsedItem:
    """One SubmitJobs item after schema validation: the spec (job_set filled in), its core request, its NewJob."""

    __slots__ = ("index", "key", "spec", "request", "new_job", "error")

    def __init__(self, index: int, key: str) -> None:
        self.index = index
        self.key = key
        self.spec: job_pb2.JobSpec | None = None
        self.request: JobRequest | None = None
        self.new_job: NewJob | None = None
        self.error: TandemError | None = None


def _shape(shape: job_pb2.PodShape, template: dict[str, object], path: str) -> tuple[PodShape, list[FieldViolation]]:
    """The replica shape: GPU and resource facts from the proto, tolerations and selectors from the template."""
    out: list[FieldViolation] = []
    tpl_shape: PodShape | None = None
    try:
        tpl_shape = shape_from_pod(template)
    except PodSpecError as exc:
        out.append(FieldViolation(f"{path}.pod_template_json.{exc.field}", str(exc)))
    milli = shape.gpu_milli or WHOLE_GPU_MILLI
    declared = frozenset(shape.allowed_gpu_models)
    models = declared
    if tpl_shape is not None:
        out.extend(_template_disagrees(shape, tpl_shape, milli, path))
        # A model named only by the template's nvidia.com/gpu.product selector or affinity is still a
        # constraint of the job: the broker places (and the policy judges) by it too.
        templated = tpl_shape.gpu_models
        if declared and templated and not declared & templated:
            out.append(
                FieldViolation(
                    f"{path}.shape.allowed_gpu_models",
                    f"none of {sorted(declared)} is allowed by the pod template's "
                    f"{GPU_PRODUCT_LABEL} selector ({sorted(templated)})",
                )
            )
        models = declared & templated if declared and templated else declared or templated
    dra = tuple(DraRequest(r.device_class_name, tuple(r.selectors), max(r.count, 1)) for r in shape.device_requests)
    core = PodShape(
        gpus=shape.gpu_count,
        gpu_milli=milli,
        gpu_models=models,
        min_gpu_memory_mib=shape.min_gpu_memory_mib,
        mig_profile=shape.mig_profile or None,
        mig_count=shape.mig_count,
        dra=dra,
        cpu_milli=shape.cpu_milli,
        memory=shape.memory_bytes,
        extended=tuple(sorted(shape.extended_resources.items())),
        tolerations=tpl_shape.tolerations if tpl_shape else (),
        node_selector=tpl_shape.node_selector if tpl_shape else (),
        affinity=tpl_shape.affinity if tpl_shape else (),
    )
    return core, out


def _template_disagrees(shape: job_pb2.PodShape, tpl: PodShape, milli: int, path: str) -> list[FieldViolation]:
    """kube-scheduler places the pod the template describes, the broker plans on the declared shape: the two
    must request the same (computed as kube-scheduler does: init containers as a max, sidecars and overhead
    added), else a gang planned for 96 CPUs lands as a pod asking for none."""
    pairs = [
        ("gpu_count", shape.gpu_count, tpl.gpus, GPU_RESOURCE),
        ("gpu_milli", milli if shape.gpu_count else tpl.gpu_milli, tpl.gpu_milli, GPU_MILLI_RESOURCE),
        ("mig_profile", shape.mig_profile or None, tpl.mig_profile, f"{MIG_RESOURCE_PREFIX}<profile>"),
        ("mig_count", shape.mig_count, tpl.mig_count, f"{MIG_RESOURCE_PREFIX}<profile>"),
        ("cpu_milli", shape.cpu_milli, tpl.cpu_milli, "cpu (millicores)"),
        ("memory_bytes", shape.memory_bytes, tpl.memory, "memory (bytes)"),
        ("extended_resources", dict(shape.extended_resources), dict(tpl.extended), "other extended resources"),
    ]
    return [
        FieldViolation(
            f"{path}.shape.{name}",
            f"declares {declared!r} but the pod template requests {templated!r} of {what} "
            "(set the template's container requests to the shape)",
        )
        for name, declared, templated, what in pairs
        if declared != templated
    ]


def request_from_spec(job_id: str, spec: job_pb2.JobSpec, tenant: str, base_priority: int = 0) -> JobRequest:
    """The core's JobRequest for a (validated) spec; raises InvalidArgument on template/shape conflicts."""
    pod_sets = []
    violations: list[FieldViolation] = []
    for i, ps in enumerate(spec.pod_sets):
        path = f"spec.pod_sets[{i}]"
        text = ps.pod_template_json
        template: object = {}
        too_deep = validation.check_json_depth(text, f"{path}.pod_template_json")
        if too_deep:  # never handed to json.loads or the recursive pod walkers (check_spec refuses it first)
            violations.extend(too_deep)
            continue
        try:
            template = json.loads(text) if text else {}
        except ValueError:
            pass
        try:
            shape, bad = _shape(ps.shape, template if isinstance(template, dict) else {}, path)
        except Exception as exc:
            _log.warning("pod template could not be compared with its shape", extra={"error": repr(exc)[:200]})
            violations.append(
                FieldViolation(
                    f"{path}.pod_template_json",
                    "its requests cannot be compared with the shape (a quantity out of range?)",
                )
            )
            continue
        violations.extend(bad)
        pod_sets.append(PodSet(ps.name, ps.count, shape))
    validation.raise_if(violations)
    sel = spec.cluster_selector
    loc = tuple(spec.data_locality.preferred_clusters) + tuple(spec.data_locality.preferred_regions)
    return JobRequest(
        job_id=job_id,
        pod_sets=tuple(pod_sets),
        tenant=tenant,
        queue=spec.queue or "default",
        priority=base_priority + spec.priority,
        preemptible=spec.preemptible,
        min_available=spec.min_available if spec.HasField("min_available") else None,
        required_level=spec.topology.required_level or None,
        preferred_level=spec.topology.preferred_level or None,
        allowed_clusters=frozenset(sel.clusters),
        allowed_regions=frozenset(sel.regions),
        allowed_roles=frozenset(sel.roles),
        locality=loc,
        max_runtime_s=int(_dur_s(spec.max_runtime)) if spec.HasField("max_runtime") else None,
    )


def start_timeout_s(raw: bytes, default: float) -> float:
    """The job's own gang start deadline (JobSpec.start_timeout), else the broker's default, in seconds."""
    spec = spec_from_bytes(raw)
    return _dur_s(spec.start_timeout) if spec.HasField("start_timeout") else default


def respec_priority(raw: bytes, priority: int, band: str) -> bytes:
    """The stored spec bytes with a new priority and band (SetJobPriority keeps the spec and the indexed
    columns saying the same)."""
    spec = spec_from_bytes(raw)
    spec.priority = priority
    spec.priority_band = band
    return spec.SerializeToString(deterministic=True)


def request_from_record(rec: JobRecord) -> JobRequest:
    return request_from_spec(rec.job_id, spec_from_bytes(rec.spec), rec.tenant, rec.priority)


class ProtoSpecs:
    """The ``SpecReader`` over specs stored as JobSpec messages: what the hub is built with."""

    def request(self, job: JobRecord) -> JobRequest:
        return request_from_record(job)

    def start_timeout_s(self, spec: bytes, default: float) -> float:
        return start_timeout_s(spec, default)


SPECS = ProtoSpecs()


def _gpu_demand(req: JobRequest) -> float:
    """Whole-GPU equivalents the job asks for: MIG instances as the core counts them (compute slices over the
    GPU's slices, on the pod set's model when it names exactly one), so demand and quota charge agree."""
    return sum(shape_gpus(ps.shape) * ps.count for ps in req.pod_sets)


def parse_items(
    request: job_service_pb2.SubmitJobsRequest, caller_tenant: str, admin: bool = False
) -> list[ParsedItem]:
    """Validate every item independently; each gets either a NewJob + JobRequest or an error.

    Tenants submit for themselves (spec.tenant empty or their own); admins name the tenant in each spec."""
    validation.raise_if(validation.check_submit(request.job_set_id, len(request.items)))
    out = []
    for i, item in enumerate(request.items):
        parsed = ParsedItem(i, item.idempotency_key)
        path = f"items[{i}]"
        bad = validation.check_key(item.idempotency_key, f"{path}.idempotency_key")
        if not item.HasField("spec"):
            bad.append(FieldViolation(f"{path}.spec", "required"))
        else:
            bad.extend(validation.check_spec(item.spec, f"{path}.spec"))
            if item.spec.job_set_id and item.spec.job_set_id != request.job_set_id:
                bad.append(FieldViolation(f"{path}.spec.job_set_id", "must be empty or equal to job_set_id"))
        if not bad and admin and not item.spec.tenant:
            bad.append(FieldViolation(f"{path}.spec.tenant", "admins must name the tenant"))
        if not bad and not admin and item.spec.tenant and item.spec.tenant != caller_tenant:
            parsed.error = errors.PermissionDenied(
                f"tenant {caller_tenant} may not submit for tenant {item.spec.tenant}"
            )
            out.append(parsed)
            continue
        if bad:
            parsed.error = errors.InvalidArgument.fields(*bad)
            out.append(parsed)
            continue
        tenant = item.spec.tenant if admin else caller_tenant
        spec = job_pb2.JobSpec()
        spec.CopyFrom(item.spec)
        spec.job_set_id = request.job_set_id
        spec.tenant = tenant
        if not spec.queue:
            spec.queue = "default"
        try:
            req = request_from_spec("pending", spec, tenant)
        except errors.InvalidArgument as exc:
            rebased = tuple(FieldViolation(f"{path}.{v.field}", v.description) for v in exc.details.field_violations)
            parsed.error = errors.InvalidArgument.fields(*rebased)
            out.append(parsed)
            continue
        models = sorted({m for ps in req.pod_sets for m in ps.shape.gpu_models})
        parsed.spec = spec
        parsed.request = req
        parsed.new_job = NewJob(
            tenant=tenant,
            queue=spec.queue,
            spec=spec.SerializeToString(deterministic=True),
            job_set=request.job_set_id,
            priority_band=spec.priority_band or "default",
            priority=spec.priority,
            preemptible=spec.preemptible,
            labels=freeze_labels(dict(spec.labels)),
            gpus=_gpu_demand(req),
            gpu_models=tuple(models),
            max_infra_retries=spec.max_infra_retries if spec.HasField("max_infra_retries") else None,
            max_runtime_s=_dur_s(spec.max_runtime) if spec.HasField("max_runtime") else None,
            idempotency_key=item.idempotency_key,
        )
        out.append(parsed)
    return out


# ----------------------------------------------------------------------------- job views


def _rendezvous(job_id: str, a: AttemptRecord, spec: job_pb2.JobSpec) -> str:
    if a.rendezvous:
        return a.rendezvous  # as the agent wired it
    if not a.namespace or not spec.pod_sets:
        return ""  # before accept the namespace is not known
    framework = (
        job_pb2.Framework.Name(spec.framework).removeprefix("FRAMEWORK_")
        if spec.framework in job_pb2.Framework.values()
        else ""
    )
    return jobstatus.rendezvous_address(
        job_id, a.number, spec.pod_sets[0].name, a.namespace, framework, spec.rendezvous_port
    )


def _attempt_to_proto(
    a: AttemptRecord,
    level: str = "",
    job_id: str = "",
    spec: job_pb2.JobSpec | None = None,
    templates: Sequence[tuple[str, str]] = (),
) -> job_pb2.Attempt:
    out = job_pb2.Attempt(
        number=a.number,
        cluster=a.cluster,
        gpu_model=a.gpu_model,
        namespace=a.namespace,
        outcome_message=a.message,
        spent_retry=a.spent_retry,
        domain_level=level if a.domain else "",
    )
    for rep in a.replicas:
        status = out.replicas.add(
            pod_set=rep.pod_set,
            index=rep.index,
            pod_name=rep.pod,
            node=rep.node,
            reason=rep.reason,
            message=rep.message,
        )
        phase = f"REPLICA_PHASE_{rep.phase}"
        status.phase = (
            common_pb2.ReplicaPhase.Value(phase)
            if phase in common_pb2.ReplicaPhase.keys()
            else common_pb2.REPLICA_PHASE_UNSPECIFIED
        )
        if rep.exit_code is not None:
            status.exit_code = rep.exit_code
    if spec is not None:
        out.rendezvous_address = _rendezvous(job_id, a, spec)
    for link in jobstatus.log_links(templates, job_id, a) if job_id else ():
        ll = out.log_links.add(name=link.name, url=link.url, pod_set=link.pod_set)
        if link.index is not None:
            ll.index = link.index
    for seg in a.domain:
        out.domain.segments.add(value=seg)
    for r in a.assignments:
        out.assignments.add(pod_set=r.pod_set, index=r.index, node=r.node)
    for name in ("reserve_time", "dispatch_time", "accept_time", "start_time", "running_time", "end_time"):
        t = getattr(a, name)
        if t is not None:
            getattr(out, name).CopyFrom(ts(t))
    if a.outcome is not None:
        out.outcome = job_pb2.AttemptOutcome.Value(f"ATTEMPT_OUTCOME_{a.outcome.value}")
    if a.exit_code is not None:
        out.exit_code = a.exit_code
    if a.rejection_reason or a.rejection_nodes:
        name = (
            a.rejection_reason
            if a.rejection_reason.startswith("DISPATCH_REJECT_REASON_")
            else (
                f"DISPATCH_REJECT_REASON_{a.rejection_reason}"
                if a.rejection_reason
                else "DISPATCH_REJECT_REASON_UNSPECIFIED"
            )
        )
        try:
            out.rejection.reason = job_pb2.DispatchRejectReason.Value(name)
        except ValueError:
            out.rejection.reason = job_pb2.DISPATCH_REJECT_REASON_UNSPECIFIED
        out.rejection.message = a.message
        out.rejection.nodes.extend(a.rejection_nodes)
    return out


def state_to_proto(state: JobState) -> int:
    return int(job_pb2.JobState.Value(f"JOB_STATE_{state.value}"))


def state_from_proto(value: int) -> JobState:
    return JobState(job_pb2.JobState.Name(value).removeprefix("JOB_STATE_"))  # type: ignore[arg-type]


def job_to_proto(
    rec: JobRecord,
    attempts: Sequence[AttemptRecord] = (),
    history: Iterable[WatchEvent] = (),
    queue_info: jobstatus.QueueView | None = None,
    full: bool = True,
    templates: Mapping[str, Sequence[tuple[str, str]]] | None = None,
) -> job_pb2.Job:
    """queue_info: position, why it waits and the clusters' verdicts; templates: per cluster, its log URL
    templates (name, template) from Hello."""
    job = job_pb2.Job(job_id=rec.job_id)
    job.spec.ParseFromString(rec.spec)
    st = job.status
    st.state = state_to_proto(rec.state)  # type: ignore[assignment]
    st.current_attempt = rec.attempt
    st.create_time.CopyFrom(ts(rec.create_time))
    st.update_time.CopyFrom(ts(rec.update_time))
    st.infra_retries = rec.infra_retries
    st.message = rec.message
    st.revision = rec.revision
    st.held = rec.held
    st.held_by = rec.held_by
    if queue_info is not None and rec.state is JobState.QUEUED:
        if queue_info.position is not None:
            st.queue_info.position = queue_info.position
        st.queue_info.reason = job_pb2.WaitReason.Value(f"WAIT_REASON_{queue_info.reason}")
        st.queue_info.message = queue_info.message
        for v in queue_info.clusters:
            out = st.queue_info.clusters.add(
                cluster=v.cluster,
                message=v.message,
                reason=job_pb2.ClusterVerdictReason.Value(f"CLUSTER_VERDICT_REASON_{v.verdict.value}"),
            )
            if v.fit_reason is not None:
                out.fit_reason = common_pb2.FitReason.Value(f"FIT_REASON_{v.fit_reason.name}")
    if full:
        for a in attempts:
            st.attempts.append(
                _attempt_to_proto(
                    a, job.spec.topology.required_level, rec.job_id, job.spec, (templates or {}).get(a.cluster, ())
                )
            )
        waiting = jobstatus.waiting_message(rec, attempts[-1] if attempts else None)
        if waiting is not None:
            st.message = waiting
        for ev in history:
            st.history.append(_transition(ev))
    return job


def _transition(ev: WatchEvent) -> job_pb2.StateTransition:
    out = job_pb2.StateTransition(
        to_state=state_to_proto(ev.to_state),  # type: ignore[arg-type]
        attempt=ev.attempt,
        reason=ev.reason,
        message=ev.message,
        actor=ev.actor,
    )
    if ev.from_state is not None:
        out.from_state = state_to_proto(ev.from_state)  # type: ignore[assignment]
    out.time.CopyFrom(ts(ev.time))
    return out


def event_to_proto(ev: WatchEvent, job: JobRecord | None) -> job_service_pb2.JobEvent:
    kind = {"SUBMITTED": svc.JOB_EVENT_TYPE_SUBMITTED, "UPDATED": svc.JOB_EVENT_TYPE_JOB_UPDATED}.get(
        ev.kind.value, svc.JOB_EVENT_TYPE_STATE_CHANGED
    )
    out = svc.JobEvent(revision=ev.revision, type=kind, job_id=ev.job_id)
    out.time.CopyFrom(ts(ev.time))
    out.transition.CopyFrom(_transition(ev))
    if job is not None:
        out.job.CopyFrom(job_to_proto(job, full=False))
    return out


def bookmark(revision: int, now: float) -> job_service_pb2.JobEvent:
    out = svc.JobEvent(revision=revision, type=svc.JOB_EVENT_TYPE_BOOKMARK)
    out.time.CopyFrom(ts(now))
    return out
