"""Per-node facts precomputed once per node change, so a request only looks them up.

A NodeFacts wraps the core `Node` (built by placement.inventory from the raw objects) with what
the hot path needs besides: pre-serialised JSON fragments, the gang reservations still held on the
node, and the identity of the pods bound there. It is rebuilt only when its node, a pod bound to
it, its ResourceSlices, a claim allocated on it or a reservation naming it changes; its object
identity is the memo token of per-shape verdicts, so unchanged nodes keep them across versions.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender.config import ExtenderConfig
from extender.podreq import PodRecord
from extender.reservations import HeldReservation, domain_label
from placement.dra import DraEvaluator
from placement.inventory import node_from_k8s
from placement.model import Node, PodShape, TopologyLevels
from placement.overlay import subtract_held

__all__ = ["Hold", "NodeFacts", "build_facts", "DeviceKey", "levels_of", "fit_signature"]

DeviceKey = tuple[str, str, str]
"""(driver, pool, device), as in a claim's allocation results."""


@dataclass(frozen=True, slots=True)
class Hold:
    """What one gang reservation still holds on one node: `replicas` not yet bound, each `shape`."""

    job: str
    attempt: str
    replicas: int
    shape: PodShape
    domain: str

    @property
    def gang(self) -> tuple[str, str]:
        return (self.job, self.attempt)

    def describe(self) -> str:
        where = f" in {domain_label(self.domain)}" if self.domain else ""
        per = (
            f"{self.shape.gpus} GPU(s)"
            if self.shape.gpus
            else (f"{self.shape.mig_count} MIG {self.shape.mig_profile}" if self.shape.mig_profile else "CPU/memory")
        )
        return f"{self.replicas} replica(s) x {per} for gang {self.job} (attempt {self.attempt}){where}"


@dataclass(frozen=True, slots=True, eq=False)
class NodeFacts:
    """One node as the hot path sees it. `node` has the usage of bound pods already subtracted."""

    node: Node
    name: str
    name_json: bytes
    host_prefix: bytes
    holds: tuple[Hold, ...]
    pods: tuple[PodRecord, ...]
    sig_id: int = -1
    """Id of everything the core's fit reads from the node except its name and labels (-1: the
    node has DRA devices or held reservations and is always checked on its own)."""
    _effective: dict[tuple[str, str] | None, Node] = field(default_factory=dict, repr=False)

    def effective(self, exempt: tuple[str, str] | None, dra: DraEvaluator) -> Node:
        """The node minus every hold except the `exempt` gang's own (computed once per gang)."""
        hit = self._effective.get(exempt)
        if hit is not None:
            return hit
        node = self.node
        for h in self.holds:
            if h.gang != exempt:
                node, _, _ = subtract_held(node, h.shape, h.replicas, dra)
        self._effective[exempt] = node
        return node


def fit_signature(node: Node) -> tuple[object, ...]:
    """What `placement.fit.capacity` reads from a node besides its name and labels: two nodes with
    the same signature and the same values of the labels a shape selects on get the same verdict."""
    return (
        node.taints,
        node.ready,
        node.cordoned,
        node.cpu_milli_allocatable,
        node.cpu_milli_free,
        node.memory_allocatable,
        node.memory_free,
        node.pods_free,
        node.gpus,
        tuple(sorted(node.extended_free.items())),
    )


def levels_of(config: ExtenderConfig) -> TopologyLevels:
    return TopologyLevels(config.topology.keys)


def build_facts(
    node_obj: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    records: Iterable[PodRecord],
    slices: Iterable[Mapping[str, Any]],
    allocated: frozenset[DeviceKey],
    reservations: Iterable[HeldReservation],
    config: ExtenderConfig,
    sig_ids: dict[tuple[object, ...], int] | None = None,
) -> NodeFacts:
    """Facts of one node from its object, the raw pods bound to it, their records, its
    ResourceSlices, the allocated DRA devices and the reservations naming it."""
    node = node_from_k8s(node_obj, pods, slices, allocated, levels_of(config))
    name = node.name
    records = tuple(records)
    bound: dict[tuple[str, str, str], int] = {}  # (job, attempt, pod set) -> replicas bound here; "" = any
    for p in records:
        if p.gang is not None:
            for ps in {p.gang.pod_set, ""}:
                g = (p.gang.job, p.gang.attempt, ps)
                bound[g] = bound.get(g, 0) + 1
    holds = []
    for r in reservations:
        for part in r.reservation.parts:
            if part.node != name:
                continue
            left = part.replicas - bound.get((r.job, r.attempt, part.pod_set), 0)
            if left > 0:
                holds.append(Hold(r.job, r.attempt, left, part.shape, r.domain))
    quoted = orjson.dumps(name)
    sig_id = -1
    if sig_ids is not None and not holds and not node.dra_devices:
        sig = fit_signature(node)
        sig_id = sig_ids.get(sig, -1)
        if sig_id < 0:
            sig_id = sig_ids[sig] = next(_SIG_COUNTER)
    return NodeFacts(
        node=node,
        name=name,
        name_json=quoted,
        host_prefix=b'{"Host":' + quoted + b',"Score":',
        holds=tuple(holds),
        pods=records,
        sig_id=sig_id,
    )


_SIG_COUNTER = itertools.count()  # ids never repeat, even after a caller clears its table
