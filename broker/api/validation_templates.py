"""The untrusted pod template rules: bounded parsing, the tenant's Pod Security level, Tandem's own H-4 rules.

Nested JSON is measured without recursion before anything recursive reads it;
the reserved label / annotation domains apply to the templates and to a job's
own labels and annotations alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from broker.api.validation_limits import MAX_JSON_DEPTH, MAX_TEMPLATE_BYTES
from broker.domain.errors import FieldViolation
from broker.tenancy import podsecurity
from broker.tenancy.policy import TenantPolicy

__all__ = [
    "check_pod_template",
    "check_untrusted",
    "load_template",
    "RESERVED_DOMAINS",
    "reserved_key",
    "check_json_depth",
    "json_depth",
]

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
RESERVED_DOMAINS = (
    "tandem.dev",
    "kubernetes.io",
    "k8s.io",
    "batch.kubernetes.io",
    "kueue.x-k8s.io",
    "jobset.sigs.k8s.io",
)
"""H-4: label / annotation key domains a tenant may not set, in pod templates or a job's labels and
annotations. A key is reserved when its prefix (the part before `/`) is one of these domains or a subdomain
of one: `node.kubernetes.io/x` and `topology.k8s.io/x` are reserved, `x-k8s.io/x` is not (`kueue.x-k8s.io`
is listed for that reason: a `queue-name` label hands the Job to Kueue, which suspends it). Exception: the
recommended labels `app.kubernetes.io/*` that users and tools are meant to set, except
`app.kubernetes.io/managed-by`, which Tandem sets on its objects."""
_USER_DOMAIN = "app.kubernetes.io"
_TANDEM_MANAGED_BY = "app.kubernetes.io/managed-by"
_USER_SETTABLE_KEYS = frozenset(
    {"kubectl.kubernetes.io/default-container", "kubectl.kubernetes.io/default-logs-container"}
)
"""Keys under a reserved domain that users are meant to set (kubectl's hints of which container to use)."""


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
            yield V(
                f"{path}[{key!r}]",
                f"{domain}/ is a reserved prefix (Kubernetes, Tandem and the queue controllers own these keys)",
            )


def load_template(text: str, p: str) -> tuple[dict[str, Any] | None, list[FieldViolation]]:
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
        yield V(
            t.at("restartPolicy"),
            "must be Never or unset: the agent runs every replica with restartPolicy "
            "Never (a failed replica ends the attempt; retries are the broker's)",
        )


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
                yield V(
                    t.at(f"resources.{part}[{name!r}]"),
                    "only cpu and memory may be set at pod level (Tandem plans on what placement models)",
                )
            elif part == "limits" and name not in parts.get("requests", {}):
                yield V(
                    t.at(f"resources.limits[{name!r}]"),
                    f"needs spec.resources.requests[{name!r}] too: Tandem "
                    "plans on requests, and the API server may default the pod's request from this limit",
                )


def _identity(t: _Template) -> Iterator[FieldViolation]:
    """ServiceAccount and RuntimeClass from the tenant's allow-lists (an unset ServiceAccount is the default)."""
    name = t.tenant.name
    for key in ("serviceAccountName", "serviceAccount"):  # serviceAccount: the deprecated alias
        sa = t.spec.get(key)
        if _set(sa) and sa not in t.tenant.service_accounts:
            yield V(
                t.at(key),
                f"ServiceAccount {sa!r} is not allowed for tenant {name} "
                f"(allowed: {', '.join(t.tenant.service_accounts) or 'none'})",
            )
    rc = t.spec.get("runtimeClassName")
    if _set(rc) and rc not in t.tenant.runtime_classes:
        yield V(
            t.at("runtimeClassName"),
            f"RuntimeClass {rc!r} is not allowed for tenant {name} "
            f"(allowed: {', '.join(t.tenant.runtime_classes) or 'none'})",
        )


def _resource_claims(t: _Template) -> Iterator[FieldViolation]:
    for cp, claim in t.items("resourceClaims"):
        named = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if _set(claim.get(k))]
        for key in named or [""]:
            yield V(
                f"{cp}.{key}" if key else cp,
                "the agent renders the pod's claims from the shape's "
                "device_requests: a template may not reference claims or claim templates of its own",
            )


def _dns_policy(t: _Template) -> Iterator[FieldViolation]:
    if t.spec.get("dnsPolicy") == "None":
        yield V(
            t.at("dnsPolicy"),
            "None would break rendezvous: replicas find each other through the gang's headless Service in cluster DNS",
        )


def _tolerations(t: _Template) -> Iterator[FieldViolation]:
    allowed = t.tenant.toleration_keys
    if "*" in allowed:
        return
    for tp, tol in t.items("tolerations"):
        key = tol.get("key") or ""
        if key not in allowed:
            what = f"taint key {key!r}" if key else "an empty key (it tolerates every taint)"
            yield V(
                f"{tp}.key",
                f"tolerating {what} is not allowed for tenant {t.tenant.name} "
                f"(allowed keys: {', '.join(allowed) or 'none'})",
            )


def _reserved_metadata(t: _Template) -> Iterator[FieldViolation]:
    for part in ("labels", "annotations"):
        yield from _reserved_keys(t.meta.get(part), f"{t.path}.metadata.{part}")


_TANDEM_RULES: tuple[Callable[[_Template], Iterator[FieldViolation]], ...] = (
    _owned_fields,
    _namespace_and_containers,
    _pinning_conflicts,
    _pod_resources,
    _identity,
    _resource_claims,
    _dns_policy,
    _tolerations,
    _reserved_metadata,
)
"""H-4, Tandem's own rules beyond the Pod Security Standards, in one list."""
_DEFAULT_TENANT = TenantPolicy(name="(defaults)")


def check_pod_template(text: str, p: str, tenant: TenantPolicy | None = None) -> list[FieldViolation]:
    """The untrusted template judged by the tenant's Pod Security level and extra capabilities (broker.tenancy.podsecurity)
    and by Tandem's own rules (_TANDEM_RULES); `tenant` None = a tenant with every default."""
    tpl, bad = load_template(text, p)
    if tpl is None:
        return bad
    policy = tenant or _DEFAULT_TENANT
    meta = tpl.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        return [V(f"{p}.metadata", "must be an object")]
    t = _Template(tpl["spec"], meta or {}, p, policy)
    out = podsecurity.check(
        t.spec,
        policy.pod_security,
        extra_capabilities=frozenset(policy.extra_capabilities),
        path=f"{p}.spec",
        annotations=t.meta.get("annotations"),
        annotations_path=f"{p}.metadata.annotations",
    )
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
