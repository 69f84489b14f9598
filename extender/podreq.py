"""What the extender remembers of a bound pod: its identity and gang membership (the core counts its resources)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.config import ExtenderConfig
from placement.podspec import holds_resources

__all__ = ["PodRecord", "GangRef", "pod_record", "gang_of"]


@dataclass(frozen=True, slots=True)
class GangRef:
    """A gang pod's identity and the node it was pinned to (None when not pinned yet)."""

    job: str
    attempt: str
    node: str | None


def gang_of(pod: Mapping[str, Any], config: ExtenderConfig) -> GangRef | None:
    """The gang a pod belongs to (labels `tandem.dev/job` / `tandem.dev/attempt`), pinned by a
    `kubernetes.io/hostname` nodeSelector once the agent has assigned it."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    job = labels.get(config.gang_job_label) if isinstance(labels, Mapping) else None
    if not isinstance(job, str) or not job:
        return None
    attempt = str(labels.get(config.gang_attempt_label, ""))
    sel = (pod.get("spec") or {}).get("nodeSelector") or {}
    node = sel.get(config.topology.hostname) if isinstance(sel, Mapping) else None
    return GangRef(job, attempt, node if isinstance(node, str) else None)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod that holds resources on `node` (bound, not finished)."""

    uid: str
    namespace: str
    name: str
    node: str
    gang: GangRef | None
    running: bool


def pod_record(pod: Mapping[str, Any], config: ExtenderConfig) -> PodRecord | None:
    """The record of a pod that holds resources, None for pods that hold nothing."""
    if not holds_resources(pod):
        return None
    meta = pod.get("metadata") or {}
    return PodRecord(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=str(pod["spec"]["nodeName"]),
        gang=gang_of(pod, config),
        running=(pod.get("status") or {}).get("phase") == "Running",
    )
