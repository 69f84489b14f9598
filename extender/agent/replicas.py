"""One replica read from its pod as the API server returns it: phase, exit, reason and times (pure raw-JSON readers)."""

from __future__ import annotations

import datetime as dt
import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.agent.config import AgentConfig
from extender.agent.model import Order
from extender.agent.podtemplate import GATE
from extender.podreq import INDEX_LABEL, POD_SET_LABEL

__all__ = [
    "ReplicaPhase",
    "ReplicaView",
    "is_gated",
    "replica_of",
    "replica_views",
    "parse_time",
    "truncate",
    "MESSAGE_LIMIT",
]

Pod = Mapping[str, Any]
MESSAGE_LIMIT = 1024
"""Bytes of a replica message (the container termination message can be 4 KiB)."""


class ReplicaPhase(enum.StrEnum):
    """tandem.v1.ReplicaPhase names without the prefix."""

    ABSENT = "ABSENT"
    GATED = "GATED"
    PENDING = "PENDING"
    BOUND = "BOUND"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, slots=True)
class ReplicaView:
    pod_set: str
    index: int
    pod: str = ""
    node: str = ""
    phase: ReplicaPhase = ReplicaPhase.ABSENT
    exit_code: int | None = None
    """Of the main containers (a failed regular init container's when the pod failed there); never a sidecar's."""
    reason: str = ""
    message: str = ""
    start_time: float | None = None
    finish_time: float | None = None
    restarts: int = 0


def parse_time(text: Any) -> float | None:
    """metav1.Time / MicroTime -> epoch seconds (None when absent or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def truncate(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """At most `limit` UTF-8 bytes, never cutting a character in two."""
    raw = text.encode()
    return text if len(raw) <= limit else raw[:limit].decode(errors="ignore")


def _meta(pod: Pod) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _spec(pod: Pod) -> Mapping[str, Any]:
    return pod.get("spec") or {}


def _status(pod: Pod) -> Mapping[str, Any]:
    return pod.get("status") or {}


def _condition(obj: Pod, kind: str) -> Mapping[str, Any] | None:
    conditions: list[Mapping[str, Any]] = _status(obj).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def _true(obj: Pod, kind: str) -> Mapping[str, Any] | None:
    c = _condition(obj, kind)
    return c if c is not None and c.get("status") == "True" else None


def is_gated(pod: Pod) -> bool:
    """The pod still carries Tandem's gate."""
    return any(g.get("name") == GATE for g in _spec(pod).get("schedulingGates") or [])


def replica_of(pod: Pod) -> tuple[str, int] | None:
    """(pod set, index) from the labels the renderer and the Job controller set."""
    labels = _meta(pod).get("labels") or {}
    raw = labels.get(INDEX_LABEL) or (_meta(pod).get("annotations") or {}).get(INDEX_LABEL)
    pod_set = labels.get(POD_SET_LABEL)
    if not isinstance(pod_set, str) or not isinstance(raw, str) or not (raw.isascii() and raw.isdigit()):
        return None
    return pod_set, int(raw)


