"""The schema checks of every request's and JobSpec's fields, each violation naming the field path.

Patterns are anchored with ``\\A``/``\\Z`` and applied with ``fullmatch``: ``$`` also matches before a final
newline, which let ``"default\\n"`` pass as a queue name. The untrusted pod template rules are
``validation_templates``'s, the bounds ``validation_limits``'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from broker.api.validation_enums import unknown_enums
from broker.api.validation_limits import (
    MAX_ANNOTATIONS_BYTES,
    MAX_BOOKMARK_S,
    MAX_CPU_MILLI,
    MAX_DEVICE_COUNT,
    MAX_DEVICE_REQUESTS,
    MAX_DISPLAY_NAME,
    MAX_DURATION_S,
    MAX_EXTENDED_AMOUNT,
    MAX_GPU_MEMORY_MIB,
    MAX_INFRA_RETRIES,
    MAX_ITEMS,
    MAX_JOB_ID,
    MAX_KEY,
    MAX_MEMORY_BYTES,
    MAX_MIG_COUNT,
    MAX_NAME,
    MAX_NAMES,
    MAX_PAGE_TOKEN,
    MAX_POD_SET_NAME,
    MAX_POD_SETS,
    MAX_PRIORITY,
    MAX_REASON,
    MAX_REPLICAS,
    MAX_REVISION,
    MAX_SELECTOR_BYTES,
    MAX_SELECTOR_ENTRIES,
    MAX_SELECTORS,
    MAX_SELECTORS_TOTAL_BYTES,
    MAX_SPEC_BYTES,
    MAX_SUBDOMAIN,
    MAX_TIMESTAMP_S,
    MAX_WATCH_JOB_IDS,
)
from broker.api.validation_templates import load_template
from broker.domain.errors import FieldViolation, InvalidArgument
from placement.dra import check_selector
from placement.podspec import GPU_RESOURCE, MIG_RESOURCE_PREFIX

__all__ = [
    "DNS1035",
    "raise_if",
    "check_text",
    "check_job_id",
    "check_key",
    "check_submit",
    "check_spec",
    "check_list_jobs",
    "check_watch_jobs",
    "check_cancel_job",
    "check_cancel_job_set",
    "check_job_request",
    "check_get_usage",
    "check_export_usage",
    "check_set_job_priority",
    "check_list_clusters",
    "check_cluster_request",
]

DNS1035 = re.compile(r"\A[a-z]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_LABEL = re.compile(r"\A[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN = re.compile(r"\A[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_LABEL_NAME = re.compile(r"\A([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"\A(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_EXTENDED_NAME = re.compile(r"\A([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*\Z")
_MIG_PROFILE = re.compile(r"\A[1-7]g\.[0-9]+gb(\+me)?\Z")
_LEVEL = re.compile(r"\A[A-Za-z0-9./_-]+\Z")
_PAGE_TOKEN = re.compile(r"\A[A-Za-z0-9_-]*\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""Control characters: none in names, keys and single-line text."""
_CONTROL_MULTILINE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters other than tab and line breaks (free text such as a cancel reason)."""

V = FieldViolation


def raise_if(violations: list[FieldViolation]) -> None:
    """Raise one INVALID_ARGUMENT listing every violation (BadRequest details at the edge)."""
    if violations:
        raise InvalidArgument.fields(*violations)


def check_text(
    value: str, path: str, max_len: int, *, multiline: bool = False, required: bool = False
) -> list[FieldViolation]:
    """Free text that reaches the store, the audit log and other people's terminals: bounded, and without NUL
    (PostgreSQL refuses it in text) or other control characters (line breaks only where the field is prose)."""
    if not value:
        return [V(path, "required")] if required else []
    if len(value) > max_len:
        return [V(path, f"at most {max_len} characters")]
    if (_CONTROL_MULTILINE if multiline else _CONTROL).search(value):
        allowed = " other than tab and line breaks" if multiline else ""
        return [V(path, f"must not contain control characters{allowed}")]
    return []


def _named(value: str, path: str, pattern: re.Pattern[str], max_len: int, what: str) -> list[FieldViolation]:
    if len(value) > max_len or pattern.fullmatch(value) is None:
        return [V(path, f"must be {what} of at most {max_len} characters")]
    return []


def _dns_label(value: str, path: str) -> list[FieldViolation]:
    return _named(value, path, DNS1123_LABEL, MAX_NAME, "a DNS-1123 label")


def _subdomain(value: str, path: str, max_len: int = MAX_SUBDOMAIN) -> list[FieldViolation]:
    return _named(value, path, DNS1123_SUBDOMAIN, max_len, "a DNS-1123 subdomain")


def _name(value: str, path: str) -> list[FieldViolation]:
    """Tenants, bands, regions, roles, GPU models: Kubernetes label values (they travel as labels and are
    compared with what agents report), never empty."""
    if not value:
        return [V(path, "must not be empty")]
    return _named(
        value, path, _LABEL_VALUE, MAX_NAME, "a name of letters, digits, '-', '_' and '.' (alphanumeric at both ends)"
    )


def _names(
    values: Iterable[str], path: str, check: Callable[[str, str], list[FieldViolation]], limit: int = MAX_NAMES
) -> list[FieldViolation]:
    items = list(values)
    if len(items) > limit:
        return [V(path, f"at most {limit} entries")]
    return [v for i, value in enumerate(items) for v in check(value, f"{path}[{i}]")]


def _filters(tenant: str, queue: str, job_set_id: str) -> list[FieldViolation]:
    """The filters ListJobs, WatchJobs and CancelJobSet share (empty = not filtered)."""
    out: list[FieldViolation] = []
    if tenant:
        out.extend(_name(tenant, "tenant"))
    if queue:
        out.extend(_dns_label(queue, "queue"))
    if job_set_id:
        out.extend(_subdomain(job_set_id, "job_set_id", MAX_NAME))
    return out


def check_list_jobs(req: Any) -> list[FieldViolation]:
    """A ListJobsRequest's fields (duck-typed); unknown enum values are the edge's check."""
    out = _filters(req.tenant, req.queue, req.job_set_id)
    if req.cluster:
        out.extend(_subdomain(req.cluster, "cluster"))
    if req.gpu_model:
        out.extend(_name(req.gpu_model, "gpu_model"))
    if req.page_size > 1000:
        out.append(V("page_size", "must lie in 0..1000"))
    if len(req.page_token) > MAX_PAGE_TOKEN or _PAGE_TOKEN.fullmatch(req.page_token) is None:
        out.append(V("page_token", "not a token this broker issued"))
    if len(req.label_selector) > MAX_SELECTOR_ENTRIES:
        out.append(V("label_selector", f"at most {MAX_SELECTOR_ENTRIES} pairs"))
    else:
        out.extend(_label_map(req.label_selector, "label_selector"))
    return out


def check_watch_jobs(req: Any) -> list[FieldViolation]:
    """A WatchJobsRequest's fields: the revision must fit the store's 64-bit integers."""
    out = _filters(req.tenant, req.queue, req.job_set_id)
    if req.from_revision > MAX_REVISION:
        out.append(V("from_revision", f"must be at most {MAX_REVISION} (2^63 - 1)"))
    if req.bookmark_interval_seconds > MAX_BOOKMARK_S:
        out.append(V("bookmark_interval_seconds", f"must lie in 0..{MAX_BOOKMARK_S}"))
    if len(req.job_ids) > MAX_WATCH_JOB_IDS:
        out.append(V("job_ids", f"at most {MAX_WATCH_JOB_IDS} job ids"))
    else:
        for i, job_id in enumerate(req.job_ids):
            out.extend(check_job_id(job_id, f"job_ids[{i}]"))
    return out


def check_cancel_job(req: Any) -> list[FieldViolation]:
    return check_job_request(req)


def check_cancel_job_set(req: Any) -> list[FieldViolation]:
    out = [V("job_set_id", "required")] if not req.job_set_id else []
    out.extend(_filters(req.tenant, "", req.job_set_id))
    out.extend(check_text(req.reason, "reason", MAX_REASON, multiline=True))
    return out


def check_job_request(req: Any) -> list[FieldViolation]:
    """RequeueJob / HoldJob / ReleaseJob (and CancelJob): a job id, and a reason for the history and audit log."""
    return check_job_id(req.job_id) + check_text(req.reason, "reason", MAX_REASON, multiline=True)


def check_get_usage(req: Any) -> list[FieldViolation]:
    return _filters(req.tenant, "", "")


def _check_timestamp(ts: Any, path: str) -> list[FieldViolation]:
    if not 0 <= ts.seconds <= MAX_TIMESTAMP_S:
        return [V(f"{path}.seconds", f"must lie in 0..{MAX_TIMESTAMP_S} (1970 to 9999)")]
    if not 0 <= ts.nanos <= 999_999_999:
        return [V(f"{path}.nanos", "must lie in 0..999999999")]
    return []


def check_export_usage(req: Any) -> list[FieldViolation]:
    """The window's ends are valid timestamps and `until` is not before `since`."""
    out = _filters(req.tenant, "", "")
    bad = []
    for name in ("since", "until"):
        if req.HasField(name):
            bad.extend(_check_timestamp(getattr(req, name), name))
    out.extend(bad)
    if (
        not bad
        and req.HasField("since")
        and req.HasField("until")
        and (req.until.seconds, req.until.nanos) < (req.since.seconds, req.since.nanos)
    ):
        out.append(V("until", "must not be before since"))
    return out


