"""An attempt as the cluster holds it: the order rebuilt from its Jobs, and its rendezvous address (pure).

After an agent restart the broker's Dispatch is gone from memory, but every Job the agent created carries
its pod set, count, per-index nodes, start deadline, framework and dispatch id: enough to keep pinning,
starting and reporting the attempt exactly as before.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from extender.agent.config import AgentConfig
from extender.agent.model import AttemptKey, NodeCount, Order, PodSetOrder
from extender.agent.podtemplate import rendezvous_host
from extender.agent.render import (
    ASSIGNMENT_ANNOTATION,
    DEADLINE_ANNOTATION,
    DISPATCH_ANNOTATION,
    FRAMEWORK_ANNOTATION,
    POD_SET_INDEX_ANNOTATION,
)
from extender.podreq import POD_SET_LABEL
from placement.model import PodShape

__all__ = ["order_from_jobs", "rendezvous_address", "runs_of"]


def runs_of(nodes: Iterable[str]) -> tuple[NodeCount, ...]:
    """Per-index nodes as contiguous runs (the Dispatch's form)."""
    out: list[NodeCount] = []
    for n in nodes:
        if out and out[-1].node == n:
            out[-1] = NodeCount(n, out[-1].replicas + 1)
        else:
            out.append(NodeCount(n, 1))
    return tuple(out)


def _time(text: str) -> float:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def order_from_jobs(key: AttemptKey, jobs: Iterable[Mapping[str, Any]], config: AgentConfig) -> Order | None:
    """The order of an attempt whose Dispatch this process never saw; None without the agent's annotations."""
    pod_sets: list[tuple[int, PodSetOrder]] = []
    deadline, framework, port, dispatch_id, order_pos = 0.0, "PLAIN", 29400, "", 0
    for job in jobs:
        meta = job.get("metadata") or {}
        ann = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        try:
            nodes = orjson.loads(ann.get(ASSIGNMENT_ANNOTATION, "null"))
        except orjson.JSONDecodeError:
            return None
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            return None
        name = str(labels.get(POD_SET_LABEL, ""))
        template = (job.get("spec") or {}).get("template") or {}
        position = int(ann.get(POD_SET_INDEX_ANNOTATION, order_pos) or 0)
        order_pos += 1
        pod_sets.append((position, PodSetOrder(name, len(nodes), PodShape(), template, runs_of(nodes))))
        deadline = _time(str(ann.get(DEADLINE_ANNOTATION, ""))) or deadline
        fw, _, p = str(ann.get(FRAMEWORK_ANNOTATION, "")).partition(":")
        framework, port = fw or framework, int(p) if p.isascii() and p.isdigit() else port
        dispatch_id = str(ann.get(DISPATCH_ANNOTATION, "")) or dispatch_id
    if not pod_sets:
        return None
    pod_sets.sort(key=lambda ps: ps[0])
    return Order(
        job_id=key[0],
        attempt=key[1],
        tenant="",
        pod_sets=tuple(ps for _, ps in pod_sets),
        framework=framework,
        rendezvous_port=port,
        start_deadline=deadline,
        dispatch_id=dispatch_id,
    )


def rendezvous_address(order: Order) -> str:
    """`<replica 0 of the first pod set>.<service>:<port>` (the pods' DNS search path adds the rest)."""
    return f"{rendezvous_host(order)}:{order.rendezvous_port}"
