"""Every check on what a tenant sends, each violation naming the field path, and the untrusted pod template rules."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from broker.errors import FieldViolation, InvalidArgument

__all__ = [
    "DNS1035",
    "check_job_id",
    "check_submit",
    "check_spec",
    "check_pod_template",
    "raise_if",
    "MAX_ITEMS",
]

MAX_ITEMS = 1000
MAX_JOB_ID = 40
MAX_POD_SET_NAME = 12
MAX_KEY = 128
MAX_TEMPLATE_BYTES = 256 * 1024
MAX_REASON = 1024

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_EXTENDED_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*$")
_MIG_PROFILE = re.compile(r"^[1-7]g\.[0-9]+gb(\+me)?$")

V = FieldViolation

_FORBIDDEN_SPEC_FIELDS = {
    "nodeName": "the broker and agent choose nodes",
    "schedulerName": "the agent sets the scheduler",
    "priorityClassName": "priority comes from the job's priority band",
    "priority": "priority comes from the job's priority band",
    "schedulingGates": "the agent owns scheduling gates",
    "hostNetwork": "host namespaces are not allowed",
    "hostPID": "host namespaces are not allowed",
    "hostIPC": "host namespaces are not allowed",
    "hostUsers": "host user namespace is not allowed",
}
_FORBIDDEN_CAPS = {"SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE", "SYS_MODULE", "ALL"}


def raise_if(violations: list[FieldViolation]) -> None:
    """Raise one INVALID_ARGUMENT listing every violation (BadRequest details at the edge)."""
    if violations:
        raise InvalidArgument.fields(*violations)


def check_job_id(job_id: str, path: str = "job_id") -> list[FieldViolation]:
    if not job_id:
        return [V(path, "required")]
    if len(job_id) > MAX_JOB_ID or not DNS1035.match(job_id):
        return [V(path, f"must be a DNS-1035 label of at most {MAX_JOB_ID} characters")]
    return []


def _label_map(m: Mapping[str, str], path: str, *, values: bool = True) -> Iterator[FieldViolation]:
    for key, value in m.items():
        name = key.rpartition("/")[2]
        prefix = key.rpartition("/")[0]
        if not name or len(name) > 63 or not _LABEL_NAME.match(name) or (prefix and not DNS1123_SUBDOMAIN.match(prefix)):
            yield V(f"{path}[{key!r}]", "not a valid Kubernetes label key")
        elif values and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            yield V(f"{path}[{key!r}]", "not a valid Kubernetes label value")


def check_submit(job_set_id: str, n_items: int) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if not job_set_id:
        out.append(V("job_set_id", "required"))
    elif len(job_set_id) > 63 or not DNS1123_SUBDOMAIN.match(job_set_id):
        out.append(V("job_set_id", "must be a DNS-1123 subdomain of at most 63 characters"))
    if n_items == 0:
        out.append(V("items", "at least one item is required"))
    elif n_items > MAX_ITEMS:
        out.append(V("items", f"at most {MAX_ITEMS} items per call"))
    return out


def check_key(key: str, path: str) -> list[FieldViolation]:
    if not key:
        return [V(path, "required")]
    if len(key) > MAX_KEY:
        return [V(path, f"at most {MAX_KEY} characters")]
    return []


def check_spec(spec: Any, path: str) -> list[FieldViolation]:
    """Schema checks on a tandem.v1.JobSpec (duck-typed: only attribute reads, no proto imports)."""
    out: list[FieldViolation] = []
    if spec.queue and not DNS1123_LABEL.match(spec.queue):
        out.append(V(f"{path}.queue", "must be a DNS-1123 label"))
    if not -1000 <= spec.priority <= 1000:
        out.append(V(f"{path}.priority", "must lie in -1000..1000"))
    if len(spec.display_name) > 253:
        out.append(V(f"{path}.display_name", "at most 253 characters"))
    if not spec.pod_sets:
        out.append(V(f"{path}.pod_sets", "at least one pod set is required"))
    names: set[str] = set()
    total = 0
    for i, ps in enumerate(spec.pod_sets):
        p = f"{path}.pod_sets[{i}]"
        if not ps.name:
            out.append(V(f"{p}.name", "required"))
        elif len(ps.name) > MAX_POD_SET_NAME or not DNS1035.match(ps.name):
            out.append(V(f"{p}.name", f"must be a DNS-1035 label of at most {MAX_POD_SET_NAME} characters"))
        elif ps.name in names:
            out.append(V(f"{p}.name", "duplicate pod set name"))
        names.add(ps.name)
        if ps.count < 1:
            out.append(V(f"{p}.count", "must be >= 1"))
        elif ps.count > 99999:
            out.append(V(f"{p}.count", "at most 99999"))
        total += ps.count
        if not ps.HasField("shape"):
            out.append(V(f"{p}.shape", "required"))
        else:
            out.extend(_check_shape(ps.shape, f"{p}.shape"))
        out.extend(check_pod_template(ps.pod_template_json, f"{p}.pod_template_json"))
    if spec.HasField("min_available") and (spec.min_available < 1 or spec.min_available > total):
        out.append(V(f"{path}.min_available", f"must lie in 1..{total} (total replicas)"))
    topo = spec.topology
    for fname in ("required_level", "preferred_level"):
        value = getattr(topo, fname)
        if value and (len(value) > 317 or not re.match(r"^[A-Za-z0-9./_-]+$", value)):
            out.append(V(f"{path}.topology.{fname}", "not a level name or label key"))
    for fname in ("max_runtime", "start_timeout", "termination_grace_period"):
        if spec.HasField(fname):
            d = getattr(spec, fname)
            if d.seconds < 0 or d.nanos < 0 or (d.seconds == 0 and d.nanos == 0):
                out.append(V(f"{path}.{fname}", "must be positive"))
    for i, name in enumerate(spec.cluster_selector.clusters):
        if not DNS1123_SUBDOMAIN.match(name):
            out.append(V(f"{path}.cluster_selector.clusters[{i}]", "not a cluster name"))
    out.extend(_label_map(spec.labels, f"{path}.labels"))
    out.extend(_label_map(spec.annotations, f"{path}.annotations", values=False))
    if spec.rendezvous_port > 65535:
        out.append(V(f"{path}.rendezvous_port", "must be a TCP port (1..65535) or 0"))
    return out


def _check_shape(shape: Any, p: str) -> Iterator[FieldViolation]:
    if shape.gpu_count > 64:
        yield V(f"{p}.gpu_count", "at most 64 GPUs per replica")
    if shape.gpu_milli > 1000:
        yield V(f"{p}.gpu_milli", "must lie in 0..1000")
    elif 0 < shape.gpu_milli < 1000 and shape.gpu_count != 1:
        yield V(f"{p}.gpu_milli", "a GPU share needs gpu_count = 1")
    if shape.mig_profile:
        if not _MIG_PROFILE.match(shape.mig_profile):
            yield V(f"{p}.mig_profile", "not a MIG profile name like 1g.10gb")
        if shape.gpu_count > 0:
            yield V(f"{p}.mig_profile", "exclusive with gpu_count > 0")
        if shape.mig_count < 1:
            yield V(f"{p}.mig_count", "must be >= 1 when mig_profile is set")
    elif shape.mig_count:
        yield V(f"{p}.mig_count", "must be 0 without mig_profile")
    if shape.cpu_milli < 0:
        yield V(f"{p}.cpu_milli", "must not be negative")
    if shape.memory_bytes < 0:
        yield V(f"{p}.memory_bytes", "must not be negative")
    for i, model in enumerate(shape.allowed_gpu_models):
        if not model or len(model) > 63 or not _LABEL_VALUE.match(model):
            yield V(f"{p}.allowed_gpu_models[{i}]", "not a GPU model label value")
    for name, amount in shape.extended_resources.items():
        if name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-"):
            yield V(f"{p}.extended_resources[{name!r}]", "use gpu_count / mig_profile")
        elif not _EXTENDED_NAME.match(name):
            yield V(f"{p}.extended_resources[{name!r}]", "not a resource name")
        elif amount < 0:
            yield V(f"{p}.extended_resources[{name!r}]", "must not be negative")
    seen: set[str] = set()
    for i, req in enumerate(shape.device_requests):
        rp = f"{p}.device_requests[{i}]"
        if not req.name or not DNS1123_LABEL.match(req.name) or req.name in seen:
            yield V(f"{rp}.name", "a unique DNS label is required")
        seen.add(req.name)
        if not req.device_class_name or not DNS1123_SUBDOMAIN.match(req.device_class_name):
            yield V(f"{rp}.device_class_name", "a DeviceClass name is required")


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        items = spec.get(kind) or []
        if isinstance(items, list):
            for i, c in enumerate(items):
                if isinstance(c, Mapping):
                    yield f"spec.{kind}[{i}]", c


def check_pod_template(text: str, p: str) -> list[FieldViolation]:
    """The template is untrusted: refuse what would escape the node sandbox or steer scheduling."""
    if not text:
        return [V(p, "a PodTemplateSpec JSON is required")]
    if len(text.encode()) > MAX_TEMPLATE_BYTES:
        return [V(p, f"at most {MAX_TEMPLATE_BYTES} bytes")]
    try:
        tpl = json.loads(text)
    except ValueError as exc:
        return [V(p, f"not valid JSON: {exc}")]
    if not isinstance(tpl, dict):
        return [V(p, "must be a JSON object (PodTemplateSpec)")]
    spec = tpl.get("spec")
    if not isinstance(spec, dict):
        return [V(f"{p}.spec", "required object")]
    out: list[FieldViolation] = []
    meta = tpl.get("metadata")
    if isinstance(meta, dict) and meta.get("namespace"):
        out.append(V(f"{p}.metadata.namespace", "the agent chooses the namespace"))
    for key, why in _FORBIDDEN_SPEC_FIELDS.items():
        value = spec.get(key)
        if value not in (None, False, "", [], 0) or (key == "hostUsers" and value is True):
            out.append(V(f"{p}.spec.{key}", f"must not be set: {why}"))
    affinity = spec.get("affinity")
    if isinstance(affinity, dict) and affinity.get("nodeAffinity"):
        out.append(V(f"{p}.spec.affinity.nodeAffinity", "must not be set: the agent sets node affinity"))
    if spec.get("serviceAccountName") in ("default",) and spec.get("automountServiceAccountToken"):
        pass  # allowed; namespace RBAC applies
    volumes = spec.get("volumes") or []
    if isinstance(volumes, list):
        for i, vol in enumerate(volumes):
            if isinstance(vol, dict) and "hostPath" in vol:
                out.append(V(f"{p}.spec.volumes[{i}].hostPath", "host paths are not allowed"))
    if not spec.get("containers"):
        out.append(V(f"{p}.spec.containers", "at least one container is required"))
    for cpath, c in _containers(spec):
        sc = c.get("securityContext")
        if isinstance(sc, dict):
            if sc.get("privileged"):
                out.append(V(f"{p}.{cpath}.securityContext.privileged", "privileged containers are not allowed"))
            if sc.get("allowPrivilegeEscalation"):
                out.append(V(f"{p}.{cpath}.securityContext.allowPrivilegeEscalation", "not allowed"))
            caps = (sc.get("capabilities") or {}).get("add") or []
            if isinstance(caps, list) and _FORBIDDEN_CAPS & {str(x).upper() for x in caps}:
                out.append(V(f"{p}.{cpath}.securityContext.capabilities.add", "privileged capabilities are not allowed"))
        for j, port in enumerate(c.get("ports") or []):
            if isinstance(port, dict) and port.get("hostPort"):
                out.append(V(f"{p}.{cpath}.ports[{j}].hostPort", "host ports are not allowed"))
    return out
