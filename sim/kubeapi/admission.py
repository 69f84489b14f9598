"""The admission plugins a default control plane runs on the objects Tandem creates.

Mutating, in the real order: NamespaceLifecycle, LimitRanger (container defaults),
ServiceAccount (default account, must exist), Priority (class → `spec.priority`), then
DefaultTolerationSeconds; validating: LimitRanger's min/max and ResourceQuota (pods,
compute and extended requests, object counts). Errors are 403 Forbidden with the plugins' texts.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from sim.kubeapi import errors
from sim.kubeapi.quantities import format_quantity, is_binary, parse_quantity
from sim.kubeapi.resources import ResourceType
from sim.kubeapi.store import Store

__all__ = ["admit_create", "check_quota", "pod_usage", "quota_used", "NS_KEY"]

Obj = dict[str, Any]
NS_KEY = "/namespaces"
PC_KEY = "scheduling.k8s.io/priorityclasses"
SA_KEY = "/serviceaccounts"
LR_KEY = "/limitranges"
QUOTA_KEY = "/resourcequotas"
POD_KEY = "/pods"


def _name_for(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")


def check_namespace(store: Store, rt: ResourceType, obj: Obj) -> None:
    """NamespaceLifecycle: the namespace must exist and not be terminating."""
    ns = str(obj["metadata"].get("namespace") or "")
    namespace = store.get(NS_KEY, "", ns)
    if namespace is None:
        raise errors.not_found("", "namespaces", ns)
    if namespace["metadata"].get("deletionTimestamp"):
        err = errors.forbidden(
            rt.group,
            rt.plural,
            _name_for(obj),
            f"unable to create new content in namespace {ns} because it is being terminated",
        )
        err.details = dict(
            err.details or {},
            causes=[
                {
                    "reason": "NamespaceTerminating",
                    "field": "metadata.namespace",
                    "message": f"namespace {ns} is being terminated",
                }
            ],
        )
        raise err


def _containers(spec: Obj) -> list[Obj]:
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _limit_ranger(store: Store, pod: Obj) -> None:
    ns = pod["metadata"]["namespace"]
    spec = pod["spec"]
    problems: list[str] = []
    notes: list[str] = []
    for lr in store.items(LR_KEY, ns):
        for item in (lr.get("spec") or {}).get("limits") or []:
            if item.get("type") != "Container":
                continue
            for c in _containers(spec):
                res = c.setdefault("resources", {})
                limits, requests = dict(res.get("limits") or {}), dict(res.get("requests") or {})
                set_req = sorted(k for k in item.get("defaultRequest") or {} if k not in requests)
                set_lim = sorted(k for k in item.get("default") or {} if k not in limits)
                for k in set_req:
                    requests[k] = item["defaultRequest"][k]
                for k in set_lim:
                    limits[k] = item["default"][k]
                if set_req:
                    notes.append(f"{', '.join(set_req)} request for container {c.get('name')}")
                if set_lim:
                    notes.append(f"{', '.join(set_lim)} limit for container {c.get('name')}")
                if requests:
                    res["requests"] = requests
                if limits:
                    res["limits"] = limits
                for k, bound in (item.get("max") or {}).items():
                    if k not in limits:
                        problems.append(f"maximum {k} usage per Container is {bound}.  No limit is specified")
                    elif parse_quantity(str(limits[k])) > parse_quantity(str(bound)):
                        problems.append(f"maximum {k} usage per Container is {bound}, but limit is {limits[k]}")
                for k, bound in (item.get("min") or {}).items():
                    if k not in requests:
                        problems.append(f"minimum {k} usage per Container is {bound}.  No request is specified")
                    elif parse_quantity(str(requests[k])) < parse_quantity(str(bound)):
                        problems.append(f"minimum {k} usage per Container is {bound}, but request is {requests[k]}")
    if notes:
        pod["metadata"].setdefault("annotations", {})["kubernetes.io/limit-ranger"] = (
            "LimitRanger plugin set: " + "; ".join(notes)
        )
    if problems:
        joined = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        raise errors.forbidden("", "pods", _name_for(pod), joined)


def _service_account(store: Store, pod: Obj) -> None:
    spec = pod["spec"]
    name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = name
    spec["serviceAccount"] = name
    ns = pod["metadata"]["namespace"]
    if store.get(SA_KEY, ns, name) is None:
        raise errors.forbidden(
            "",
            "pods",
            _name_for(pod),
            f'error looking up service account {ns}/{name}: serviceaccount "{name}" not found',
        )


def _priority(store: Store, pod: Obj) -> None:
    spec = pod["spec"]
    class_name = spec.get("priorityClassName")
    value, policy = 0, "PreemptLowerPriority"
    if class_name:
        pc = store.get(PC_KEY, "", class_name)
        if pc is None:
            raise errors.forbidden("", "pods", _name_for(pod), f"no PriorityClass with name {class_name} was found")
        value, policy = int(pc.get("value", 0)), str(pc.get("preemptionPolicy") or policy)
    else:
        defaults = [pc for pc in store.items(PC_KEY) if pc.get("globalDefault")]
        if defaults:
            pc = min(defaults, key=lambda p: int(p.get("value", 0)))
            spec["priorityClassName"] = pc["metadata"]["name"]
            value, policy = int(pc.get("value", 0)), str(pc.get("preemptionPolicy") or policy)
    given = spec.get("priority")
    if given is not None and given != value:
        raise errors.forbidden(
            "",
            "pods",
            _name_for(pod),
            f"the integer value of priority ({given}) must not be provided in pod spec; "
            f"priority admission controller computed {value} from the given PriorityClass name",
        )
    given_policy = spec.get("preemptionPolicy")
    if given_policy is not None and given_policy != policy:
        raise errors.forbidden(
            "",
            "pods",
            _name_for(pod),
            f"the string value of PreemptionPolicy ({given_policy}) must not be provided in pod "
            f"spec; priority admission controller computed {policy} from the given PriorityClass name",
        )
    spec["priority"] = value
    spec["preemptionPolicy"] = policy


_DEFAULT_TOLERATED = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _default_tolerations(pod: Obj) -> None:
    tolerations = pod["spec"].setdefault("tolerations", [])
    for key in _DEFAULT_TOLERATED:
        covered = any(
            (t.get("effect") in (None, "", "NoExecute"))
            and (t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"))
            for t in tolerations
        )
        if not covered:
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})


def admit_create(store: Store, rt: ResourceType, obj: Obj) -> None:
    """Mutating admission of a create (after defaulting, before name generation and validation)."""
    if rt.namespaced:
        check_namespace(store, rt, obj)
    if rt.kind == "Pod":
        _limit_ranger(store, obj)
        _service_account(store, obj)
        _priority(store, obj)
        _default_tolerations(obj)


# -- ResourceQuota -----------------------------------------------------------------------


def _sum(target: dict[str, Fraction], source: Mapping[str, Any]) -> None:
    for k, v in source.items():
        target[k] = target.get(k, Fraction(0)) + parse_quantity(str(v))


def _pod_resources(spec: Obj, field: str) -> dict[str, Fraction]:
    """Requests or limits of a pod as the scheduler and quota compute them (init max, sidecars, overhead)."""
    regular: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        _sum(regular, (c.get("resources") or {}).get(field) or {})
    sidecars: dict[str, Fraction] = {}
    init_max: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or []:
        own = (c.get("resources") or {}).get(field) or {}
        if c.get("restartPolicy") == "Always":
            _sum(sidecars, own)
            continue
        for k, v in own.items():
            init_max[k] = max(init_max.get(k, Fraction(0)), sidecars.get(k, Fraction(0)) + parse_quantity(str(v)))
    total = dict(regular)
    for k, v in sidecars.items():
        total[k] = total.get(k, Fraction(0)) + v
    for k, v in init_max.items():
        total[k] = max(total.get(k, Fraction(0)), v)
    _sum(total, spec.get("overhead") or {})
    return total


def pod_usage(pod: Obj) -> dict[str, Fraction]:
    """Quota usage of one pod, keyed by quota resource names; terminal pods use nothing."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return {}
    spec = pod.get("spec") or {}
    usage: dict[str, Fraction] = {"pods": Fraction(1), "count/pods": Fraction(1)}
    for name, value in _pod_resources(spec, "requests").items():
        usage[f"requests.{name}"] = value
        if name in ("cpu", "memory", "ephemeral-storage"):
            usage[name] = value
    for name, value in _pod_resources(spec, "limits").items():
        usage[f"limits.{name}"] = value
    return usage


