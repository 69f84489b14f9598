"""Real-format objects for the contract tests (shapes as `kubectl get -o json` prints them).

Nodes and ResourceSlices come from the shared fixtures (tests/fixtures/cluster.json) with
their server-set fields removed; Pods, Jobs and ConfigMaps are built the way Tandem writes them.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from tests.fixtures import fixture_json

Obj = dict[str, Any]
_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def _strip(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    for key in _SERVER_FIELDS:
        out["metadata"].pop(key, None)
    out["metadata"].pop("ownerReferences", None)
    return out


def fixture_object(kind: str, name: str | None = None) -> Obj:
    """An object of that kind from the shared cluster fixture, ready to be created."""
    for item in fixture_json("cluster.json")["items"]:
        if item["kind"] == kind and (name is None or item["metadata"]["name"] == name):
            return _strip(item)
    raise KeyError(f"no {kind} {name} in the fixture")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def node(name: str | None = None, *, source: str = "h100-r1-n1", labels: dict[str, str] | None = None) -> Obj:
    """A GPU node from the fixture under a fresh name (its hostname label keeps the fixture's value)."""
    obj = fixture_object("Node", source)
    obj["metadata"]["name"] = name or unique("node")
    obj["metadata"].setdefault("labels", {}).update(labels or {})
    return obj


def resource_slice(node_name: str) -> Obj:
    obj = fixture_object("ResourceSlice")
    obj["metadata"]["name"] = unique(f"{node_name}-gpu.nvidia.com")
    obj["spec"]["nodeName"] = node_name
    obj["spec"]["pool"]["name"] = node_name
    return obj


CONTRACT_LABEL = "tandem.dev/contract"
"""On every ConfigMap the tests make: a real namespace also holds kube-root-ca.crt, so lists and
watches of ConfigMaps select this label."""


def configmap(
    name: str,
    namespace: str,
    *,
    labels: dict[str, str] | None = None,
    data: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    owners: list[Obj] | None = None,
) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "labels": {CONTRACT_LABEL: "yes", **(labels or {})}}
    if finalizers:
        meta["finalizers"] = finalizers
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {"k": "v"}}


def owner_ref(owner: Obj, *, controller: bool = False, block: bool = False) -> Obj:
    ref: Obj = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }
    if controller:
        ref["controller"] = True
    if block:
        ref["blockOwnerDeletion"] = True
    return ref


def pod(
    name: str,
    namespace: str,
    *,
    gates: tuple[str, ...] = (),
    node_name: str | None = None,
    gpus: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    labels: dict[str, str] | None = None,
    priority_class: str | None = None,
    scheduler: str = "tandem-scheduler",
    affinity_nodes: tuple[str, ...] = (),
    owners: list[Obj] | None = None,
    finalizers: list[str] | None = None,
) -> Obj:
    """A pod as the Tandem agent renders gang members: gated, GPU limits, a required node affinity term."""
    limits: Obj = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    spec: Obj = {
        "restartPolicy": "Never",
        "schedulerName": scheduler,
        "containers": [
            {
                "name": "trainer",
                "image": "nvcr.io/nvidia/pytorch:25.10-py3",
                "command": ["torchrun", "train.py"],
                "resources": {"limits": limits} if limits else {},
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node_name:
        spec["nodeName"] = node_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    if affinity_nodes:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "network.example.com/rack", "operator": "In", "values": ["r1", "r2"]}
                            ]
                        },
                    ]
                }
            }
        }
    meta: Obj = {"name": name, "namespace": namespace, "labels": labels or {"app": "trainer"}}
    if owners:
        meta["ownerReferences"] = owners
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def job(
    name: str, namespace: str, *, count: int = 2, suspend: bool = False, restart: str = "Never", indexed: bool = True
) -> Obj:
    """An Indexed Job as A-4 prescribes (or a bare one with indexed=False to see the defaults)."""
    spec: Obj = {
        "template": {
            "metadata": {"labels": {"tandem.dev/job": name}},
            "spec": {
                "restartPolicy": restart,
                "containers": [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.10-py3"}],
            },
        }
    }
    if indexed:
        spec.update(
            {
                "completionMode": "Indexed",
                "completions": count,
                "parallelism": count,
                "backoffLimit": 0,
                "podReplacementPolicy": "Failed",
            }
        )
    if suspend:
        spec["suspend"] = True
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def lease(name: str, namespace: str, *, holder: str, renew_time: str, duration: int = 15) -> Obj:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": renew_time,
            "renewTime": renew_time,
            "leaseTransitions": 0,
        },
    }
