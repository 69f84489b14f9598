"""What the extender remembers of a bound pod: its identity and gang membership (the core counts its resources).

A gang pod is pinned to its node by the agent with a `metadata.name` field requirement appended to
every required node-selector term (legal on a gated pod: it narrows). `pinned_node` reads that pin;
the extender's filter and the agent's start check both use it, so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.config import ExtenderConfig
from placement.podspec import holds_resources

__all__ = ["PodRecord", "GangRef", "pod_record", "gang_of", "pinned_node", "POD_SET_LABEL", "INDEX_LABEL"]

POD_SET_LABEL = "tandem.dev/pod-set"
"""Pod label naming the gang's pod set (one Indexed Job per pod set)."""
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""Label the Job controller sets on each pod of an Indexed Job: the replica index."""


@dataclass(frozen=True, slots=True)
class GangRef:
    """A gang pod's identity and the node it was pinned to (None when not pinned yet)."""

    job: str
    attempt: str
    node: str | None
    pod_set: str = ""
    index: int | None = None


def _terms(pod: Mapping[str, Any]) -> list[Any] | None:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    return terms if isinstance(terms, list) and terms else None


def pinned_node(pod: Mapping[str, Any]) -> str | None:
    """The node a pod is pinned to: every required node-selector term holds a `metadata.name In [node]`
    field requirement naming the same single node (terms are ORed, so all must narrow to it)."""
    terms = _terms(pod)
    if terms is None:
        return None
    pinned: str | None = None
    for term in terms:
        found: str | None = None
        fields = term.get("matchFields") if isinstance(term, Mapping) else None
        for req in fields if isinstance(fields, list) else ():
            if not isinstance(req, Mapping) or req.get("key") != "metadata.name" or req.get("operator") != "In":
                continue
            values = req.get("values")
            if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
                found = values[0]
        if found is None or (pinned is not None and found != pinned):
            return None
        pinned = found
    return pinned


def gang_of(pod: Mapping[str, Any], config: ExtenderConfig) -> GangRef | None:
    """The gang a pod belongs to (labels `tandem.dev/job` / `tandem.dev/attempt`), with the node the
    agent pinned it to (`pinned_node`), its pod set and its replica index when labelled."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, Mapping):
        return None
    job = labels.get(config.gang_job_label)
    if not isinstance(job, str) or not job:
        return None
    attempt = str(labels.get(config.gang_attempt_label, ""))
    raw_index = labels.get(INDEX_LABEL)
    index = int(raw_index) if isinstance(raw_index, str) and raw_index.isascii() and raw_index.isdigit() else None
    return GangRef(job, attempt, pinned_node(pod), str(labels.get(POD_SET_LABEL, "")), index)


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