def check_set_job_priority(req: Any) -> list[FieldViolation]:
    """A job id, a new priority and / or band (at least one), and a reason. Whether the tenant may use the band
    is the handler's check (it depends on the job's tenant)."""
    out = check_job_id(req.job_id)
    if not req.HasField("priority") and not req.priority_band:
        out.append(V("priority", "give a priority and / or a priority_band"))
    if req.HasField("priority") and not -MAX_PRIORITY <= req.priority <= MAX_PRIORITY:
        out.append(V("priority", f"must lie in -{MAX_PRIORITY}..{MAX_PRIORITY}"))
    if req.priority_band:
        out.extend(_name(req.priority_band, "priority_band"))
    out.extend(check_text(req.reason, "reason", MAX_REASON, multiline=True))
    return out


def check_list_clusters(req: Any) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if req.region:
        out.extend(_name(req.region, "region"))
    if req.role:
        out.extend(_name(req.role, "role"))
    return out


def check_cluster_request(req: Any, *, reason: bool = False) -> list[FieldViolation]:
    """GetCluster / Cordon / Uncordon: a cluster name, and for the admin changes a reason for the audit log."""
    out = [V("name", "required")] if not req.name else _subdomain(req.name, "name")
    if reason:
        out.extend(check_text(req.reason, "reason", MAX_REASON, multiline=True, required=True))
    return out


