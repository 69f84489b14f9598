"""What a fresh control plane already holds: system namespaces with their default ServiceAccount, the
system PriorityClasses, the bootstrap RBAC roles, and the RBAC objects loaded from manifests.
"""

from __future__ import annotations

from typing import Any

from sim.kubeapi import errors, rbac, schema
from sim.kubeapi.objects import clone
from sim.kubeapi.resources import by_kind, by_path
from sim.kubeapi.state import ApiState
from sim.kubeapi.writes import Writer

__all__ = ["bootstrap"]

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
SYSTEM_PRIORITY_CLASSES = (
    (
        "system-cluster-critical",
        2000000000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
    (
        "system-node-critical",
        2000001000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
)


def ensure_namespace(state: ApiState, writer: Writer, name: str) -> None:
    ns_rt = by_path("", "v1", "namespaces")
    assert ns_rt is not None
    if state.store.get(ns_rt.key, "", name) is None:
        writer.create_decoded(ns_rt, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def _create(state: ApiState, writer: Writer, obj: dict[str, Any]) -> None:
    rt = by_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
    if rt is None:
        raise ValueError(f"cannot load {obj.get('apiVersion')}/{obj.get('kind')}")
    node = schema.root_node(rt.group, rt.version, rt.kind)
    obj = schema.decode(node, clone(obj))[0] if node is not None else clone(obj)
    obj.setdefault("metadata", {})
    if rt.namespaced:
        ensure_namespace(state, writer, str(obj["metadata"].get("namespace") or "default"))
        obj["metadata"].setdefault("namespace", "default")
    try:
        writer.create_decoded(rt, obj)
    except errors.ApiError as e:
        if e.reason != "AlreadyExists":
            raise ValueError(f"cannot load {rt.kind} {obj['metadata'].get('name')}: {e.message}") from e


def bootstrap(state: ApiState, writer: Writer, manifests: list[dict[str, Any]]) -> None:
    """Seed the store (idempotent: objects that exist are kept)."""
    for name in SYSTEM_NAMESPACES:
        ensure_namespace(state, writer, name)
    for name, value, description in SYSTEM_PRIORITY_CLASSES:
        _create(
            state,
            writer,
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "description": description,
            },
        )
    for obj in rbac.builtin_objects():
        _create(state, writer, obj)
    for obj in manifests:
        _create(state, writer, obj)