def _containers(pod: Pod) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(statuses of spec.containers, statuses of regular init containers); native sidecars left out."""
    sidecars = {c.get("name") for c in _spec(pod).get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    st = _status(pod)
    init = [s for s in st.get("initContainerStatuses") or [] if s.get("name") not in sidecars]
    return list(st.get("containerStatuses") or []), init


def _pick(pods: list[Pod]) -> Pod:
    """One pod per index: the live one (no deletionTimestamp, not finished) when there is one, else the
    most recently created; ties by name. (A replacement and its terminating predecessor, or a leftover.)"""

    def key(p: Pod) -> tuple[int, float, str]:
        live = not _meta(p).get("deletionTimestamp") and _status(p).get("phase") not in ("Succeeded", "Failed")
        return (0 if live else 1, -(parse_time(_meta(p).get("creationTimestamp")) or 0.0), str(_meta(p).get("name")))

    return min(pods, key=key)


def _by_replica(order: Order, pods: Iterable[Pod], config: AgentConfig | None) -> dict[tuple[str, int], list[Pod]]:
    """The attempt's pods per replica; other attempts' pods (by label, when `config` names them) and indexes
    outside the order are left out."""
    counts = {ps.name: ps.count for ps in order.pod_sets}
    out: dict[tuple[str, int], list[Pod]] = {}
    for pod in pods:
        labels = _meta(pod).get("labels") or {}
        key = replica_of(pod)
        if key is None or key[1] >= counts.get(key[0], 0):
            continue
        if config is not None and (
            labels.get(config.extender.gang_job_label) != order.job_id
            or labels.get(config.extender.gang_attempt_label) != str(order.attempt)
        ):
            continue
        out.setdefault(key, []).append(pod)
    return out


@dataclass(frozen=True, slots=True)
class _Exit:
    code: int
    reason: str
    message: str
    container: str
    finished: float | None


def _terminated(statuses: list[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(str(s.get("name", "")), t) for s in statuses if (t := (s.get("state") or {}).get("terminated"))]


def _exit(pod: Pod) -> _Exit | None:
    """The earliest failing main container, else a failed regular init container, else exit 0 once every
    main container terminated; None before. Ties go to spec order."""
    main, init = _containers(pod)
    for statuses in (main, init):
        failed = [(name, t) for name, t in _terminated(statuses) if t.get("exitCode")]
        if failed:
            name, t = min(failed, key=lambda f: parse_time(f[1].get("finishedAt")) or math.inf)
            return _Exit(
                int(t["exitCode"]),
                str(t.get("reason", "")),
                str(t.get("message", "")),
                name,
                parse_time(t.get("finishedAt")),
            )
    done = _terminated(main)
    if main and len(done) == len(main):
        finished = [f for _, t in done if (f := parse_time(t.get("finishedAt"))) is not None]
        return _Exit(0, str(done[0][1].get("reason", "Completed")), "", done[0][0], max(finished, default=None))
    return None


def _waiting(pod: Pod, only: frozenset[str] | None = None) -> tuple[str, str, str] | None:
    """(reason, message, container) of the first waiting container (init containers first), optionally only
    for the given reasons."""
    st = _status(pod)
    for s in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        w = (s.get("state") or {}).get("waiting") or {}
        if w.get("reason") and (only is None or w["reason"] in only):
            return str(w["reason"]), str(w.get("message", "")), str(s.get("name", ""))
    return None


def _phase(pod: Pod) -> ReplicaPhase:
    phase = _status(pod).get("phase")
    if phase in ("Running", "Succeeded", "Failed", "Unknown"):
        return ReplicaPhase(str(phase).upper())
    if is_gated(pod):
        return ReplicaPhase.GATED
    return ReplicaPhase.BOUND if _spec(pod).get("nodeName") else ReplicaPhase.PENDING


def _why(pod: Pod, phase: ReplicaPhase, ended: _Exit | None) -> tuple[str, str]:
    """The replica's (reason, message): the pod's own, a disruption, the exit, a waiting container, or
    kube-scheduler's verdict, whichever comes first."""
    st = _status(pod)
    if st.get("reason"):
        return str(st["reason"]), str(st.get("message") or "")
    disruption, waiting, scheduled = _true(pod, "DisruptionTarget"), _waiting(pod), _condition(pod, "PodScheduled")
    if disruption is not None:
        return str(disruption.get("reason", "")), str(disruption.get("message", ""))
    if ended is not None and (ended.code or phase is ReplicaPhase.SUCCEEDED):
        return ended.reason, ended.message
    if waiting is not None:
        return waiting[0], waiting[1]
    if scheduled is not None and scheduled.get("status") == "False":
        return str(scheduled.get("reason", "")), str(scheduled.get("message", ""))
    return "", ""


def _replica_view(pod_set: str, index: int, pod: Pod | None) -> ReplicaView:
    if pod is None:
        return ReplicaView(pod_set, index)
    phase, ended = _phase(pod), _exit(pod)
    main, _ = _containers(pod)
    reason, message = _why(pod, phase, ended)
    starts = [
        t
        for s in main
        for k in ("running", "terminated")
        if (t := parse_time(((s.get("state") or {}).get(k) or {}).get("startedAt"))) is not None
    ]
    finish = None
    if phase in (ReplicaPhase.SUCCEEDED, ReplicaPhase.FAILED):
        changes = [t for c in _status(pod).get("conditions") or [] if (t := parse_time(c.get("lastTransitionTime")))]
        finish = (ended.finished if ended else None) or max(changes, default=None)
    return ReplicaView(
        pod_set,
        index,
        str(_meta(pod).get("name", "")),
        str(_spec(pod).get("nodeName") or ""),
        phase,
        ended.code if ended else None,
        reason,
        truncate(message),
        min(starts, default=None),
        finish,
        sum(int(s.get("restartCount") or 0) for s in main),
    )


def replica_views(order: Order, pods: Iterable[Pod], config: AgentConfig) -> tuple[ReplicaView, ...]:
    """Every expected replica in pod set and index order, ABSENT where no pod exists."""
    found = _by_replica(order, pods, config)
    return tuple(
        _replica_view(ps.name, i, _pick(found[(ps.name, i)]) if (ps.name, i) in found else None)
        for ps in order.pod_sets
        for i in range(ps.count)
    )
