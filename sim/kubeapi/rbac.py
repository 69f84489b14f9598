"""RBAC as the real authorizer evaluates it, over the Role/ClusterRole/binding objects in the store.

Bindings are read live from the store, so objects created through the API take effect at once.
A binding whose role does not exist grants nothing (the denial then names the missing role,
as the real server's "RBAC: clusterrole... not found" suffix does). Members of
`system:masters` bypass RBAC. Aggregated ClusterRoles (aggregationRule) are not expanded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from sim.kubeapi.objects import User
from sim.kubeapi.store import Store

__all__ = ["Attributes", "Authorizer", "Decision", "builtin_objects", "forbidden_reason", "load_manifests"]

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
_KEYS = {k: f"{RBAC_GROUP}/{k.lower()}s" for k in RBAC_KINDS}


@dataclasses.dataclass(frozen=True)
class Attributes:
    """What a request asks to do (authorizer.Attributes)."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def resource_request(self) -> bool:
        return not self.path


@dataclasses.dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


def forbidden_reason(user: User, attrs: Attributes, decision: Decision) -> str:
    """The text after "is forbidden: " in the real 403 (responsewriters.forbiddenMessage + reason)."""
    if not attrs.resource_request:
        msg = f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        msg = f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {scope}'
    return f"{msg}: {decision.reason}" if decision.reason else msg


