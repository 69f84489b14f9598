"""Checks the agent runs at start: may it do what it must in each tenant namespace (A-18), does each
namespace enforce the tenant's Pod Security level (H-2), do the PriorityClasses its bands map to exist (A-23)?
A tenant whose namespace lacks a permission or a label is refused (TENANT_NOT_ALLOWED, naming the permission
or the label) instead of half-creating gangs there; `render-rbac` prints the RoleBindings that grant it.

Pod Security is enforced in the cluster by Pod Security admission; the agent only reads the namespace's
labels (no Python copy of the standards lives here). A namespace whose `enforce` label is missing (Pod
Security admission then enforces privileged) or weaker than the tenant's level refuses the tenant. A tenant
with extra capabilities (IPC_LOCK) cannot be served by an enforcing namespace: its namespaces must say
`enforce: privileged`, `warn` and `audit` at the tenant's level, and carry `tandem.dev/tenant-namespace:
"true"`, the selector of the ValidatingAdmissionPolicy that fences Tandem's objects (H-1, H-3).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import yaml

from extender.agent.config import AgentConfig
from extender.kube import KubeClient, KubeError, api_path

__all__ = [
    "NAMESPACED_RULES",
    "SYSTEM_RULES",
    "Permission",
    "refused_tenants",
    "missing_priority_classes",
    "render_rbac",
    "PSA_LEVELS",
    "ENFORCE_LABEL",
    "WARN_LABEL",
    "AUDIT_LABEL",
    "TENANT_NAMESPACE_LABEL",
    "pod_security_problem",
]

log = logging.getLogger("tandem.agent.preflight")


@dataclass(frozen=True, slots=True)
class Permission:
    group: str
    resource: str
    verb: str
    name: str = ""

    def __str__(self) -> str:
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {what}" + (f" {self.name}" if self.name else "")


def _rules(group: str, resource: str, verbs: Iterable[str]) -> list[Permission]:
    return [Permission(group, resource, v) for v in verbs]


NAMESPACED_RULES: tuple[Permission, ...] = (
    *_rules("batch", "jobs", ("create", "get", "list", "watch", "delete", "deletecollection", "patch")),
    *_rules("", "services", ("create", "get", "delete", "patch")),
    *_rules("", "pods", ("create", "patch", "delete", "deletecollection")),  # create: the admission dry run
    *_rules("resource.k8s.io", "resourceclaimtemplates", ("create", "get", "delete")),
    *_rules("", "events", ("create", "patch")),
    *_rules("", "resourcequotas", ("get", "list")),
)
"""What the agent does in every tenant namespace (ClusterRole tandem-agent-workloads, bound per namespace)."""

SYSTEM_RULES: tuple[Permission, ...] = (
    *_rules("", "configmaps", ("create", "get", "list", "watch", "update", "delete")),
    Permission("coordination.k8s.io", "leases", "create"),
    Permission("coordination.k8s.io", "leases", "get", "tandem-agent"),
    Permission("coordination.k8s.io", "leases", "update", "tandem-agent"),
)
"""What it does in its own namespace: reservation ConfigMaps and its Lease."""

PSA_LEVELS = ("privileged", "baseline", "restricted")
"""Pod Security admission's levels, weakest first."""
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
WARN_LABEL = "pod-security.kubernetes.io/warn"
AUDIT_LABEL = "pod-security.kubernetes.io/audit"
VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
TENANT_NAMESPACE_LABEL = "tandem.dev/tenant-namespace"
"""The namespace selector of the shipped ValidatingAdmissionPolicyBinding (manifests/base/admission-policy.yaml)."""


def _shown(labels: Mapping[str, str], key: str) -> str:
    value = labels.get(key)
    return f"{key}={value}" if value is not None else f"{key} is missing"


def pod_security_problem(labels: Mapping[str, str], level: str, extra_capabilities: Sequence[str]) -> str | None:
    """Why a namespace with these labels cannot hold a tenant of this Pod Security level (None: it can)."""
    enforce = labels.get(ENFORCE_LABEL)
    if enforce is not None and enforce not in PSA_LEVELS:
        return f"label {ENFORCE_LABEL}={enforce} is not a Pod Security level ({', '.join(PSA_LEVELS)})"
    need = PSA_LEVELS.index(level)
    if not extra_capabilities:
        if PSA_LEVELS.index(enforce or "privileged") < need:
            weaker = f"is {enforce}" if enforce else "is missing (Pod Security admission then enforces privileged)"
            return (
                f"label {ENFORCE_LABEL} {weaker}, weaker than the tenant's Pod Security level {level} "
                f"(label the namespace {ENFORCE_LABEL}={level})"
            )
        return None
    caps = ", ".join(extra_capabilities)
    want = f"{ENFORCE_LABEL}=privileged, {WARN_LABEL}={level}, {AUDIT_LABEL}={level} and {TENANT_NAMESPACE_LABEL}=true"
    if enforce != "privileged":
        return (
            f"the tenant's extra capabilities ({caps}) need {want}: with {_shown(labels, ENFORCE_LABEL)} Pod "
            f"Security admission would refuse the pods that add them"
        )
    for key in (WARN_LABEL, AUDIT_LABEL):
        value = labels.get(key)
        if value not in PSA_LEVELS or PSA_LEVELS.index(value) < need:
            return (
                f"label {_shown(labels, key)}: a namespace enforcing privileged for the tenant's extra "
                f"capabilities ({caps}) must still warn and audit at {level} (want {want})"
            )
    if labels.get(TENANT_NAMESPACE_LABEL) != "true":
        return (
            f"label {_shown(labels, TENANT_NAMESPACE_LABEL)}: a namespace enforcing privileged relies on the "
            f"ValidatingAdmissionPolicy that selects {TENANT_NAMESPACE_LABEL}=true (want {want})"
        )
    return None