def check_job_id(job_id: str, path: str = "job_id") -> list[FieldViolation]:
    if not job_id:
        return [V(path, "required")]
    if len(job_id) > MAX_JOB_ID or not DNS1035.fullmatch(job_id):
        return [V(path, f"must be a DNS-1035 label of at most {MAX_JOB_ID} characters")]
    return []


def _label_map(m: Mapping[str, str], path: str, *, values: bool = True) -> Iterator[FieldViolation]:
    for key, value in m.items():
        prefix, slash, name = key.rpartition("/")
        if (
            not name
            or len(name) > MAX_NAME
            or not _LABEL_NAME.fullmatch(name)
            or (slash and (len(prefix) > MAX_SUBDOMAIN or not DNS1123_SUBDOMAIN.fullmatch(prefix)))
        ):
            yield V(f"{path}[{key!r}]", "not a valid Kubernetes label key")
        elif values and (len(value) > MAX_NAME or not _LABEL_VALUE.fullmatch(value)):
            yield V(f"{path}[{key!r}]", "not a valid Kubernetes label value")


def check_submit(job_set_id: str, n_items: int) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if not job_set_id:
        out.append(V("job_set_id", "required"))
    else:
        out.extend(_subdomain(job_set_id, "job_set_id", MAX_NAME))
    if n_items == 0:
        out.append(V("items", "at least one item is required"))
    elif n_items > MAX_ITEMS:
        out.append(V("items", f"at most {MAX_ITEMS} items per call"))
    return out


def check_key(key: str, path: str) -> list[FieldViolation]:
    if not key:
        return [V(path, "required")]
    return check_text(key, path, MAX_KEY)


