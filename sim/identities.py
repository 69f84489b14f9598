"""Who each simulated controller is, and the RBAC it gets: upstream's bootstrap roles for the controllers.

Every controller of a ``SimCluster`` talks to its API server with a ServiceAccount token, so a
missing permission fails there exactly as it would on a real cluster:

* Job controller: ``kube-system/job-controller`` with ``system:controller:job-controller``
  (upstream's rules, bound cluster-wide);
* PodGC: ``kube-system/pod-garbage-collector`` with ``system:controller:pod-garbage-collector``
  (upstream's rules);
* scheduler stand-in: the shipped ``tandem-system/tandem-scheduler`` ServiceAccount with the
  shipped ``rbac.yaml`` (``system:kube-scheduler`` and the extender's read access);
* kubelet stand-in: ``kube-system/sim-kubelet`` with ``sim:kubelet``, what the Node authorizer
  lets a kubelet do for its own nodes, here granted cluster-wide.

Upstream's controller roles are created only where the server does not already define them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Identity", "CONTROLLER_IDENTITIES", "cluster_role", "cluster_role_binding", "service_account"]

JSON = dict[str, Any]
_READ = ["get", "list", "watch"]
_EVENTS = {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]}


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> JSON:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


@dataclasses.dataclass(frozen=True)
class Identity:
    """A ServiceAccount and the ClusterRole bound to it (``rules`` empty: the role exists already)."""

    namespace: str
    name: str
    role: str
    rules: tuple[JSON, ...] = ()


JOB_CONTROLLER = Identity(
    "kube-system",
    "job-controller",
    "system:controller:job-controller",
    (
        _rule(["batch"], ["jobs"], ["get", "list", "watch", "update", "patch"]),
        _rule(["batch"], ["jobs/status"], ["update", "patch"]),
        _rule(["batch"], ["jobs/finalizers"], ["update"]),
        _rule([""], ["pods"], ["list", "watch", "create", "delete", "patch"]),
        _EVENTS,
    ),
)
POD_GC = Identity(
    "kube-system",
    "pod-garbage-collector",
    "system:controller:pod-garbage-collector",
    (
        _rule([""], ["pods"], ["list", "watch", "delete"]),
        _rule([""], ["nodes"], _READ),
        _rule([""], ["pods/status"], ["patch"]),
    ),
)
KUBELET = Identity(
    "kube-system",
    "sim-kubelet",
    "sim:kubelet",
    (
        _rule([""], ["nodes"], ["get", "list", "watch", "create", "patch", "update"]),
        _rule([""], ["nodes/status"], ["patch", "update"]),
        _rule([""], ["pods"], ["get", "list", "watch", "delete"]),
        _rule([""], ["pods/status"], ["patch", "update"]),
        _rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update", "patch"]),
        _rule(["resource.k8s.io"], ["resourceslices"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
        _EVENTS,
    ),
)
CONTROLLER_IDENTITIES = (JOB_CONTROLLER, POD_GC, KUBELET)


def service_account(namespace: str, name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}


def cluster_role(identity: Identity) -> JSON:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": identity.role, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "rules": [dict(r) for r in identity.rules],
    }


def cluster_role_binding(identity: Identity) -> JSON:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": identity.role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": identity.role},
        "subjects": [{"kind": "ServiceAccount", "name": identity.name, "namespace": identity.namespace}],
    }