_OBJECT_COUNTS = {
    "services": "/services",
    "configmaps": "/configmaps",
    "resourcequotas": "/resourcequotas",
    "serviceaccounts": "/serviceaccounts",
}


def _count_key(resource: str) -> str | None:
    if resource in _OBJECT_COUNTS:
        return _OBJECT_COUNTS[resource]
    if resource.startswith("count/") and resource != "count/pods":
        plural, _, group = resource[len("count/") :].partition(".")
        return f"{group}/{plural}"
    return None


def quota_used(store: Store, quota: Obj) -> dict[str, Fraction]:
    """Current usage in the quota's namespace of every resource it limits."""
    ns = quota["metadata"]["namespace"]
    hard = (quota.get("spec") or {}).get("hard") or {}
    used = {k: Fraction(0) for k in hard}
    if any(_count_key(k) is None for k in hard):
        for pod in store.items(POD_KEY, ns):
            for k, v in pod_usage(pod).items():
                if k in used:
                    used[k] += v
    for k in hard:
        key = _count_key(k)
        if key is not None:
            used[k] = Fraction(len(store.items(key, ns)))
    return used


def _fmt(value: Fraction, like: str) -> str:
    return format_quantity(value, "BinarySI" if is_binary(like) else "DecimalSI")


_MUST_SPECIFY = ("requests.cpu", "requests.memory", "limits.cpu", "limits.memory", "cpu", "memory")