async def refused_tenants(kube: KubeClient, config: AgentConfig) -> dict[str, str]:
    """Tenant -> why it is refused here (a missing namespace, permission or Pod Security label); empty when all
    is well."""
    out: dict[str, str] = {}
    checked: dict[str, tuple[str | None, Mapping[str, str]]] = {}
    for tenant, namespaces in sorted(config.tenants.items()):
        for ns in namespaces:
            if ns not in checked:
                checked[ns] = await _namespace_problem(kube, ns)
            problem, labels = checked[ns]
            if problem is None:
                problem = pod_security_problem(
                    labels, config.pod_security(tenant), config.tenant_extra_capabilities.get(tenant, [])
                )
            if problem is not None:
                out[tenant] = f"namespace {ns}: {problem}"
                log.error("tenant refused", extra={"detail": {"tenant": tenant, "why": out[tenant]}})
                break
            if labels.get(TENANT_NAMESPACE_LABEL) != "true":
                log.warning(
                    "tenant namespace not fenced",
                    extra={
                        "detail": {
                            "namespace": ns,
                            "why": f"no label {TENANT_NAMESPACE_LABEL}=true: the ValidatingAdmissionPolicy "
                            "that keeps tenants off Tandem's gates and pins does not apply",
                        }
                    },
                )
            if labels.get(VERSION_LABEL, "latest") != "latest":
                log.warning(
                    "pod security pinned to an old version",
                    extra={"detail": {"namespace": ns, "label": f"{VERSION_LABEL}={labels[VERSION_LABEL]}"}},
                )
    return out


async def _namespace_problem(kube: KubeClient, namespace: str) -> tuple[str | None, Mapping[str, str]]:
    """(why the namespace cannot hold tenants or None, its labels)."""
    try:
        ns = await kube.get(api_path("", "v1", "namespaces", name=namespace))
    except KubeError as e:  # the agent's read grant covers namespaces: without it the labels are unknown
        return f"cannot be read, so its Pod Security labels cannot be checked: {e}", {}
    if ns is None:
        return "does not exist", {}
    labels = (ns.get("metadata") or {}).get("labels") or {}
    missing = []
    for p in NAMESPACED_RULES:
        allowed, _ = await kube.can_i(p.verb, p.resource, group=p.group, namespace=namespace)
        if not allowed:
            missing.append(str(p))
    if missing:
        return "the agent's ServiceAccount may not " + ", ".join(
            missing
        ) + " (bind tandem-agent-workloads: `tandem-extender render-rbac --config agent.yaml`)", labels
    return None, labels


async def missing_priority_classes(kube: KubeClient, config: AgentConfig) -> set[str]:
    """PriorityClasses the bands map to that do not exist (priority admission would refuse every pod)."""
    names = {config.default_priority_class, *config.priority_classes.values()}
    if config.preemptible_priority_class:
        names.add(config.preemptible_priority_class)
    out = set()
    for name in sorted(names):
        try:
            if await kube.get(api_path("scheduling.k8s.io", "v1", "priorityclasses", name=name)) is None:
                out.add(name)
        except KubeError:
            log.warning("priority class not readable", extra={"detail": name}, exc_info=True)
    if out:
        log.error("priority classes missing", extra={"detail": sorted(out)})
    return out


def render_rbac(config: AgentConfig, *, service_account: str = "tandem-agent", namespace: str = "tandem-system") -> str:
    """RoleBindings of ClusterRole tandem-agent-workloads in every namespace the config maps a tenant to."""
    docs = []
    for ns in sorted({n for namespaces in config.tenants.values() for n in namespaces}):
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {
                    "name": "tandem-agent-workloads",
                    "namespace": ns,
                    "labels": {"app.kubernetes.io/part-of": "tandem"},
                },
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "tandem-agent-workloads",
                },
                "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
            }
        )
    return yaml.safe_dump_all(docs, sort_keys=False)
