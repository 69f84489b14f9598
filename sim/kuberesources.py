"""REST paths of the Kubernetes resources the simulated cluster's controllers use, in one table."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

__all__ = [
    "Resource",
    "resource_for",
    "PODS",
    "NODES",
    "NAMESPACES",
    "SERVICE_ACCOUNTS",
    "CONFIG_MAPS",
    "EVENTS",
    "JOBS",
    "LEASES",
    "PRIORITY_CLASSES",
    "RESOURCE_SLICES",
    "CLUSTER_ROLES",
    "CLUSTER_ROLE_BINDINGS",
    "ROLES",
    "ROLE_BINDINGS",
]


@dataclasses.dataclass(frozen=True)
class Resource:
    """One REST resource: ``api_version`` as in objects (``v1``, ``batch/v1``), its plural, its scope."""

    api_version: str
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """``/api/v1/namespaces/ns/pods/name/status`` and the like; no namespace on a namespaced one lists all."""
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


PODS = Resource("v1", "pods", "Pod", True)
NODES = Resource("v1", "nodes", "Node", False)
NAMESPACES = Resource("v1", "namespaces", "Namespace", False)
SERVICE_ACCOUNTS = Resource("v1", "serviceaccounts", "ServiceAccount", True)
CONFIG_MAPS = Resource("v1", "configmaps", "ConfigMap", True)
EVENTS = Resource("v1", "events", "Event", True)
JOBS = Resource("batch/v1", "jobs", "Job", True)
LEASES = Resource("coordination.k8s.io/v1", "leases", "Lease", True)
PRIORITY_CLASSES = Resource("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False)
RESOURCE_SLICES = Resource("resource.k8s.io/v1", "resourceslices", "ResourceSlice", False)
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False)
CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False)
ROLES = Resource("rbac.authorization.k8s.io/v1", "roles", "Role", True)
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True)

_BY_KIND: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (
        PODS,
        NODES,
        NAMESPACES,
        SERVICE_ACCOUNTS,
        CONFIG_MAPS,
        EVENTS,
        JOBS,
        LEASES,
        PRIORITY_CLASSES,
        RESOURCE_SLICES,
        CLUSTER_ROLES,
        CLUSTER_ROLE_BINDINGS,
        ROLES,
        ROLE_BINDINGS,
    )
}


def resource_for(obj: Mapping[str, Any]) -> Resource:
    """The resource of an object by its apiVersion and kind (KeyError for kinds not in the table)."""
    return _BY_KIND[(str(obj.get("apiVersion")), str(obj.get("kind")))]
