"""Per-kind validation of creates and updates (the Validate* functions of the real registry strategies).

Covers the objects Tandem writes (Pods, Jobs, Services, ConfigMaps, Leases, Events,
ResourceClaimTemplates) and those tests create (Nodes, ResourceSlices, PriorityClasses,
Namespaces, quota objects, RBAC); every other kind gets the generic metadata checks only.
"""

from __future__ import annotations

import re
from typing import Any

from sim.kubeapi import podrules
from sim.kubeapi.podspec_checks import validate_pod_spec
from sim.kubeapi.resources import ResourceType
from sim.kubeapi.selectors import match_label_selector_object
from sim.kubeapi.validation import (
    Causes,
    NameCheck,
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    path_segment_name,
    qualified_name,
    validate_labels,
    validate_metadata,
)

__all__ = ["validate_create", "validate_update", "validate_status_update"]

Obj = dict[str, Any]

_NAME_CHECKS: dict[str, NameCheck] = {
    "Service": dns1035_label,
    "Namespace": dns1123_label,
    "Role": path_segment_name,
    "ClusterRole": path_segment_name,
    "RoleBinding": path_segment_name,
    "ClusterRoleBinding": path_segment_name,
}
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_CONFIGMAP_MAX = 1024 * 1024


def _job(obj: Obj, causes: Causes) -> None:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    uid = obj["metadata"].get("uid", "")
    if not spec.get("manualSelector"):
        for key, want in (
            ("batch.kubernetes.io/controller-uid", uid),
            ("controller-uid", uid),
            ("batch.kubernetes.io/job-name", obj["metadata"].get("name")),
            ("job-name", obj["metadata"].get("name")),
        ):
            if key in labels and labels[key] != want:
                causes.invalid(f"spec.template.metadata.labels[{key}]", labels[key], f"must be '{want}'")
        if spec.get("selector") is None:
            causes.required("spec.selector")
        elif not match_label_selector_object(spec["selector"], {"batch.kubernetes.io/controller-uid": uid}):
            causes.invalid("spec.selector", spec["selector"], "`selector` not auto-generated")
    if spec.get("selector") is None and spec.get("manualSelector"):
        causes.required("spec.selector")
    elif spec.get("selector") is not None and not match_label_selector_object(spec["selector"], labels):
        causes.invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`")
    validate_labels(labels, "spec.template.metadata.labels", causes)
    if not template.get("spec"):
        causes.required("spec.template")
    else:
        validate_pod_spec(template["spec"], "spec.template.spec", causes)
        restart = template["spec"].get("restartPolicy")
        if restart not in ("OnFailure", "Never"):
            causes.not_supported("spec.template.spec.restartPolicy", restart, ["OnFailure", "Never"])
    for field in ("parallelism", "completions", "backoffLimit"):
        value = spec.get(field)
        if value is not None and value < 0:
            causes.invalid(f"spec.{field}", value, "must be greater than or equal to 0")
    for field in ("activeDeadlineSeconds",):
        value = spec.get(field)
        if value is not None and value <= 0:
            causes.invalid(f"spec.{field}", value, "must be greater than 0")
    ttl = spec.get("ttlSecondsAfterFinished")
    if ttl is not None and ttl < 0:
        causes.invalid("spec.ttlSecondsAfterFinished", ttl, "must be greater than or equal to 0")
    mode = spec.get("completionMode")
    if mode not in ("NonIndexed", "Indexed"):
        causes.not_supported("spec.completionMode", mode, ["NonIndexed", "Indexed"])
    if mode == "Indexed":
        if spec.get("completions") is None:
            causes.required("spec.completions", "when completion mode is Indexed")
        elif spec["completions"] > 100000:
            causes.invalid(
                "spec.completions",
                spec["completions"],
                "must be less than or equal to 100000 when completion mode is Indexed",
            )
    policy = spec.get("podReplacementPolicy")
    if policy not in ("TerminatingOrFailed", "Failed"):
        causes.not_supported("spec.podReplacementPolicy", policy, ["Failed", "TerminatingOrFailed"])
    elif spec.get("podFailurePolicy") and policy != "Failed":
        causes.not_supported("spec.podReplacementPolicy", policy, ["Failed"])


def _service(obj: Obj, causes: Causes) -> None:
    spec = obj.get("spec") or {}
    types = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]
    if spec.get("type") not in types:
        causes.not_supported("spec.type", spec.get("type"), types)
    ports = spec.get("ports") or []
    headless = spec.get("clusterIP") == "None"
    if not ports and not headless and spec.get("type") != "ExternalName":
        causes.required("spec.ports")
    names: set[str] = set()
    for i, port in enumerate(ports):
        name = port.get("name")
        if len(ports) > 1 and not name:
            causes.required(f"spec.ports[{i}].name")
        if name:
            for msg in dns1123_label(name):
                causes.invalid(f"spec.ports[{i}].name", name, msg)
            if name in names:
                causes.duplicate(f"spec.ports[{i}].name", name)
            names.add(name)
        number = port.get("port")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            causes.invalid(f"spec.ports[{i}].port", number, "must be between 1 and 65535, inclusive")
        if port.get("protocol") not in ("TCP", "UDP", "SCTP"):
            causes.not_supported(f"spec.ports[{i}].protocol", port.get("protocol"), ["SCTP", "TCP", "UDP"])
    validate_labels(spec.get("selector") or {}, "spec.selector", causes)


def _configmap(obj: Obj, causes: Causes) -> None:
    total = 0
    for field in ("data", "binaryData"):
        for key, value in (obj.get(field) or {}).items():
            if not _CONFIG_KEY.match(key) or len(key) > 253:
                causes.invalid(
                    f"{field}[{key}]",
                    key,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' "
                    "(e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation "
                    "is '[-._a-zA-Z0-9]+')",
                )
            total += len(key) + len(str(value))
    overlap = set(obj.get("data") or {}) & set(obj.get("binaryData") or {})
    for key in sorted(overlap):
        causes.invalid(f"data[{key}]", key, "duplicate of key present in binaryData")
    if total > _CONFIGMAP_MAX:
        causes.too_long("", _CONFIGMAP_MAX)


def _lease(obj: Obj, causes: Causes) -> None:
    spec = obj.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        causes.invalid("spec.leaseDurationSeconds", duration, "must be greater than 0")
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        causes.invalid("spec.leaseTransitions", transitions, "must be greater than or equal to 0")


def _event(obj: Obj, causes: Causes) -> None:
    involved_ns = (obj.get("involvedObject") or {}).get("namespace")
    ns = obj["metadata"].get("namespace")
    if involved_ns and involved_ns != ns:
        causes.invalid("involvedObject.namespace", involved_ns, "does not match event.namespace")
    event_type = obj.get("type")
    if event_type and event_type not in ("Normal", "Warning"):
        causes.not_supported("type", event_type, ["Normal", "Warning"])


def _node(obj: Obj, causes: Causes) -> None:
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        for msg in qualified_name(str(taint.get("key", ""))):
            causes.invalid(f"spec.taints[{i}].key", taint.get("key", ""), msg)
        effect = taint.get("effect")
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            causes.not_supported(f"spec.taints[{i}].effect", effect, ["NoExecute", "NoSchedule", "PreferNoSchedule"])
        pair = (str(taint.get("key")), str(effect))
        if pair in seen:
            causes.duplicate(f"spec.taints[{i}]", taint)
        seen.add(pair)


def _resource_slice(obj: Obj, causes: Causes) -> None:
    spec = obj.get("spec") or {}
    driver = spec.get("driver") or ""
    if not driver:
        causes.required("spec.driver")
    else:
        for msg in dns1123_subdomain(driver):
            causes.invalid("spec.driver", driver, msg)
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        causes.required("spec.pool.name")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        causes.invalid("spec.pool.resourceSliceCount", pool.get("resourceSliceCount"), "must be greater than zero")
    choices = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(choices) != 1:
        causes.invalid(
            "spec",
            "{`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`}",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        )
    names: set[str] = set()
    for i, device in enumerate(spec.get("devices") or []):
        name = device.get("name") or ""
        for msg in dns1123_label(name):
            causes.invalid(f"spec.devices[{i}].name", name, msg)
        if name in names:
            causes.duplicate(f"spec.devices[{i}].name", name)
        names.add(name)


def _priority_class(obj: Obj, causes: Causes) -> None:
    name = obj["metadata"].get("name", "")
    value = obj.get("value")
    if not isinstance(value, int):
        causes.required("value")
    elif name.startswith("system-") and name not in ("system-node-critical", "system-cluster-critical"):
        causes.forbidden("metadata.name", "priority class names with 'system-' prefix are reserved")
    elif value > 1_000_000_000 and not name.startswith("system-"):
        causes.forbidden("value", "maximum allowed value of a user defined priority is 1000000000")
    policy = obj.get("preemptionPolicy")
    if policy not in ("PreemptLowerPriority", "Never"):
        causes.not_supported("preemptionPolicy", policy, ["Never", "PreemptLowerPriority"])


_KIND_CHECKS = {
    "Job": _job,
    "Service": _service,
    "ConfigMap": _configmap,
    "Lease": _lease,
    "Event": _event,
    "Node": _node,
    "ResourceSlice": _resource_slice,
    "PriorityClass": _priority_class,
}


def validate_create(rt: ResourceType, obj: Obj) -> Causes:
    causes = Causes()
    validate_metadata(
        obj.get("metadata") or {},
        namespaced=rt.namespaced,
        name_check=_NAME_CHECKS.get(rt.kind, dns1123_subdomain),
        causes=causes,
    )
    if rt.kind == "Pod":
        spec = obj.get("spec") or {}
        validate_pod_spec(spec, "spec", causes)
        if spec.get("nodeName") and spec.get("schedulingGates"):
            causes.forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared")
    check = _KIND_CHECKS.get(rt.kind)
    if check is not None:
        check(obj, causes)
    return causes


def _immutable(causes: Causes, field: str, new: Any, old: Any) -> None:
    if new != old:
        causes.invalid(field, new, "field is immutable")


def validate_update(rt: ResourceType, new: Obj, old: Obj) -> Causes:
    """Create-time checks on the new object plus what may not change."""
    causes = validate_create(rt, new)
    if rt.kind == "Pod":
        causes.items = [c for c in causes.items if c.field != "spec.nodeName"]
        podrules.validate_pod_update(new, old, causes)
    elif rt.kind == "Job":
        _job_update(new, old, causes)
    elif rt.kind == "Service":
        old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
        if new_spec.get("clusterIP") not in (None, "") and new_spec.get("clusterIP") != old_spec.get("clusterIP"):
            _immutable(causes, "spec.clusterIPs[0]", new_spec.get("clusterIP"), old_spec.get("clusterIP"))
    elif rt.kind == "PriorityClass" and new.get("value") != old.get("value"):
        causes.forbidden("value", "may not be changed in an update.")
    elif rt.kind in ("ResourceClaimTemplate", "ResourceClaim"):
        _immutable(causes, "spec", new.get("spec"), old.get("spec"))
    elif rt.kind == "ConfigMap" and old.get("immutable"):
        if new.get("data") != old.get("data"):
            causes.forbidden("data", "field is immutable when `immutable` is set")
        if new.get("binaryData") != old.get("binaryData"):
            causes.forbidden("binaryData", "field is immutable when `immutable` is set")
        if not new.get("immutable"):
            causes.forbidden("immutable", "field is immutable when `immutable` is set")
    return causes


_SCHEDULING_DIRECTIVES = ("nodeSelector", "affinity", "tolerations", "schedulingGates")


def _job_update(new: Obj, old: Obj, causes: Causes) -> None:
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    for field in ("selector", "completionMode", "podFailurePolicy", "manualSelector", "backoffLimitPerIndex"):
        _immutable(causes, f"spec.{field}", new_spec.get(field), old_spec.get(field))
    if new_spec.get("completions") != old_spec.get("completions"):
        elastic = new_spec.get("completionMode") == "Indexed" and new_spec.get("completions") == new_spec.get(
            "parallelism"
        )
        if not elastic:
            _immutable(causes, "spec.completions", new_spec.get("completions"), old_spec.get("completions"))
    new_t, old_t = new_spec.get("template") or {}, old_spec.get("template") or {}
    if new_t == old_t:
        return
    never_started = old_spec.get("suspend") and not (old.get("status") or {}).get("startTime")
    if never_started:
        relaxed_new = {
            **new_t,
            "metadata": {},
            "spec": {k: v for k, v in (new_t.get("spec") or {}).items() if k not in _SCHEDULING_DIRECTIVES},
        }
        relaxed_old = {
            **old_t,
            "metadata": {},
            "spec": {k: v for k, v in (old_t.get("spec") or {}).items() if k not in _SCHEDULING_DIRECTIVES},
        }
        if relaxed_new == relaxed_old:
            return
    causes.invalid("spec.template", new_t, "field is immutable")


def validate_status_update(rt: ResourceType, new: Obj, old: Obj) -> Causes:
    causes = Causes()
    if rt.kind == "Pod":
        podrules.validate_pod_status_update(new, old, causes)
    return causes