def check_spec(spec: Any, path: str) -> list[FieldViolation]:
    """Schema checks on a tandem.v1.JobSpec (duck-typed: only attribute reads, no proto imports)."""
    if spec.ByteSize() > MAX_SPEC_BYTES:
        return [V(path, f"at most {MAX_SPEC_BYTES} bytes serialized (templates, labels and annotations in all)")]
    out: list[FieldViolation] = unknown_enums(spec, path)
    if spec.tenant:
        out.extend(_name(spec.tenant, f"{path}.tenant"))
    if spec.queue:
        out.extend(_dns_label(spec.queue, f"{path}.queue"))
    if spec.priority_band:
        out.extend(_name(spec.priority_band, f"{path}.priority_band"))
    if spec.namespace_hint:
        out.extend(_dns_label(spec.namespace_hint, f"{path}.namespace_hint"))
    if not -MAX_PRIORITY <= spec.priority <= MAX_PRIORITY:
        out.append(V(f"{path}.priority", f"must lie in -{MAX_PRIORITY}..{MAX_PRIORITY}"))
    out.extend(check_text(spec.display_name, f"{path}.display_name", MAX_DISPLAY_NAME))
    if not spec.pod_sets:
        out.append(V(f"{path}.pod_sets", "at least one pod set is required"))
    elif len(spec.pod_sets) > MAX_POD_SETS:
        out.append(V(f"{path}.pod_sets", f"at most {MAX_POD_SETS} pod sets"))
        return out  # bounded work: the pod sets are not looked at one by one
    names: set[str] = set()
    total = 0
    selector_budget = [MAX_SELECTORS_TOTAL_BYTES]
    for i, ps in enumerate(spec.pod_sets):
        p = f"{path}.pod_sets[{i}]"
        if not ps.name:
            out.append(V(f"{p}.name", "required"))
        elif len(ps.name) > MAX_POD_SET_NAME or not DNS1035.fullmatch(ps.name):
            out.append(V(f"{p}.name", f"must be a DNS-1035 label of at most {MAX_POD_SET_NAME} characters"))
        elif ps.name in names:
            out.append(V(f"{p}.name", "duplicate pod set name"))
        names.add(ps.name)
        if ps.count < 1:
            out.append(V(f"{p}.count", "must be >= 1"))
        elif ps.count > MAX_REPLICAS:
            out.append(V(f"{p}.count", f"at most {MAX_REPLICAS}"))
        total += ps.count
        if not ps.HasField("shape"):
            out.append(V(f"{p}.shape", "required"))
        else:
            out.extend(_check_shape(ps.shape, f"{p}.shape", selector_budget))
        tp = f"{p}.pod_template_json"
        out.extend(load_template(ps.pod_template_json, tp)[1])
    if total > MAX_REPLICAS:
        out.append(V(f"{path}.pod_sets", f"at most {MAX_REPLICAS} replicas in all"))
    if spec.HasField("min_available") and (spec.min_available < 1 or spec.min_available > total):
        out.append(V(f"{path}.min_available", f"must lie in 1..{total} (total replicas)"))
    topo = spec.topology
    for fname in ("required_level", "preferred_level"):
        value = getattr(topo, fname)
        if value and (len(value) > MAX_SUBDOMAIN + 1 + MAX_NAME or not _LEVEL.fullmatch(value)):
            out.append(V(f"{path}.topology.{fname}", "not a level name or label key"))
    for fname in ("max_runtime", "start_timeout", "termination_grace_period"):
        if spec.HasField(fname):
            out.extend(_check_duration(getattr(spec, fname), f"{path}.{fname}"))
    if spec.HasField("max_infra_retries") and spec.max_infra_retries > MAX_INFRA_RETRIES:
        out.append(V(f"{path}.max_infra_retries", f"at most {MAX_INFRA_RETRIES}"))
    sel, loc = spec.cluster_selector, spec.data_locality
    out.extend(_names(sel.clusters, f"{path}.cluster_selector.clusters", _subdomain))
    out.extend(_names(sel.regions, f"{path}.cluster_selector.regions", _name))
    out.extend(_names(sel.roles, f"{path}.cluster_selector.roles", _name))
    out.extend(_names(loc.preferred_clusters, f"{path}.data_locality.preferred_clusters", _subdomain))
    out.extend(_names(loc.preferred_regions, f"{path}.data_locality.preferred_regions", _name))
    out.extend(_label_map(spec.labels, f"{path}.labels"))
    out.extend(_label_map(spec.annotations, f"{path}.annotations", values=False))
    if sum(len(k) + len(v) for k, v in spec.annotations.items()) > MAX_ANNOTATIONS_BYTES:
        out.append(V(f"{path}.annotations", f"at most {MAX_ANNOTATIONS_BYTES} characters in all"))
    if spec.rendezvous_port > 65535:
        out.append(V(f"{path}.rendezvous_port", "must be a TCP port (1..65535) or 0"))
    return out


def _check_duration(d: Any, path: str) -> list[FieldViolation]:
    """A google.protobuf.Duration that becomes a deadline: positive, normalised, at most MAX_DURATION_S."""
    if not 0 <= d.nanos <= 999_999_999:
        return [V(path, "nanos must lie in 0..999999999")]
    if d.seconds < 0 or (d.seconds == 0 and d.nanos == 0):
        return [V(path, "must be positive")]
    if d.seconds > MAX_DURATION_S or (d.seconds == MAX_DURATION_S and d.nanos):
        return [V(path, f"at most {MAX_DURATION_S} seconds (ten years)")]
    return []


