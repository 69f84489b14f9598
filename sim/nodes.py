"""Node fixtures and what a kubelet writes for its node: registration body, heartbeat conditions, Lease (pure).

A fixture is real-format Node (and ResourceSlice) JSON or YAML: one object, a ``List``, or
several YAML documents, as ``kubectl get nodes -o yaml`` prints them.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from sim.jobpods import format_time
from sim.podstatus import micro_time

__all__ = [
    "load_fixture",
    "registration_body",
    "resource_slice_body",
    "node_conditions",
    "lease_body",
    "host_ip",
    "PodIPs",
    "NODE_LEASE_NAMESPACE",
]

JSON = dict[str, Any]
NODE_LEASE_NAMESPACE = "kube-node-lease"
_SERVER_FIELDS = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
_READY = ("True", "KubeletReady", "kubelet is posting ready status")
_NOT_READY_MESSAGE = (
    "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
    "message:Network plugin returns error: cni plugin not initialized"
)
_PRESSURE = {
    "MemoryPressure": ("False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    "DiskPressure": ("False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    "PIDPressure": ("False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
}


def _objects(doc: Any) -> list[JSON]:
    if not isinstance(doc, dict):
        return []
    if isinstance(doc.get("items"), list):
        return [o for o in doc["items"] if isinstance(o, dict)]
    return [doc]


def load_fixture(path: Path) -> tuple[list[JSON], list[JSON]]:
    """(Nodes, ResourceSlices) from a JSON or YAML file; other kinds are ignored."""
    text = path.read_bytes()
    docs: list[Any]
    if path.suffix == ".json":
        docs = [orjson.loads(text)]
    else:
        docs = list(yaml.safe_load_all(text))
    objs = [o for d in docs for o in _objects(d)]
    nodes = [o for o in objs if o.get("kind") == "Node"]
    slices = [o for o in objs if o.get("kind") == "ResourceSlice"]
    return nodes, slices


def _clean_meta(meta: Mapping[str, Any]) -> JSON:
    out = {k: copy.deepcopy(v) for k, v in meta.items() if k not in _SERVER_FIELDS}
    return out


def registration_body(node: Mapping[str, Any]) -> JSON:
    """The Node to POST: the fixture without server-set metadata (the status is sent again by the heartbeat)."""
    body: JSON = {"apiVersion": "v1", "kind": "Node", "metadata": _clean_meta(node.get("metadata") or {})}
    body["spec"] = copy.deepcopy(dict(node.get("spec") or {}))
    if node.get("status"):
        body["status"] = copy.deepcopy(dict(node["status"]))
    return body


def resource_slice_body(rslice: Mapping[str, Any]) -> JSON:
    body = {k: copy.deepcopy(v) for k, v in rslice.items() if k != "status"}
    body["metadata"] = _clean_meta(rslice.get("metadata") or {})
    return body


def node_conditions(previous: list[JSON] | None, ready: bool, now: float, message: str | None = None) -> list[JSON]:
    """The four kubelet conditions with a fresh ``lastHeartbeatTime``; transitions keep their time."""
    old = {c.get("type"): c for c in previous or []}
    want = dict(_PRESSURE)
    want["Ready"] = _READY if ready else ("False", "KubeletNotReady", message or _NOT_READY_MESSAGE)
    if ready and message:
        want["Ready"] = ("True", "KubeletReady", message)
    stamp = format_time(now)
    out = []
    for ctype, (status, reason, msg) in want.items():
        prev = old.get(ctype) or {}
        out.append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": msg,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": prev.get("lastTransitionTime") if prev.get("status") == status else stamp,
            }
        )
    return out


def lease_body(node: Mapping[str, Any], now: float, duration_s: int) -> JSON:
    """The node's Lease in ``kube-node-lease``, owned by the Node (as the kubelet creates it)."""
    meta = node.get("metadata") or {}
    lease: JSON = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": meta["name"], "namespace": NODE_LEASE_NAMESPACE},
        "spec": {"holderIdentity": meta["name"], "leaseDurationSeconds": duration_s, "renewTime": micro_time(now)},
    }
    if meta.get("uid"):
        lease["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}
        ]
    return lease


def host_ip(node: Mapping[str, Any]) -> str:
    """The node's InternalIP (first address otherwise)."""
    addrs = (node.get("status") or {}).get("addresses") or []
    for a in addrs:
        if a.get("type") == "InternalIP":
            return str(a.get("address"))
    return str(addrs[0].get("address")) if addrs else "127.0.0.1"


class PodIPs:
    """Pod IPs from each node's ``spec.podCIDR`` (or 10.244.<n>.0/24), first usable address skipped."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._cidrs: dict[str, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}

    def allocate(self, node: Mapping[str, Any]) -> str:
        name = str(node["metadata"]["name"])
        if name not in self._cidrs:
            cidr = (node.get("spec") or {}).get("podCIDR")
            n = len(self._cidrs)
            self._cidrs[name] = ipaddress.ip_network(cidr or f"10.{244 + n // 256}.{n % 256}.0/24", strict=False)
        net = self._cidrs[name]
        i = self._next.get(name, 2)
        if i >= net.num_addresses - 1:
            i = 2  # wrapped: old pods are long gone in a simulation
        self._next[name] = i + 1
        return str(net[i])
