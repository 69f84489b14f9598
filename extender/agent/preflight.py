"""Checks the agent runs at start: may it do what it must in each tenant namespace (A-18), do the
PriorityClasses its bands map to exist (A-23)? A tenant whose namespace lacks a permission is refused
(TENANT_NOT_ALLOWED, naming the permission) instead of half-creating gangs there; `render-rbac` prints the
RoleBindings that grant it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import yaml

from extender.agent.config import AgentConfig
from extender.kube import KubeClient, KubeError, api_path

__all__ = ["NAMESPACED_RULES", "SYSTEM_RULES", "Permission", "refused_tenants", "missing_priority_classes",
           "render_rbac"]

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


async def refused_tenants(kube: KubeClient, config: AgentConfig) -> dict[str, str]:
    """Tenant -> why it is refused here (a missing permission or namespace); empty when all is well."""
    out: dict[str, str] = {}
    checked: dict[str, str | None] = {}
    for tenant, namespaces in sorted(config.tenants.items()):
        for ns in namespaces:
            if ns not in checked:
                checked[ns] = await _namespace_problem(kube, ns)
            if checked[ns] is not None:
                out[tenant] = f"namespace {ns}: {checked[ns]}"
                log.error("tenant refused", extra={"detail": {"tenant": tenant, "why": out[tenant]}})
                break
    return out


async def _namespace_problem(kube: KubeClient, namespace: str) -> str | None:
    try:
        if await kube.get(api_path("", "v1", "namespaces", name=namespace)) is None:
            return "does not exist"
    except KubeError as e:
        if e.status != 403:  # reading namespaces is a cluster-wide grant; its absence is not fatal here
            return f"cannot be read: {e}"
    missing = []
    for p in NAMESPACED_RULES:
        allowed, _ = await kube.can_i(p.verb, p.resource, group=p.group, namespace=namespace)
        if not allowed:
            missing.append(str(p))
    if missing:
        return "the agent's ServiceAccount may not " + ", ".join(missing) + " (bind tandem-agent-workloads: " \
               "`tandem-extender render-rbac --config agent.yaml`)"
    return None


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


def render_rbac(config: AgentConfig, *, service_account: str = "tandem-agent",
                namespace: str = "tandem-system") -> str:
    """RoleBindings of ClusterRole tandem-agent-workloads in every namespace the config maps a tenant to."""
    docs = []
    for ns in sorted({n for namespaces in config.tenants.values() for n in namespaces}):
        docs.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tandem-agent-workloads", "namespace": ns,
                         "labels": {"app.kubernetes.io/part-of": "tandem"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "tandem-agent-workloads"},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        })
    return yaml.safe_dump_all(docs, sort_keys=False)
