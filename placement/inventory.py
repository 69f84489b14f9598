"""Kubernetes objects (Node, Pod, ResourceSlice, ResourceClaim JSON) to core Nodes, converted in one place."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from placement.errors import PodSpecError, QuantityError
from placement.model import (
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    WHOLE_GPU_MILLI,
    AttributeValue,
    DraDevice,
    DraVersion,
    Gpu,
    Node,
    Taint,
    TopologyLevels,
)
from placement.podspec import GPU_MILLI_RESOURCE, GPU_RESOURCE, holds_resources, pod_requests
from placement.quantity import cpu_milli, to_int_bytes

__all__ = ["DeviceKey", "allocated_devices", "dra_devices", "node_from_k8s", "nodes_from_list"]

DeviceKey = tuple[str, str, str]
"""(driver, pool, device name) as in a ResourceClaim's allocation results."""

_NOT_EXTENDED = {"cpu", "memory", "pods", "ephemeral-storage", GPU_RESOURCE, GPU_MILLI_RESOURCE}


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> frozenset[DeviceKey]:
    """Every device some ResourceClaim has been allocated (status.allocation.devices.results)."""
    out: set[DeviceKey] = set()
    for claim in claims:
        for r in _get(claim, "status", "allocation", "devices", "results") or ():
            if isinstance(r, Mapping):
                out.add((str(r.get("driver")), str(r.get("pool")), str(r.get("device"))))
    return frozenset(out)


def _attribute(value: Mapping[str, Any]) -> AttributeValue:
    if "string" in value:
        return str(value["string"])
    if "bool" in value:
        return bool(value["bool"])
    if "int" in value:
        return int(value["int"])
    if "version" in value:
        return DraVersion(str(value["version"]))
    raise PodSpecError("attributes", f"unknown attribute type {sorted(value)}")


def dra_devices(slices: Iterable[Mapping[str, Any]], allocated: frozenset[DeviceKey]) -> tuple[DraDevice, ...]:
    """DraDevices of ResourceSlices (resource.k8s.io/v1), marked allocated from `allocated`."""
    out = []
    for sl in slices:
        driver = str(_get(sl, "spec", "driver"))
        pool = str(_get(sl, "spec", "pool", "name"))
        for dev in _get(sl, "spec", "devices") or ():
            name = str(dev.get("name"))
            attrs = {k: _attribute(v) for k, v in (dev.get("attributes") or {}).items()}
            try:
                caps = {k: to_int_bytes(v.get("value")) for k, v in (dev.get("capacity") or {}).items()}
            except QuantityError as exc:
                raise PodSpecError(f"devices[{name}].capacity", str(exc)) from exc
            out.append(DraDevice(driver, pool, name, attrs, caps, (driver, pool, name) in allocated))
    return tuple(out)


def node_from_k8s(
    node: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]] = (),
    slices: Iterable[Mapping[str, Any]] = (),
    allocated: frozenset[DeviceKey] = frozenset(),
    levels: TopologyLevels | None = None,
) -> Node:
    """A core Node from a Node object, the pods bound to it (others are skipped), its
    ResourceSlices and the set of allocated DRA devices.

    The API shows how many GPUs pods hold, not which: used GPUs are taken lowest index
    first and fractional shares best fit, as the device plugin would hand them out.
    """
    name = _get(node, "metadata", "name")
    if not isinstance(name, str):
        raise PodSpecError("metadata.name", "required")
    labels = {str(k): str(v) for k, v in (_get(node, "metadata", "labels") or {}).items()}
    alloc = _get(node, "status", "allocatable") or {}
    try:
        cpu_alloc = cpu_milli(alloc.get("cpu", 0))
        mem_alloc = to_int_bytes(alloc.get("memory", 0))
        pods_alloc = to_int_bytes(alloc.get("pods", 110))
        gpu_alloc = to_int_bytes(alloc.get(GPU_RESOURCE, 0))
        ext_alloc = {k: to_int_bytes(v) for k, v in alloc.items() if k not in _NOT_EXTENDED and "/" in k}
    except QuantityError as exc:
        raise PodSpecError("status.allocatable", str(exc)) from exc
    used: dict[str, Fraction] = {}
    shares: list[int] = []
    n_pods = 0
    for pod in pods:
        if _get(pod, "spec", "nodeName") != name or not holds_resources(pod):
            continue
        n_pods += 1
        reqs = pod_requests(pod)
        for k, v in reqs.items():
            used[k] = used.get(k, Fraction(0)) + v
        pod_share = reqs.get(GPU_MILLI_RESOURCE)
        if pod_share is not None:
            shares.append(int(pod_share))
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in _get(node, "status", "conditions") or ()
    )
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
        for t in _get(node, "spec", "taints") or ()
    )
    model = labels.get(GPU_PRODUCT_LABEL, "unknown")
    try:
        memory_mib = int(labels.get(GPU_MEMORY_LABEL, "0"))
    except ValueError:
        memory_mib = 0
    whole_used = int(used.get(GPU_RESOURCE, 0))
    milli = [WHOLE_GPU_MILLI if i < whole_used else 0 for i in range(gpu_alloc)]
    for share in sorted(shares, reverse=True):
        fits = [i for i in range(gpu_alloc) if WHOLE_GPU_MILLI - milli[i] >= share]
        if fits:
            best = min(fits, key=lambda i: (WHOLE_GPU_MILLI - milli[i], i))
            milli[best] += share
    gpus = tuple(Gpu(i, model, memory_mib, milli[i]) for i in range(gpu_alloc))
    ext_free = {k: v - int(used.get(k, 0)) for k, v in ext_alloc.items()}
    slices_here: Sequence[Mapping[str, Any]] = [s for s in slices if _get(s, "spec", "nodeName") == name]
    levels = levels or TopologyLevels.default()
    return Node(
        name=name,
        labels=labels,
        taints=taints,
        ready=ready,
        cordoned=bool(_get(node, "spec", "unschedulable")),
        cpu_milli_allocatable=cpu_alloc,
        cpu_milli_free=cpu_alloc - cpu_milli(used.get("cpu", Fraction(0))),
        memory_allocatable=mem_alloc,
        memory_free=mem_alloc - to_int_bytes(used.get("memory", Fraction(0))),
        pods_free=pods_alloc - n_pods,
        gpus=gpus,
        extended_free=ext_free,
        dra_devices=dra_devices(slices_here, allocated),
        topology=levels.path(labels),
    )


def nodes_from_list(
    objects: Mapping[str, Any] | Iterable[Mapping[str, Any]], levels: TopologyLevels | None = None
) -> tuple[Node, ...]:
    """Every Node of a `kubectl get -o json` List (or a plain list of objects) with its pods,
    ResourceSlices and claim allocations applied."""
    items: Iterable[Any] = objects.get("items", ()) if isinstance(objects, Mapping) else objects
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for obj in items:
        if isinstance(obj, Mapping):
            by_kind.setdefault(str(obj.get("kind")), []).append(obj)
    allocated = allocated_devices(by_kind.get("ResourceClaim", ()))
    pods_by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in by_kind.get("Pod", ()):
        pods_by_node.setdefault(str(_get(pod, "spec", "nodeName")), []).append(pod)
    slices = by_kind.get("ResourceSlice", [])
    return tuple(
        node_from_k8s(n, pods_by_node.get(str(_get(n, "metadata", "name")), ()), slices, allocated, levels)
        for n in by_kind.get("Node", ())
    )
