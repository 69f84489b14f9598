"""One pod of a rendered Job as the agent handles it: the dry-run pod admission sees, what admission
changed (A-8), and the JSON Patches that pin it to its node and start it (A-1, A-3, A-7).

Pure: plain dicts in, plain dicts out; the agent's workloads shell sends them to the API server.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from extender.agent.podtemplate import GATE, INDEX_FIELD
from extender.podreq import INDEX_LABEL
from placement.errors import PodSpecError
from placement.model import PodShape
from placement.podspec import shape_from_pod

__all__ = ["json_pointer", "pin_patch", "ungate_patch", "pod_for_dry_run", "admitted_shape_problem"]

JSON = dict[str, Any]

INDEX_ENV = "JOB_COMPLETION_INDEX"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
_TERMS = ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")


# ----------------------------------------------------------------------------------------- patches


def json_pointer(*parts: str | int) -> str:
    """RFC 6901 pointer: `~` is written `~0` and `/` is written `~1` within a key."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def pin_patch(pod: Mapping[str, Any], node: str) -> list[JSON]:
    """JSON Patch pinning a gated pod to `node` (A-1, A-3): a `metadata.name In [node]` field requirement
    appended to every existing required term (never a new term, which would widen), or a one-term
    affinity when the pod has none. The `test` on resourceVersion makes a concurrent change a 409/422."""
    version = (pod.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise ValueError("pin_patch needs the pod as the API server returned it (no metadata.resourceVersion)")
    ops: list[JSON] = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    at: Any = pod
    depth = 0
    for key in _TERMS:
        nxt = at.get(key) if isinstance(at, Mapping) else None
        if nxt is None or (key == _TERMS[-1] and not nxt):
            break
        at, depth = nxt, depth + 1
    if depth == len(_TERMS) and isinstance(at, list):
        for i, term in enumerate(at):
            fields = term.get("matchFields") if isinstance(term, Mapping) else None
            if isinstance(fields, list) and pin in fields:
                continue
            if isinstance(fields, list):
                ops.append({"op": "add", "path": json_pointer(*_TERMS, i, "matchFields", "-"), "value": pin})
            else:
                ops.append({"op": "add", "path": json_pointer(*_TERMS, i, "matchFields"), "value": [pin]})
        return ops
    value: Any = [{"matchFields": [pin]}]
    for key in reversed(_TERMS[depth + 1 :]):
        value = {key: value}
    ops.append({"op": "add", "path": json_pointer(*_TERMS[: depth + 1]), "value": value})
    return ops


def ungate_patch(pod: Mapping[str, Any], gate: str = GATE) -> list[JSON] | None:
    """JSON Patch removing only `gate` (a merge patch would drop other controllers' gates too); None when absent."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for i, g in enumerate(gates):
        if isinstance(g, Mapping) and g.get("name") == gate:
            path = json_pointer("spec", "schedulingGates", i)
            return [{"op": "test", "path": f"{path}/name", "value": gate}, {"op": "remove", "path": path}]
    return None


# ----------------------------------------------------------------------------------------- admission


def _generate_name(job: str, index: int) -> str:
    """The Job controller's `<job>-<index>-`, the job part cut so it fits 58 characters (5 are appended)."""
    suffix = f"-{index}-"
    return job[: 58 - len(suffix)] + suffix


def pod_for_dry_run(job: Mapping[str, Any], index: int) -> JSON:
    """The pod the Job controller would create for `index`, to create with dryRun=All so admission
    (LimitRange, injectors, PSA, quota) shows what kube-scheduler will see. The controller-uid labels and
    the ownerReference need the Job's uid, which does not exist yet: they are left out."""
    meta, spec = job["metadata"], job["spec"]
    if not 0 <= index < int(spec.get("completions") or 0):
        raise ValueError(f"index {index} is outside the Job's completions")
    name = str(meta["name"])
    template = copy.deepcopy(spec["template"])
    tmeta = template.get("metadata") or {}
    labels = {
        **(tmeta.get("labels") or {}),
        "batch.kubernetes.io/job-name": name,
        "job-name": name,
        INDEX_LABEL: str(index),
    }
    annotations = {**(tmeta.get("annotations") or {}), INDEX_LABEL: str(index)}
    pod_spec = template["spec"]
    pod_spec["hostname"] = f"{name}-{index}"
    for kind in ("initContainers", "containers"):
        for c in pod_spec.get(kind) or []:
            if not any(e.get("name") == INDEX_ENV for e in c.get("env") or []):
                c["env"] = [*(c.get("env") or []), {"name": INDEX_ENV, "valueFrom": copy.deepcopy(INDEX_FIELD)}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": _generate_name(name, index),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "finalizers": [TRACKING_FINALIZER],
        },
        "spec": pod_spec,
    }


def _cpu(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _bytes(n: int) -> str:
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _mig(shape: PodShape) -> str:
    return f"{shape.mig_count} x {shape.mig_profile}" if shape.mig_count else "none"


def _names(pod: Mapping[str, Any]) -> set[str]:
    spec = pod.get("spec") or {}
    return {str(c.get("name")) for kind in ("initContainers", "containers") for c in spec.get(kind) or []}


def admitted_shape_problem(
    admitted_pod: Mapping[str, Any], expected: PodShape, *, rendered: Mapping[str, Any] | None = None
) -> str | None:
    """What admission changed that the fit depends on (None: nothing). DRA requests live in the claim
    templates, which admission of the pod cannot change, so they are not compared. `rendered` (the pod
    sent to the dry run) lets the message name the containers admission added."""
    try:
        got = shape_from_pod(admitted_pod, claims=lambda _claim: ())
    except PodSpecError as e:
        return f"admission left a pod whose requests cannot be read: {e}"
    changes = [
        f"{what} {was} -> {now}"
        for what, was, now in (
            ("GPUs", str(expected.gpus), str(got.gpus)),
            (
                "GPU share (milli)",
                str(expected.gpu_milli if expected.gpus else "-"),
                str(got.gpu_milli if got.gpus else "-"),
            ),
            ("MIG", _mig(expected), _mig(got)),
            ("cpu", _cpu(expected.cpu_milli), _cpu(got.cpu_milli)),
            ("memory", _bytes(expected.memory), _bytes(got.memory)),
        )
        if was != now
    ]
    want, have = dict(expected.extended), dict(got.extended)
    changes += [
        f"{name} {want.get(name, 0)} -> {have.get(name, 0)}"
        for name in sorted(want.keys() | have.keys())
        if want.get(name, 0) != have.get(name, 0)
    ]
    if not changes:
        return None
    hint = ""
    added = sorted(_names(admitted_pod) - _names(rendered)) if rendered is not None else []
    if added:
        hint = f" (containers added by admission: {', '.join(added)})"
    elif got.cpu_milli > expected.cpu_milli or got.memory > expected.memory:
        hint = " (a sidecar injector or a LimitRange default?)"
    return "admission changed the pod's requests: " + ", ".join(changes) + hint
