"""Every check on what a tenant sends, each violation naming the field path, and the untrusted pod template rules.

Patterns are anchored with ``\\A``/``\\Z`` and applied with ``fullmatch``: ``$`` also matches before a final
newline, which let ``"default\\n"`` pass as a queue name. Numbers are bounded where they reach the store
(SQLite / PostgreSQL integers are 64-bit) or arithmetic, and nested JSON is measured without recursion before
anything recursive reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from broker.tenancy import podsecurity
from broker.domain.errors import FieldViolation, InvalidArgument
from broker.tenancy.policy import TenantPolicy
from placement.dra import check_selector

__all__ = [
    "DNS1035",
    "check_job_id",
    "check_submit",
    "check_spec",
    "check_pod_template",
    "check_untrusted",
    "RESERVED_DOMAINS",
    "reserved_key",
    "check_text",
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
    "check_json_depth",
    "json_depth",
    "unknown_enums",
    "raise_if",
    "MAX_ITEMS",
]

MAX_ITEMS = 1000
MAX_JOB_ID = 40
MAX_POD_SET_NAME = 12
MAX_KEY = 128
MAX_TEMPLATE_BYTES = 256 * 1024
MAX_SPEC_BYTES = 1536 * 1024
"""A whole JobSpec, serialized: what etcd keeps of one object (the agent renders the templates into Jobs), and
small enough that any one job fits in a response (ListJobs pages are cut by size, never below one job)."""
MAX_REASON = 1024
MAX_NAME = 63
"""DNS-1123 labels and label values (queues, tenants, bands, regions, roles, GPU models)."""
MAX_SUBDOMAIN = 253
MAX_DISPLAY_NAME = 253
MAX_JSON_DEPTH = 64
"""Nesting levels of a pod template (real PodTemplateSpecs stay near 12); deeper is refused before json.loads."""
MAX_POD_SETS = 64
MAX_REPLICAS = 99_999
"""Per pod set (pod hostnames must fit in 63) and for the whole job."""
MAX_SELECTOR_ENTRIES = 64
"""ListJobs label_selector pairs (each is one SQL condition)."""
MAX_PAGE_TOKEN = 512
MAX_WATCH_JOB_IDS = 1000
MAX_BOOKMARK_S = 3600
MAX_REVISION = (1 << 63) - 1
"""Store revisions are 64-bit signed integers."""
MAX_DURATION_S = 10 * 365 * 86400
"""Ten years: runtimes, start timeouts and grace periods beyond this are mistakes, and they become deadlines."""
MAX_INFRA_RETRIES = 1000
MAX_GPU_MEMORY_MIB = 1 << 24
MAX_CPU_MILLI = 10**9
MAX_MEMORY_BYTES = 1 << 50
MAX_EXTENDED_AMOUNT = 10**9
MAX_MIG_COUNT = 7 * 64
MAX_DEVICE_REQUESTS = 32
"""Kubernetes' own limits for a ResourceClaim: 32 requests, 32 selectors each, 10 KiB per CEL expression; the
DRA device count is bounded by its 32 allocation results."""
MAX_SELECTORS = 32
MAX_SELECTOR_BYTES = 10 * 1024
MAX_SELECTORS_TOTAL_BYTES = 64 * 1024
"""All selectors of one job: each compiles once at submission and is evaluated per device at placement."""
MAX_DEVICE_COUNT = 32
MAX_ANNOTATIONS_BYTES = 256 * 1024
"""Kubernetes' limit on the total size of an object's annotations."""
MAX_NAMES = 256
"""Entries of a cluster selector or data-locality list, GPU models of a shape."""

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
_JSON_SPECIAL = re.compile(r'["\\\[\]{}]')
"""What a JSON nesting count looks at: quotes, backslashes and brackets."""

V = FieldViolation

_AGENT_OWNED = {
    "nodeName": "the broker and the agent choose nodes",
    "schedulerName": "the agent sets the scheduler",
    "priority": "priority comes from the job's priority band",
    "priorityClassName": "priority comes from the job's priority band",
    "preemptionPolicy": "it comes from the job's priority band and preemptible flag",
    "schedulingGates": "the agent owns scheduling gates",
    "hostname": "the Job controller names each replica's host for rendezvous DNS (read TANDEM_RENDEZVOUS_HOST)",
    "subdomain": "the agent sets it to the gang's headless Service",
    "activeDeadlineSeconds": "the agent sets the deadline from the job's max_runtime and start_timeout",
    "overhead": "RuntimeClass admission sets it (the API server refuses a pod that sets its own)",
}
"""H-4: spec fields the agent owns, each refused with its reason rather than silently overwritten (a template
that sets one expects its effect). The one exception is `restartPolicy`: the agent sets Never (a failed
replica ends the attempt; retries are the broker's), so `Never` in a template is allowed, any other value
refused (_RESTART_POLICY)."""
_RESTART_POLICY = "Never"
_PINNING_CONFLICTS = {
    "affinity.nodeAffinity": "the agent sets node affinity (the gang's domain and each replica's node)",
    "affinity.podAffinity": "every replica is pinned to the node the broker chose; inter-pod affinity is not "
                            "modelled and could only leave a pinned replica unschedulable",
    "affinity.podAntiAffinity": "every replica is pinned to the node the broker chose; anti-affinity could only "
                                "leave a pinned replica unschedulable (the gang would never start)",
    "topologySpreadConstraints": "every replica is pinned to the node the broker chose; spread constraints could "
                                 "only leave a pinned replica unschedulable (the gang would never start)",
}
_POD_LEVEL_RESOURCES = ("cpu", "memory")
"""Pod-level spec.resources names placement.podspec models (kube-scheduler uses pod-level requests when set)."""
RESERVED_DOMAINS = ("tandem.dev", "kubernetes.io", "k8s.io", "batch.kubernetes.io", "kueue.x-k8s.io",
                    "jobset.sigs.k8s.io")
"""H-4: label / annotation key domains a tenant may not set, in pod templates or a job's labels and
annotations. A key is reserved when its prefix (the part before `/`) is one of these domains or a subdomain
of one: `node.kubernetes.io/x` and `topology.k8s.io/x` are reserved, `x-k8s.io/x` is not (`kueue.x-k8s.io`
is listed for that reason: a `queue-name` label hands the Job to Kueue, which suspends it). Exception: the
recommended labels `app.kubernetes.io/*` that users and tools are meant to set, except
`app.kubernetes.io/managed-by`, which Tandem sets on its objects."""
_USER_DOMAIN = "app.kubernetes.io"
_TANDEM_MANAGED_BY = "app.kubernetes.io/managed-by"
_USER_SETTABLE_KEYS = frozenset({"kubectl.kubernetes.io/default-container",
                                 "kubectl.kubernetes.io/default-logs-container"})
"""Keys under a reserved domain that users are meant to set (kubectl's hints of which container to use)."""


def raise_if(violations: list[FieldViolation]) -> None:
    """Raise one INVALID_ARGUMENT listing every violation (BadRequest details at the edge)."""
    if violations:
        raise InvalidArgument.fields(*violations)


def check_text(value: str, path: str, max_len: int, *, multiline: bool = False,
               required: bool = False) -> list[FieldViolation]:
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
    return _named(value, path, _LABEL_VALUE, MAX_NAME,
                  "a name of letters, digits, '-', '_' and '.' (alphanumeric at both ends)")


def _names(values: Iterable[str], path: str, check: Callable[[str, str], list[FieldViolation]],
           limit: int = MAX_NAMES) -> list[FieldViolation]:
    items = list(values)
    if len(items) > limit:
        return [V(path, f"at most {limit} entries")]
    return [v for i, value in enumerate(items) for v in check(value, f"{path}[{i}]")]


def json_depth(text: str, limit: int | None = None) -> int:
    """Deepest nesting of objects and arrays in a JSON text, counted in one pass without recursion (string
    contents skipped), so a template 50,000 levels deep is refused before json.loads or any recursive walker
    sees it. Stops counting once past `limit`."""
    depth = deepest = 0
    in_string = False
    escaped_at = -1
    for m in _JSON_SPECIAL.finditer(text):
        i = m.start()
        if i == escaped_at:
            continue
        ch = m.group()
        if in_string:
            if ch == "\\":
                escaped_at = i + 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if limit is not None and deepest > limit:
                    break
        elif ch in "]}":
            depth -= 1
    return deepest


def check_json_depth(text: str, path: str) -> list[FieldViolation]:
    """The nesting bound on untrusted JSON (pod templates), checked before it is parsed."""
    if len(text) <= MAX_TEMPLATE_BYTES and json_depth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        return [V(path, f"nested more than {MAX_JSON_DEPTH} levels deep")]
    return []


@dataclass(frozen=True, slots=True)
class _EnumPlan:
    """Where a message type keeps enum numbers: its own enum fields, and the message fields that lead to more.
    Built once per type, so a 5,000-node inventory snapshot is checked without listing every field it sets."""

    enums: tuple[tuple[str, bool, frozenset[int], str], ...]
    """(field, repeated, defined numbers, enum name)"""
    children: tuple[tuple[str, str, Any], ...]
    """(field, "one" | "many" | "map" | "map-enum", descriptor of the message or enum below)"""


_PLANS: dict[str, _EnumPlan | None] = {}


def _enum_plan(desc: Any) -> _EnumPlan | None:
    """The plan of a message type, None when no enum lies anywhere below it (memoised per type)."""
    if desc.full_name in _PLANS:
        return _PLANS[desc.full_name]
    _PLANS[desc.full_name] = None  # a recursive type ends here; its own enum fields still count
    enums, children = [], []
    for fd in desc.fields:
        if fd.type == fd.TYPE_ENUM:
            enums.append((fd.name, fd.is_repeated, frozenset(fd.enum_type.values_by_number), fd.enum_type.full_name))
        elif fd.type == fd.TYPE_MESSAGE:
            sub = fd.message_type
            if sub.GetOptions().map_entry:
                vfd = sub.fields_by_name["value"]
                if vfd.type == vfd.TYPE_ENUM:
                    children.append((fd.name, "map-enum", vfd.enum_type))
                elif vfd.type == vfd.TYPE_MESSAGE and _enum_plan(vfd.message_type) is not None:
                    children.append((fd.name, "map", vfd.message_type))
            elif _enum_plan(sub) is not None:
                children.append((fd.name, "many" if fd.is_repeated else "one", sub))
    plan = _EnumPlan(tuple(enums), tuple(children)) if enums or children else None
    _PLANS[desc.full_name] = plan
    return plan


def _bad_enum(value: int, enum_name: str, path: str) -> FieldViolation:
    return V(path, f"{value} is not a {enum_name} value")


def unknown_enums(message: Any, path: str = "") -> list[FieldViolation]:
    """Every enum field of a protobuf message (nested, repeated and map fields too) holding a number its enum
    does not define: proto3 keeps such numbers and `Enum.Name()` raises on them. Duck-typed (descriptors only)."""
    out: list[FieldViolation] = []
    plan = _enum_plan(message.DESCRIPTOR)
    if plan is not None:
        _walk_enums(message, plan, path, out)
    return out


def _walk_enums(msg: Any, plan: _EnumPlan, path: str, out: list[FieldViolation]) -> None:
    for name, repeated, known, enum_name in plan.enums:
        value = getattr(msg, name)
        p = f"{path}.{name}" if path else name
        if repeated:
            out.extend(_bad_enum(v, enum_name, f"{p}[{i}]") for i, v in enumerate(value) if v not in known)
        elif value not in known:
            out.append(_bad_enum(value, enum_name, p))
    for name, kind, desc in plan.children:
        p = f"{path}.{name}" if path else name
        if kind == "one":
            if msg.HasField(name):
                _walk_enums(getattr(msg, name), _PLANS[desc.full_name], p, out)  # type: ignore[arg-type]
        elif kind == "many":
            sub = _PLANS[desc.full_name]
            for i, m in enumerate(getattr(msg, name)):
                _walk_enums(m, sub, f"{p}[{i}]", out)  # type: ignore[arg-type]
        elif kind == "map":
            sub = _PLANS[desc.full_name]
            for k, m in getattr(msg, name).items():
                _walk_enums(m, sub, f"{p}[{k!r}]", out)  # type: ignore[arg-type]
        else:
            known_values = frozenset(desc.values_by_number)
            out.extend(_bad_enum(v, desc.full_name, f"{p}[{k!r}]") for k, v in getattr(msg, name).items()
                       if v not in known_values)


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


MAX_TIMESTAMP_S = 253_402_300_799
"""9999-12-31T23:59:59Z: the largest google.protobuf.Timestamp."""
MAX_PRIORITY = 1000
"""JobSpec.priority and SetJobPriority lie in -MAX_PRIORITY..MAX_PRIORITY."""


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
    if not bad and req.HasField("since") and req.HasField("until") and \
            (req.until.seconds, req.until.nanos) < (req.since.seconds, req.since.nanos):
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
        if (not name or len(name) > MAX_NAME or not _LABEL_NAME.fullmatch(name)
                or (slash and (len(prefix) > MAX_SUBDOMAIN or not DNS1123_SUBDOMAIN.fullmatch(prefix)))):
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
        out.extend(_load_template(ps.pod_template_json, tp)[1])
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
        if name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-"):
            yield V(ep, "use gpu_count / mig_profile")
        elif (not _EXTENDED_NAME.fullmatch(name) or len(base) > MAX_NAME
              or (slash and (len(prefix) > MAX_SUBDOMAIN or not DNS1123_SUBDOMAIN.fullmatch(prefix)))):
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
    except BaseException as exc:  # noqa: BLE001 - SelectorError, or a panic of the native compiler
        problem = getattr(exc, "problem", None) or "does not compile"
        yield V(path, f"not a valid CEL expression: {problem}")


def reserved_key(key: str) -> str | None:
    """The reserved domain a label / annotation key falls under (RESERVED_DOMAINS), else None."""
    prefix, slash, _ = key.rpartition("/")
    if not slash or key in _USER_SETTABLE_KEYS:
        return None
    domain = prefix.lower()
    if domain == _USER_DOMAIN and key != _TANDEM_MANAGED_BY:
        return None
    for reserved in RESERVED_DOMAINS:
        if domain == reserved or domain.endswith("." + reserved):
            return reserved
    return None


def _reserved_keys(m: Any, path: str) -> Iterator[FieldViolation]:
    if m is None:
        return
    if not isinstance(m, Mapping):
        yield V(path, "must be an object")
        return
    for key in m:
        domain = reserved_key(str(key))
        if domain is not None:
            yield V(f"{path}[{key!r}]", f"{domain}/ is a reserved prefix (Kubernetes, Tandem and the queue "
                                        "controllers own these keys)")


def _load_template(text: str, p: str) -> tuple[dict[str, Any] | None, list[FieldViolation]]:
    """The PodTemplateSpec as an object with a `spec` object, or the violations that say why not."""
    if not text:
        return None, [V(p, "a PodTemplateSpec JSON is required")]
    if len(text.encode()) > MAX_TEMPLATE_BYTES:
        return None, [V(p, f"at most {MAX_TEMPLATE_BYTES} bytes")]
    too_deep = check_json_depth(text, p)  # before json.loads, and before any recursive walker
    if too_deep:
        return None, too_deep
    try:
        tpl = json.loads(text)
    except ValueError as exc:
        return None, [V(p, f"not valid JSON: {exc}")]
    if not isinstance(tpl, dict):
        return None, [V(p, "must be a JSON object (PodTemplateSpec)")]
    if not isinstance(tpl.get("spec"), dict):
        return None, [V(f"{p}.spec", "required object")]
    return tpl, []


@dataclass(frozen=True, slots=True)
class _Template:
    """One parsed template under judgement: its spec and metadata, its path, the tenant's policy."""

    spec: Mapping[str, Any]
    meta: Mapping[str, Any]
    path: str
    tenant: TenantPolicy

    def at(self, field: str) -> str:
        return f"{self.path}.spec.{field}"

    def items(self, field: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(path, object) of a list field of the spec; a non-list is reported by the shape check."""
        value = self.spec.get(field)
        if isinstance(value, list):
            for i, item in enumerate(value):
                yield f"{self.at(field)}[{i}]", item if isinstance(item, Mapping) else {}


def _set(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def _owned_fields(t: _Template) -> Iterator[FieldViolation]:
    for key, why in _AGENT_OWNED.items():
        if _set(t.spec.get(key)):
            yield V(t.at(key), f"must not be set: {why}")
    policy = t.spec.get("restartPolicy")
    if _set(policy) and policy != _RESTART_POLICY:
        yield V(t.at("restartPolicy"), "must be Never or unset: the agent runs every replica with restartPolicy "
                                       "Never (a failed replica ends the attempt; retries are the broker's)")


def _namespace_and_containers(t: _Template) -> Iterator[FieldViolation]:
    if _set(t.meta.get("namespace")):
        yield V(f"{t.path}.metadata.namespace", "the agent chooses the namespace")
    if not t.spec.get("containers"):
        yield V(t.at("containers"), "at least one container is required")


def _pinning_conflicts(t: _Template) -> Iterator[FieldViolation]:
    affinity = t.spec.get("affinity")
    for dotted, why in _PINNING_CONFLICTS.items():
        parent, _, key = dotted.rpartition(".")
        holder = affinity if parent == "affinity" else t.spec
        if isinstance(holder, Mapping) and _set(holder.get(key)):
            yield V(t.at(dotted), f"must not be set: {why}")


def _pod_resources(t: _Template) -> Iterator[FieldViolation]:
    """Pod-level resources are modelled for cpu and memory requests only (placement.podspec)."""
    res = t.spec.get("resources")
    if res is None:
        return
    if not isinstance(res, Mapping):
        yield V(t.at("resources"), "must be an object")
        return
    parts: dict[str, Mapping[str, Any]] = {}
    for part, values in res.items():
        if part not in ("requests", "limits"):
            yield V(t.at(f"resources.{part}"), "only requests and limits may be set at pod level")
        elif not isinstance(values, Mapping):
            yield V(t.at(f"resources.{part}"), "must be an object")
        else:
            parts[part] = values
    for part, values in parts.items():
        for name in values:
            if name not in _POD_LEVEL_RESOURCES:
                yield V(t.at(f"resources.{part}[{name!r}]"), "only cpu and memory may be set at pod level "
                                                             "(Tandem plans on what placement models)")
            elif part == "limits" and name not in parts.get("requests", {}):
                yield V(t.at(f"resources.limits[{name!r}]"), f"needs spec.resources.requests[{name!r}] too: Tandem "
                        "plans on requests, and the API server may default the pod's request from this limit")


def _identity(t: _Template) -> Iterator[FieldViolation]:
    """ServiceAccount and RuntimeClass from the tenant's allow-lists (an unset ServiceAccount is the default)."""
    name = t.tenant.name
    for key in ("serviceAccountName", "serviceAccount"):  # serviceAccount: the deprecated alias
        sa = t.spec.get(key)
        if _set(sa) and sa not in t.tenant.service_accounts:
            yield V(t.at(key), f"ServiceAccount {sa!r} is not allowed for tenant {name} "
                               f"(allowed: {', '.join(t.tenant.service_accounts) or 'none'})")
    rc = t.spec.get("runtimeClassName")
    if _set(rc) and rc not in t.tenant.runtime_classes:
        yield V(t.at("runtimeClassName"), f"RuntimeClass {rc!r} is not allowed for tenant {name} "
                                          f"(allowed: {', '.join(t.tenant.runtime_classes) or 'none'})")


def _resource_claims(t: _Template) -> Iterator[FieldViolation]:
    for cp, claim in t.items("resourceClaims"):
        named = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if _set(claim.get(k))]
        for key in named or [""]:
            yield V(f"{cp}.{key}" if key else cp, "the agent renders the pod's claims from the shape's "
                    "device_requests: a template may not reference claims or claim templates of its own")


def _dns_policy(t: _Template) -> Iterator[FieldViolation]:
    if t.spec.get("dnsPolicy") == "None":
        yield V(t.at("dnsPolicy"), "None would break rendezvous: replicas find each other through the gang's "
                                   "headless Service in cluster DNS")


def _tolerations(t: _Template) -> Iterator[FieldViolation]:
    allowed = t.tenant.toleration_keys
    if "*" in allowed:
        return
    for tp, tol in t.items("tolerations"):
        key = tol.get("key") or ""
        if key not in allowed:
            what = f"taint key {key!r}" if key else "an empty key (it tolerates every taint)"
            yield V(f"{tp}.key", f"tolerating {what} is not allowed for tenant {t.tenant.name} "
                                 f"(allowed keys: {', '.join(allowed) or 'none'})")


def _reserved_metadata(t: _Template) -> Iterator[FieldViolation]:
    for part in ("labels", "annotations"):
        yield from _reserved_keys(t.meta.get(part), f"{t.path}.metadata.{part}")


_TANDEM_RULES: tuple[Callable[[_Template], Iterator[FieldViolation]], ...] = (
    _owned_fields, _namespace_and_containers, _pinning_conflicts, _pod_resources, _identity, _resource_claims,
    _dns_policy, _tolerations, _reserved_metadata,
)
"""H-4, Tandem's own rules beyond the Pod Security Standards, in one list."""
_DEFAULT_TENANT = TenantPolicy(name="(defaults)")


def check_pod_template(text: str, p: str, tenant: TenantPolicy | None = None) -> list[FieldViolation]:
    """The untrusted template judged by the tenant's Pod Security level and extra capabilities (broker.tenancy.podsecurity)
    and by Tandem's own rules (_TANDEM_RULES); `tenant` None = a tenant with every default."""
    tpl, bad = _load_template(text, p)
    if tpl is None:
        return bad
    policy = tenant or _DEFAULT_TENANT
    meta = tpl.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        return [V(f"{p}.metadata", "must be an object")]
    t = _Template(tpl["spec"], meta or {}, p, policy)
    out = podsecurity.check(t.spec, policy.pod_security, extra_capabilities=frozenset(policy.extra_capabilities),
                            path=f"{p}.spec", annotations=t.meta.get("annotations"),
                            annotations_path=f"{p}.metadata.annotations")
    for rule in _TANDEM_RULES:
        out.extend(rule(t))
    return out


def check_untrusted(spec: Any, tenant: TenantPolicy | None, path: str) -> list[FieldViolation]:
    """What needs the tenant's policy (a duck-typed, schema-checked JobSpec): every pod template
    (check_pod_template) and the job's own labels and annotations (no reserved prefixes)."""
    out: list[FieldViolation] = []
    for i, ps in enumerate(spec.pod_sets):
        out.extend(check_pod_template(ps.pod_template_json, f"{path}.pod_sets[{i}].pod_template_json", tenant))
    out.extend(_reserved_keys(dict(spec.labels), f"{path}.labels"))
    out.extend(_reserved_keys(dict(spec.annotations), f"{path}.annotations"))
    return out
