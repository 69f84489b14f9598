"""Pod spec validation (ValidatePodSpec) for what Tandem renders: containers, resources, scheduling fields.

Shared by Pods and by Job templates (with the template's field prefix).
"""

from __future__ import annotations

from typing import Any

from sim.kubeapi.quantities import QuantityError, parse_quantity
from sim.kubeapi.validation import Causes, dns1123_label, dns1123_subdomain, qualified_name, validate_labels

__all__ = ["validate_pod_spec", "validate_node_selector"]

Obj = dict[str, Any]

_RESTART = ["Always", "OnFailure", "Never"]
_DNS = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"]
_PULL = ["Always", "IfNotPresent", "Never"]
_TOLERATION_OPS = ["Exists", "Equal"]
_EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]


def is_extended_resource(name: str) -> bool:
    """IsExtendedResourceName: a domain-qualified name outside kubernetes.io (nvidia.com/gpu)."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def _validate_resources(res: Obj, path: str, causes: Causes) -> None:
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    for name in {**requests, **limits}:
        for msg in qualified_name(name):
            causes.invalid(f"{path}.limits[{name}]" if name in limits else f"{path}.requests[{name}]", name, msg)
    for name, value in requests.items():
        try:
            req = parse_quantity(str(value))
        except QuantityError:
            continue
        if req < 0:
            causes.invalid(f"{path}.requests[{name}]", value, "must be greater than or equal to 0")
        extended = is_extended_resource(name)
        if name in limits:
            lim = parse_quantity(str(limits[name]))
            if extended and req != lim:
                causes.invalid(f"{path}.requests", value, f"must be equal to {name} limit of {limits[name]}")
            elif req > lim:
                causes.invalid(
                    f"{path}.requests", value, f"must be less than or equal to {name} limit of {limits[name]}"
                )
        elif extended:
            causes.forbidden(f"{path}.limits", "Limit must be set for non overcommitable resources")
        if extended and req.denominator != 1:
            causes.invalid(f"{path}.requests[{name}]", value, "must be an integer")


def _validate_container(c: Obj, path: str, causes: Causes, names: set[str]) -> None:
    name = c.get("name") or ""
    if not name:
        causes.required(f"{path}.name")
    else:
        for msg in dns1123_label(name):
            causes.invalid(f"{path}.name", name, msg)
        if name in names:
            causes.duplicate(f"{path}.name", name)
        names.add(name)
    if not c.get("image"):
        causes.required(f"{path}.image")
    policy = c.get("imagePullPolicy")
    if policy is not None and policy not in _PULL:
        causes.not_supported(f"{path}.imagePullPolicy", policy, _PULL)
    _validate_resources(c.get("resources") or {}, f"{path}.resources", causes)
    port_names: set[str] = set()
    for i, port in enumerate(c.get("ports") or []):
        number = port.get("containerPort")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            causes.invalid(f"{path}.ports[{i}].containerPort", number, "must be between 1 and 65535, inclusive")
        pname = port.get("name")
        if pname:
            if pname in port_names:
                causes.duplicate(f"{path}.ports[{i}].name", pname)
            port_names.add(pname)


def validate_node_selector(selector: Obj, path: str, causes: Causes) -> None:
    """A required NodeSelector: at least one term; expression and field requirements well formed."""
    terms = selector.get("nodeSelectorTerms") or []
    if not terms:
        causes.required(f"{path}.nodeSelectorTerms", "must have at least one node selector term")
    for t, term in enumerate(terms):
        base = f"{path}.nodeSelectorTerms[{t}]"
        for i, req in enumerate(term.get("matchExpressions") or []):
            rpath = f"{base}.matchExpressions[{i}]"
            op, values = req.get("operator"), req.get("values") or []
            if op in ("In", "NotIn"):
                if not values:
                    causes.required(f"{rpath}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            elif op in ("Exists", "DoesNotExist"):
                if values:
                    causes.forbidden(
                        f"{rpath}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                    )
            elif op in ("Gt", "Lt"):
                if len(values) != 1:
                    causes.required(f"{rpath}.values", "must be specified single value when `operator` is 'Lt' or 'Gt'")
            else:
                causes.invalid(f"{rpath}.operator", op, "not a valid selector operator")
            for msg in qualified_name(str(req.get("key", ""))):
                causes.invalid(f"{rpath}.key", req.get("key", ""), msg)
        for i, req in enumerate(term.get("matchFields") or []):
            rpath = f"{base}.matchFields[{i}]"
            op, values = req.get("operator"), req.get("values") or []
            if op in ("In", "NotIn"):
                if len(values) != 1:
                    causes.required(
                        f"{rpath}.values",
                        "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
                    )
            else:
                causes.invalid(f"{rpath}.operator", op, "not a valid selector operator")
            if req.get("key") != "metadata.name":
                causes.invalid(f"{rpath}.key", req.get("key", ""), "not a valid field selector key")
            else:
                for v, value in enumerate(values):
                    for msg in dns1123_subdomain(str(value)):
                        causes.invalid(f"{rpath}.values[{v}]", value, msg)


def validate_pod_spec(spec: Obj, path: str, causes: Causes) -> None:
    containers = spec.get("containers") or []
    if not containers:
        causes.required(f"{path}.containers")
    names: set[str] = set()
    for i, c in enumerate(spec.get("initContainers") or []):
        _validate_container(c, f"{path}.initContainers[{i}]", causes, names)
    for i, c in enumerate(containers):
        _validate_container(c, f"{path}.containers[{i}]", causes, names)
    restart = spec.get("restartPolicy")
    if restart not in _RESTART:
        causes.not_supported(f"{path}.restartPolicy", restart, _RESTART)
    dns = spec.get("dnsPolicy")
    if dns not in _DNS:
        causes.not_supported(f"{path}.dnsPolicy", dns, _DNS)
    for field in ("hostname", "subdomain"):
        value = spec.get(field)
        if value:
            for msg in dns1123_label(str(value)):
                causes.invalid(f"{path}.{field}", value, msg)
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and ads <= 0:
        causes.invalid(f"{path}.activeDeadlineSeconds", ads, "must be between 1 and 2147483647, inclusive")
    tgps = spec.get("terminationGracePeriodSeconds")
    if tgps is not None and tgps < 0:
        causes.invalid(f"{path}.terminationGracePeriodSeconds", tgps, "must be greater than or equal to 0")
    validate_labels(spec.get("nodeSelector") or {}, f"{path}.nodeSelector", causes)
    gates: set[str] = set()
    for i, gate in enumerate(spec.get("schedulingGates") or []):
        gname = str(gate.get("name") or "")
        for msg in qualified_name(gname):
            causes.invalid(f"{path}.schedulingGates[{i}].name", gname, msg)
        if gname in gates:
            causes.duplicate(f"{path}.schedulingGates[{i}].name", gname)
        gates.add(gname)
    for i, tol in enumerate(spec.get("tolerations") or []):
        tpath = f"{path}.tolerations[{i}]"
        op = tol.get("operator", "Equal")
        if op not in _TOLERATION_OPS:
            causes.not_supported(f"{tpath}.operator", op, _TOLERATION_OPS)
        if op == "Exists" and tol.get("value"):
            causes.invalid(f"{tpath}.operator", tol.get("value"), "value must be empty when `operator` is 'Exists'")
        if not tol.get("key") and op != "Exists":
            causes.invalid(
                f"{tpath}.operator",
                op,
                'operator must be Exists when `key` is empty, which means "match all values and all keys"',
            )
        effect = tol.get("effect")
        if effect and effect not in _EFFECTS:
            causes.not_supported(f"{tpath}.effect", effect, _EFFECTS)
        if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
            causes.invalid(f"{tpath}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is set")
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        validate_node_selector(
            required, f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", causes
        )
    for i, pref in enumerate(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        weight = pref.get("weight")
        if not isinstance(weight, int) or not 1 <= weight <= 100:
            causes.invalid(
                f"{path}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].weight",
                weight,
                "must be in the range 1-100",
            )
