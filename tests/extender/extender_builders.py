"""Builders of real-format Kubernetes objects for the extender tests, derived from the fixtures."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import orjson

from tests.extender.extender_support import cluster_items, fixture_pod

_uids = itertools.count(1)


def _fixture(kind: str, name: str) -> dict[str, Any]:
    for o in cluster_items():
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return copy.deepcopy(o)
    raise KeyError(name)


def node(base: str = "h100-r1-n2", **changes: Any) -> dict[str, Any]:
    """A fixture node, optionally renamed (name=), cordoned, made not ready or relabelled."""
    n = _fixture("Node", base)
    name = changes.pop("name", None)
    if name:
        n["metadata"]["name"] = name
        n["metadata"]["labels"]["kubernetes.io/hostname"] = name
    if changes.pop("cordoned", False):
        n["spec"]["unschedulable"] = True
    if changes.pop("not_ready", False):
        for c in n["status"]["conditions"]:
            if c["type"] == "Ready":
                c["status"] = "False"
    n["metadata"]["labels"].update(changes.pop("labels", {}))
    assert not changes, changes
    return n


def pod(
    name: str,
    *,
    gpus: int = 0,
    cpu: str = "8",
    memory: str = "64Gi",
    extra: dict[str, str] | None = None,
    node_name: str | None = None,
    phase: str = "Pending",
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    namespace: str = "team-a",
    tolerate_gpu: bool = True,
    claims: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod shaped like the fixture's pending pods (want-4-h100 as the template)."""
    p = fixture_pod("want-4-h100")
    p["metadata"].update(name=name, namespace=namespace, uid=f"00000000-0000-0000-0000-{next(_uids):012d}")
    p["metadata"]["labels"] = dict(labels or {})
    req: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        req["nvidia.com/gpu"] = str(gpus)
    req.update(extra or {})
    c = p["spec"]["containers"][0]
    c["resources"] = {"requests": dict(req), "limits": dict(req)}
    spec = p["spec"]
    spec.pop("nodeSelector", None)
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if not tolerate_gpu:
        spec["tolerations"] = [t for t in spec["tolerations"] if t["key"] != "nvidia.com/gpu"]
    if claims:
        spec["resourceClaims"] = claims
        c["resources"]["claims"] = [{"name": cl["name"]} for cl in claims]
    if node_name:
        spec["nodeName"] = node_name
    p["status"] = {"phase": phase, "qosClass": "Guaranteed"}
    if phase == "Pending" and not node_name:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return p


def gang_pod(
    name: str,
    job: str,
    attempt: str,
    gpus: int,
    *,
    pinned: str | None = None,
    node_name: str | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    """A gang replica as the agent creates it: job/attempt labels, pinned by a `metadata.name` field
    requirement in its required node affinity (never by the hostname label: it may differ)."""
    p = pod(
        name, gpus=gpus, labels={"tandem.dev/job": job, "tandem.dev/attempt": attempt}, node_name=node_name, phase=phase
    )
    if pinned:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pinned]}]}
        p["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return p


def reservation(
    job: str,
    attempt: str,
    nodes: dict[str, int],
    *,
    gpus: int = 4,
    cpu: str = "8",
    memory: str = "64Gi",
    domain: str = "",
    namespace: str = "tandem-system",
    mig: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A reservation ConfigMap in the documented format."""
    data = {
        "job": job,
        "attempt": attempt,
        "nodes": orjson.dumps(nodes).decode(),
        "shape": orjson.dumps({"gpus": gpus, "cpu": cpu, "memory": memory, "mig": mig or {}}).decode(),
    }
    if domain:
        data["domain"] = domain
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"res-{job}-{attempt}",
            "namespace": namespace,
            "labels": {"tandem.dev/reservation": "true", "tandem.dev/job": job},
            "uid": f"cm-{next(_uids)}",
            "resourceVersion": "1",
        },
        "data": data,
    }


def claim(
    name: str,
    count: int,
    *,
    selectors: tuple[str, ...] = (),
    device_class: str = "gpu.nvidia.com",
    namespace: str = "team-a",
    allocated: list[str] | None = None,
    node: str = "h200-dra-1",
    reserved_for: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim like the fixture's (resource.k8s.io/v1), optionally allocated on `node`."""
    c = _fixture("ResourceClaim", "want-dra-4-gpus")
    c["metadata"].update(name=name, namespace=namespace, uid=f"claim-{next(_uids)}")
    exact = c["spec"]["devices"]["requests"][0]["exactly"]
    exact["count"] = count
    exact["deviceClassName"] = device_class
    if selectors:
        exact["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    else:
        exact.pop("selectors", None)
    if allocated is not None:
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node, "device": d} for d in allocated
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": reserved_for[0], "uid": reserved_for[1]}]
            if reserved_for
            else [],
        }
    return c


def device_class(name: str, *selectors: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "uid": f"dc-{next(_uids)}", "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": s}} for s in selectors]},
    }


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}