def _rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        for url in rule.get("nonResourceURLs") or []:
            if url == "*" or url == attrs.path or (url.endswith("*") and attrs.path.startswith(url[:-1])):
                return True
        return False
    groups = rule.get("apiGroups")
    if groups is None or ("*" not in groups and attrs.group not in groups):
        return False
    resources = rule.get("resources") or []
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    if not ("*" in resources or combined in resources or (attrs.subresource and f"*/{attrs.subresource}" in resources)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (bool(attrs.name) and attrs.name in names)


def _describe_subject(subject: dict[str, Any], binding_ns: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f'ServiceAccount "{subject.get("name")}/{subject.get("namespace") or binding_ns}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


def _matching_subject(binding: dict[str, Any], user: User, binding_ns: str) -> dict[str, Any] | None:
    for subject in binding.get("subjects") or []:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == user.name:
            return dict(subject)
        if kind == "Group" and name in user.groups:
            return dict(subject)
        if kind == "ServiceAccount":
            ns = subject.get("namespace") or binding_ns
            if user.name == f"system:serviceaccount:{ns}:{name}":
                return dict(subject)
    return None


class Authorizer:
    """Evaluates requests against the RBAC objects currently in the store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def _role_rules(self, ref: dict[str, Any], namespace: str, errors: list[str]) -> list[dict[str, Any]]:
        kind, name = ref.get("kind"), str(ref.get("name"))
        if kind == "ClusterRole":
            role = self._store.get(_KEYS["ClusterRole"], "", name)
            if role is None:
                errors.append(f'clusterrole.{RBAC_GROUP} "{name}" not found')
                return []
        else:
            role = self._store.get(_KEYS["Role"], namespace, name)
            if role is None:
                errors.append(f'role.{RBAC_GROUP} "{name}" not found')
                return []
        return list(role.get("rules") or [])

    def _bindings(self, namespace: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for binding in self._store.items(_KEYS["ClusterRoleBinding"]):
            yield "", binding
        if namespace:
            for binding in self._store.items(_KEYS["RoleBinding"], namespace):
                yield namespace, binding

    def authorize(self, user: User, attrs: Attributes) -> Decision:
        if user.privileged:
            return Decision(True)
        errors: list[str] = []
        for binding_ns, binding in self._bindings(attrs.namespace):
            subject = _matching_subject(binding, user, binding_ns)
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            for rule in self._role_rules(ref, binding_ns, errors):
                if _rule_allows(rule, attrs):
                    name = binding["metadata"]["name"]
                    if binding_ns:
                        by = f'RoleBinding "{name}/{binding_ns}" of {ref.get("kind")} "{ref.get("name")}"'
                    else:
                        by = f'ClusterRoleBinding "{name}" of {ref.get("kind")} "{ref.get("name")}"'
                    return Decision(True, f"RBAC: allowed by {by} to {_describe_subject(subject, binding_ns)}")
        if not errors:
            return Decision(False)
        joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        return Decision(False, f"RBAC: {joined}")


def load_manifests(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The RBAC objects in YAML files or directories (recursive `*.yaml`, kustomization.yaml skipped)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.yaml") if p.name != "kustomization.yaml"))
        elif path.name != "kustomization.yaml":
            files.append(path)
    out: list[dict[str, Any]] = []
    for file in files:
        for doc in yaml.safe_load_all(file.read_text()):
            if (
                isinstance(doc, dict)
                and doc.get("kind") in RBAC_KINDS
                and str(doc.get("apiVersion", "")).startswith(RBAC_GROUP)
            ):
                out.append(doc)
    return out


def _rule(
    groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str], names: Iterable[str] = ()
) -> dict[str, Any]:
    rule: dict[str, Any] = {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources)}
    if names:
        rule["resourceNames"] = list(names)
    return rule


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": rules,
    }


def _cluster_binding(name: str, role: str, kind: str, subject: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": kind, "name": subject}],
    }


_READ = ("get", "list", "watch")
_DISCOVERY = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
]


def builtin_objects() -> list[dict[str, Any]]:
    """The bootstrap roles the fake defines: the real ones Tandem relies on, the scheduler roles minimal."""
    scheduler_rules = [
        _rule(["", "events.k8s.io"], ["events"], ["create", "patch", "update"]),
        _rule(["coordination.k8s.io"], ["leases"], ["create"]),
        _rule(["coordination.k8s.io"], ["leases"], ["get", "update"], ["kube-scheduler"]),
        _rule([""], ["nodes"], _READ),
        _rule([""], ["pods"], ["delete", *_READ]),
        _rule([""], ["bindings", "pods/binding"], ["create"]),
        _rule([""], ["pods/status"], ["patch", "update"]),
        _rule([""], ["replicationcontrollers", "services"], _READ),
        _rule(["apps", "extensions"], ["replicasets"], _READ),
        _rule(["apps"], ["statefulsets"], _READ),
        _rule(["policy"], ["poddisruptionbudgets"], _READ),
        _rule([""], ["persistentvolumeclaims", "persistentvolumes"], _READ),
        _rule(["authentication.k8s.io"], ["tokenreviews"], ["create"]),
        _rule(["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
        _rule(["storage.k8s.io"], ["csinodes", "csidrivers", "csistoragecapacities"], _READ),
        _rule([""], ["namespaces"], _READ),
        _rule(["resource.k8s.io"], ["resourceclaims", "resourceslices", "deviceclasses"], _READ),
        _rule(["resource.k8s.io"], ["resourceclaims/status"], ["patch", "update"]),
    ]
    objects = [
        _cluster_role("cluster-admin", [_rule(["*"], ["*"], ["*"]), {"verbs": ["*"], "nonResourceURLs": ["*"]}]),
        _cluster_binding("cluster-admin", "cluster-admin", "Group", "system:masters"),
        _cluster_role("system:discovery", [{"verbs": ["get"], "nonResourceURLs": _DISCOVERY}]),
        _cluster_binding("system:discovery", "system:discovery", "Group", "system:authenticated"),
        _cluster_role(
            "system:basic-user",
            [
                _rule(["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], ["create"]),
                _rule(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"]),
            ],
        ),
        _cluster_binding("system:basic-user", "system:basic-user", "Group", "system:authenticated"),
        _cluster_role("system:kube-scheduler", scheduler_rules),
        _cluster_binding("system:kube-scheduler", "system:kube-scheduler", "User", "system:kube-scheduler"),
        _cluster_role(
            "system:volume-scheduler",
            [
                _rule([""], ["persistentvolumes"], ["get", "list", "patch", "update", "watch"]),
                _rule(["storage.k8s.io"], ["storageclasses"], _READ),
                _rule([""], ["persistentvolumeclaims"], ["get", "list", "patch", "update", "watch"]),
            ],
        ),
        _cluster_binding("system:volume-scheduler", "system:volume-scheduler", "User", "system:kube-scheduler"),
        {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "Role",
            "metadata": {
                "name": "extension-apiserver-authentication-reader",
                "namespace": "kube-system",
                "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            },
            "rules": [_rule([""], ["configmaps"], _READ, ["extension-apiserver-authentication"])],
        },
    ]
    return objects


def self_subject_access_review(authorizer: Authorizer, user: User, body: dict[str, Any]) -> dict[str, Any]:
    """Answer a SelfSubjectAccessReview for the caller from RBAC (status.allowed, reason when allowed)."""
    spec = body.get("spec") or {}
    res = spec.get("resourceAttributes")
    non_res = spec.get("nonResourceAttributes")
    if res is not None:
        attrs = Attributes(
            verb=str(res.get("verb", "")),
            group=str(res.get("group", "")),
            resource=str(res.get("resource", "")),
            subresource=str(res.get("subresource", "")),
            namespace=str(res.get("namespace", "")),
            name=str(res.get("name", "")),
        )
    else:
        non_res = non_res or {}
        attrs = Attributes(verb=str(non_res.get("verb", "")), path=str(non_res.get("path", "")) or "/")
    decision = authorizer.authorize(user, attrs)
    status: dict[str, Any] = {"allowed": decision.allowed}
    if decision.reason:
        status["reason"] = decision.reason
    return {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }
