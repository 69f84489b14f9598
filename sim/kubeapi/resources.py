"""The resources the fake serves: group, version, plural, kind, scope, subresources and field labels.

One table drives routing, discovery (APIResourceList), RBAC resource names and the field
selectors each resource supports (the real server refuses any other field label).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["RESOURCES", "ResourceType", "by_kind", "by_path", "group_versions", "field_value"]

FieldGetter = Callable[[Mapping[str, Any]], str]

_READ = ("get", "list", "watch")
_ALL = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclasses.dataclass(frozen=True)
class ResourceType:
    """One REST resource (a plural under a group/version)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = _ALL
    short_names: tuple[str, ...] = ()
    field_labels: frozenset[str] = frozenset()
    generation: bool = False
    """The server keeps metadata.generation (1 at create, +1 on every spec change)."""
    create_on_update: bool = False
    """A PUT of a missing object creates it (AllowCreateOnUpdate in the real strategy)."""
    return_deleted: bool = False
    """A completed DELETE answers the object itself instead of a Success Status."""
    clear_status_on_create: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Store key: "/pods", "batch/jobs"."""
        return f"{self.group}/{self.plural}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


_META = frozenset({"metadata.name", "metadata.namespace"})
_POD_FIELDS = _META | {
    "spec.nodeName",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.restartPolicy",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.podIPs",
    "status.nominatedNodeName",
}
_EVENT_FIELDS = _META | {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
}

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        False,
        "namespace",
        frozenset({"status"}),
        ("create", "delete", "get", "list", "patch", "update", "watch"),
        ("ns",),
        _META | {"status.phase"},
        clear_status_on_create=True,
        return_deleted=True,
    ),
    ResourceType(
        "",
        "v1",
        "nodes",
        "Node",
        False,
        "node",
        frozenset({"status"}),
        short_names=("no",),
        field_labels=_META | {"spec.unschedulable"},
        clear_status_on_create=False,
    ),
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        "pod",
        frozenset({"status", "binding"}),
        short_names=("po",),
        field_labels=_POD_FIELDS,
        generation=True,
        return_deleted=True,
    ),
    ResourceType(
        "",
        "v1",
        "services",
        "Service",
        True,
        "service",
        frozenset({"status"}),
        short_names=("svc",),
        field_labels=_META,
        create_on_update=True,
        return_deleted=True,
    ),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, "configmap", short_names=("cm",), field_labels=_META),
    ResourceType(
        "",
        "v1",
        "events",
        "Event",
        True,
        "event",
        short_names=("ev",),
        field_labels=_EVENT_FIELDS,
        create_on_update=True,
    ),
    ResourceType(
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        True,
        "resourcequota",
        frozenset({"status"}),
        short_names=("quota",),
        field_labels=_META,
    ),
    ResourceType(
        "", "v1", "limitranges", "LimitRange", True, "limitrange", short_names=("limits",), field_labels=_META
    ),
    ResourceType(
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        True,
        "serviceaccount",
        frozenset({"token"}),
        short_names=("sa",),
        field_labels=_META,
    ),
    ResourceType(
        "batch",
        "v1",
        "jobs",
        "Job",
        True,
        "job",
        frozenset({"status"}),
        field_labels=_META | {"status.successful"},
        generation=True,
    ),
    ResourceType(
        "coordination.k8s.io", "v1", "leases", "Lease", True, "lease", field_labels=_META, create_on_update=True
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        False,
        "resourceslice",
        field_labels=_META | {"spec.nodeName", "spec.driver"},
        generation=True,
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceclaims",
        "ResourceClaim",
        True,
        "resourceclaim",
        frozenset({"status"}),
        field_labels=_META,
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        "DeviceClass",
        False,
        "deviceclass",
        field_labels=_META,
        generation=True,
    ),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        True,
        "resourceclaimtemplate",
        field_labels=_META,
    ),
    ResourceType(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        False,
        "priorityclass",
        short_names=("pc",),
        field_labels=_META,
    ),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True, "role", field_labels=_META),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, "rolebinding", field_labels=_META
    ),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, "clusterrole", field_labels=_META
    ),
    ResourceType(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        False,
        "clusterrolebinding",
        field_labels=_META,
    ),
    ResourceType(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        False,
        "selfsubjectaccessreview",
        verbs=("create",),
    ),
)

_BY_PATH: dict[tuple[str, str, str], ResourceType] = {(r.group, r.version, r.plural): r for r in RESOURCES}
_BY_KIND: dict[tuple[str, str], ResourceType] = {(r.api_version, r.kind): r for r in RESOURCES}
_BY_GROUP_KIND: dict[tuple[str, str], ResourceType] = {(r.group, r.kind): r for r in RESOURCES}


def by_path(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    """The resource of an (apiVersion, kind) pair; the version is ignored if the group matches (owner refs)."""
    found = _BY_KIND.get((api_version, kind))
    if found is None:
        group = api_version.split("/", 1)[0] if "/" in api_version else ""
        found = _BY_GROUP_KIND.get((group, kind))
    return found


def group_versions() -> dict[str, list[str]]:
    """Served groups ("" is core) and their versions, in discovery order."""
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        versions = out.setdefault(r.group, [])
        if r.version not in versions:
            versions.append(r.version)
    return out


def _dig(obj: Mapping[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def field_value(obj: Mapping[str, Any], label: str) -> str:
    """The string a field selector compares with, as the real field-label conversion computes it."""
    if label == "source":
        value = _dig(obj, "source.component")
    elif label == "status.successful":
        value = _dig(obj, "status.succeeded") or 0
    elif label == "status.podIPs":
        ips = _dig(obj, "status.podIPs") or []
        return ",".join(str(ip.get("ip", "")) for ip in ips if isinstance(ip, Mapping))
    else:
        value = _dig(obj, label)
    if label in ("spec.hostNetwork", "spec.unschedulable"):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
