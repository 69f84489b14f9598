"""How the Job controller stand-in names, labels and renders a Job's pods, and reads them back (pure).

Follows upstream's ``batch/v1`` Job controller: ``generateName: <job>-<index>-``, hostname
``<job>-<index>``, the completion index as label, annotation and ``JOB_COMPLETION_INDEX`` env,
the ``batch.kubernetes.io/job-tracking`` finalizer and a controller ownerReference.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "TRACKING_FINALIZER",
    "INDEX_KEY",
    "CONTROLLER_UID_LABEL",
    "JOB_NAME_LABEL",
    "render_pod",
    "generate_name",
    "completion_index",
    "format_intervals",
    "parse_intervals",
    "phase",
    "is_terminal",
    "is_terminating",
    "is_active",
    "is_ready",
    "has_finalizer",
    "format_time",
    "parse_time",
]

JSON = dict[str, Any]

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"
INDEX_ENV = "JOB_COMPLETION_INDEX"
MAX_GENERATED_NAME_LENGTH = 63 - 5  # names.MaxGeneratedNameLength: the server appends 5 random characters


def format_time(epoch_s: float) -> str:
    """RFC 3339 with second precision, as ``metav1.Time`` is written."""
    return datetime.datetime.fromtimestamp(int(epoch_s), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """``metav1.Time`` / ``MicroTime`` to epoch seconds."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def generate_name(job_name: str, index: int | None) -> str:
    """``podGenerateNameWithIndex``: ``<job>-<index>-``, the job part cut so the result fits 58 characters."""
    if index is None:
        prefix = f"{job_name}-"
        return prefix if len(prefix) <= MAX_GENERATED_NAME_LENGTH else prefix[:MAX_GENERATED_NAME_LENGTH]
    suffix = f"-{index}-"
    prefix = job_name + suffix
    if len(prefix) > MAX_GENERATED_NAME_LENGTH:
        prefix = prefix[: MAX_GENERATED_NAME_LENGTH - len(suffix)] + suffix
    return prefix


def _with_index_env(containers: Iterable[JSON]) -> list[JSON]:
    out = []
    for c in containers:
        c = dict(c)
        env = list(c.get("env") or [])
        if not any(e.get("name") == INDEX_ENV for e in env):
            env.append(
                {
                    "name": INDEX_ENV,
                    "valueFrom": {
                        "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}
                    },
                }
            )
        c["env"] = env
        out.append(c)
    return out


def render_pod(job: Mapping[str, Any], index: int | None) -> JSON:
    """The pod the Job controller creates for one completion index (None for NonIndexed Jobs)."""
    meta = job["metadata"]
    name, uid = str(meta["name"]), str(meta["uid"])
    template = copy.deepcopy(job["spec"]["template"])
    tmeta = template.get("metadata") or {}
    labels = dict(tmeta.get("labels") or {})
    for key, value in (
        (CONTROLLER_UID_LABEL, uid),
        (JOB_NAME_LABEL, name),
        (LEGACY_CONTROLLER_UID_LABEL, uid),
        (LEGACY_JOB_NAME_LABEL, name),
    ):
        labels.setdefault(key, value)
    annotations = dict(tmeta.get("annotations") or {})
    spec = dict(template.get("spec") or {})
    if index is not None:
        labels[INDEX_KEY] = str(index)
        annotations[INDEX_KEY] = str(index)
        spec["hostname"] = f"{name}-{index}"
        spec["containers"] = _with_index_env(spec.get("containers") or [])
        if spec.get("initContainers"):
            spec["initContainers"] = _with_index_env(spec["initContainers"])
    pod_meta: JSON = {
        "generateName": generate_name(name, index),
        "namespace": meta["namespace"],
        "labels": labels,
        "finalizers": [TRACKING_FINALIZER],
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if annotations:
        pod_meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def completion_index(pod: Mapping[str, Any]) -> int | None:
    """The pod's completion index from its annotation (label as fallback); None if absent or invalid."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(INDEX_KEY) or (meta.get("labels") or {}).get(INDEX_KEY)
    if raw is None or not (str(raw).isascii() and str(raw).isdigit()):
        return None
    return int(raw)


def format_intervals(indexes: Iterable[int]) -> str:
    """``orderedIntervals.String()``: ``"1,3-5,7,8"`` (a run of two is written with a comma)."""
    parts: list[str] = []
    ordered = sorted(set(indexes))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        first, last = ordered[i], ordered[j]
        if last == first:
            parts.append(str(first))
        elif last == first + 1:
            parts.append(f"{first},{last}")
        else:
            parts.append(f"{first}-{last}")
        i = j + 1
    return ",".join(parts)


def parse_intervals(text: str | None) -> set[int]:
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """Deleted but not yet in a terminal phase (``controller.IsPodTerminating``)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) and not is_terminal(pod)


def is_active(pod: Mapping[str, Any]) -> bool:
    """Neither finished nor being deleted (``controller.FilterActivePods``)."""
    return not is_terminal(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp")


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def has_finalizer(pod: Mapping[str, Any]) -> bool:
    return TRACKING_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])