def _check_shape(shape: Any, p: str, selector_budget: list[int]) -> Iterator[FieldViolation]:
    """One replica's shape. `selector_budget` is the job's remaining CEL text (one list shared by its pod sets):
    every selector compiles here, so the job's total is bounded too."""
    if shape.gpu_count > 64:
        yield V(f"{p}.gpu_count", "at most 64 GPUs per replica")
    if shape.gpu_milli > 1000:
        yield V(f"{p}.gpu_milli", "must lie in 0..1000")
    elif 0 < shape.gpu_milli < 1000 and shape.gpu_count != 1:
        yield V(f"{p}.gpu_milli", "a GPU share needs gpu_count = 1")
    if shape.min_gpu_memory_mib > MAX_GPU_MEMORY_MIB:
        yield V(f"{p}.min_gpu_memory_mib", f"at most {MAX_GPU_MEMORY_MIB}")
    if shape.mig_profile:
        if len(shape.mig_profile) > MAX_NAME or not _MIG_PROFILE.fullmatch(shape.mig_profile):
            yield V(f"{p}.mig_profile", "not a MIG profile name like 1g.10gb")
        if shape.gpu_count > 0:
            yield V(f"{p}.mig_profile", "exclusive with gpu_count > 0")
        if shape.mig_count < 1:
            yield V(f"{p}.mig_count", "must be >= 1 when mig_profile is set")
        elif shape.mig_count > MAX_MIG_COUNT:
            yield V(f"{p}.mig_count", f"at most {MAX_MIG_COUNT}")
    elif shape.mig_count:
        yield V(f"{p}.mig_count", "must be 0 without mig_profile")
    for fname, top in (("cpu_milli", MAX_CPU_MILLI), ("memory_bytes", MAX_MEMORY_BYTES)):
        value = getattr(shape, fname)
        if value < 0:
            yield V(f"{p}.{fname}", "must not be negative")
        elif value > top:
            yield V(f"{p}.{fname}", f"at most {top}")
    yield from _names(shape.allowed_gpu_models, f"{p}.allowed_gpu_models", _name)
    for name, amount in shape.extended_resources.items():
        prefix, slash, base = name.rpartition("/")
        ep = f"{p}.extended_resources[{name!r}]"
        if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
            yield V(ep, "use gpu_count / mig_profile")
        elif (
            not _EXTENDED_NAME.fullmatch(name)
            or len(base) > MAX_NAME
            or (slash and (len(prefix) > MAX_SUBDOMAIN or not DNS1123_SUBDOMAIN.fullmatch(prefix)))
        ):
            yield V(ep, "not a resource name")
        elif amount < 0:
            yield V(ep, "must not be negative")
        elif amount > MAX_EXTENDED_AMOUNT:
            yield V(ep, f"at most {MAX_EXTENDED_AMOUNT}")
    if len(shape.device_requests) > MAX_DEVICE_REQUESTS:
        yield V(f"{p}.device_requests", f"at most {MAX_DEVICE_REQUESTS} device requests")
        return
    seen: set[str] = set()
    for i, req in enumerate(shape.device_requests):
        rp = f"{p}.device_requests[{i}]"
        if not req.name or _dns_label(req.name, rp) or req.name in seen:
            yield V(f"{rp}.name", "a unique DNS label is required")
        seen.add(req.name)
        if not req.device_class_name or _subdomain(req.device_class_name, rp):
            yield V(f"{rp}.device_class_name", "a DeviceClass name is required")
        if req.count > MAX_DEVICE_COUNT:
            yield V(f"{rp}.count", f"at most {MAX_DEVICE_COUNT}")
        if len(req.selectors) > MAX_SELECTORS:
            yield V(f"{rp}.selectors", f"at most {MAX_SELECTORS} selectors")
            continue
        for j, expression in enumerate(req.selectors):
            yield from _check_selector(expression, f"{rp}.selectors[{j}]", selector_budget)


def _check_selector(expression: str, path: str, budget: list[int]) -> Iterator[FieldViolation]:
    """A CEL selector is compiled (and later evaluated) by a native library whose parser recurses: a long
    enough chain of operators overflows its stack and kills the process. Kubernetes' own bound (10 KiB per
    expression) is far below that; within it, a selector that does not compile is refused here."""
    if not expression:
        yield V(path, "must not be empty")
        return
    if len(expression) > MAX_SELECTOR_BYTES:
        yield V(path, f"at most {MAX_SELECTOR_BYTES} characters")
        return
    budget[0] -= len(expression)
    if budget[0] < 0:
        yield V(path, f"the job's selectors exceed {MAX_SELECTORS_TOTAL_BYTES} characters in all")
        return
    try:
        check_selector(expression)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        problem = getattr(exc, "problem", None) or "does not compile"
        yield V(path, f"not a valid CEL expression: {problem}")