def check_quota(store: Store, rt: ResourceType, obj: Obj) -> None:
    """ResourceQuota admission of a create: refuse what would exceed any quota in the namespace."""
    ns = obj["metadata"]["namespace"]
    quotas = store.items(QUOTA_KEY, ns)
    if not quotas:
        return
    if rt.kind == "Pod":
        delta = pod_usage(obj)
    else:
        delta = {}
        for quota in quotas:
            for k in (quota.get("spec") or {}).get("hard") or {}:
                if _count_key(k) == rt.key:
                    delta[k] = Fraction(1)
    name = _name_for(obj)
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        qname = quota["metadata"]["name"]
        if rt.kind == "Pod":
            missing: list[str] = []
            for k in sorted(hard):
                if k in _MUST_SPECIFY:
                    field, res = k.split(".") if "." in k else ("requests", k)
                    lacking = [
                        str(c.get("name"))
                        for c in _containers(obj["spec"])
                        if res not in ((c.get("resources") or {}).get(field) or {})
                    ]
                    if lacking:
                        missing.append(f"{field}.{res} for: {','.join(lacking)}")
            if missing:
                raise errors.forbidden(
                    rt.group, rt.plural, name, f"failed quota: {qname}: must specify {'; '.join(missing)}"
                )
        used = quota_used(store, quota)
        over = sorted(k for k, v in delta.items() if k in hard and used[k] + v > parse_quantity(str(hard[k])))
        if over:
            requested = ",".join(f"{k}={_fmt(delta[k], str(hard[k]))}" for k in over)
            used_text = ",".join(f"{k}={_fmt(used[k], str(hard[k]))}" for k in over)
            limited = ",".join(f"{k}={hard[k]}" for k in over)
            raise errors.forbidden(
                rt.group,
                rt.plural,
                name,
                f"exceeded quota: {qname}, requested: {requested}, used: {used_text}, limited: {limited}",
            )


def quota_status(store: Store, quota: Obj) -> Obj:
    """The status the quota controller writes: hard as in the spec, used as counted now."""
    hard = dict((quota.get("spec") or {}).get("hard") or {})
    used = quota_used(store, quota)
    return {"hard": hard, "used": {k: _fmt(v, str(hard[k])) for k, v in used.items()}}
