"""Per cluster the latest inventory its agent reported, the reservations on it, and whether it may be used now."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetplan.arrays import ClusterArrays, Fleet
from placement import overlay as core_overlay
from placement.allocation import allocate
from placement.errors import CapacityError
from placement.model import Node, PodShape

__all__ = [
    "ReplicaPlacement",
    "Level",
    "ClusterMeta",
    "InventoryReport",
    "ReservedReplica",
    "Reservation",
    "Usability",
    "ClusterEntry",
    "Catalog",
]

AttemptKey = tuple[str, int]
ReplicaKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Level:
    """One topology level of a cluster: its short name (e.g. "rack") and node label key."""

    name: str
    key: str


@dataclass(frozen=True, slots=True)
class ClusterMeta:
    name: str
    region: str = ""
    role: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    levels: tuple[Level, ...] = ()
    log_templates: tuple[tuple[str, str], ...] = ()
    """(name, URL template) pairs from Hello, for GetJob's log links."""
    read_only: bool = False
    """The agent creates nothing (Hello capabilities.dispatch = false): listed, never placed on."""
    tenants: frozenset[str] | None = None
    """Tenants the cluster's own configuration maps to a namespace (Hello); None = not said (any)."""


@dataclass(frozen=True, slots=True)
class InventoryReport:
    """A snapshot (`full`) or delta from an agent, already converted from protobuf.

    bound: per reservation (job, attempt) the replicas (pod set, index) the cluster shows bound.
    """

    cluster: str
    sequence: int
    full: bool
    observed_at: float
    nodes: tuple[Node, ...] = ()
    removed: tuple[str, ...] = ()
    bound: Mapping[AttemptKey, frozenset[ReplicaKey]] = field(default_factory=dict)
    base_sequence: int = 0
    meta: ClusterMeta | None = None


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Replica ``index`` of pod set ``pod_set`` goes on ``node``."""

    pod_set: str
    index: int
    node: str


@dataclass(frozen=True, slots=True)
class ReservedReplica:
    pod_set: str
    index: int
    node: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """The broker's own record of what one attempt holds on a cluster until its pods are bound: the core's
    reservation (`placement.overlay.Reservation`, counts per pod set and node, as the cluster holds it) kept
    replica by replica, so that binding is followed per replica across reports (`on_node` gives the core's)."""

    job_id: str
    attempt: int
    cluster: str
    replicas: tuple[ReservedReplica, ...]
    shapes: Mapping[str, PodShape]
    gpu_model: str = ""

    @property
    def key(self) -> AttemptKey:
        return (self.job_id, self.attempt)

    def on_node(
        self, node: str, bound: frozenset[ReplicaKey]
    ) -> tuple[core_overlay.Reservation, core_overlay.BoundReplicas]:
        """The core's reservation of what this attempt holds on `node`, and how many of those replicas the
        cluster reports bound (`bound`: (pod set, index) pairs), for `placement.overlay.effective_nodes`."""
        held: dict[str, int] = {}
        done: dict[tuple[str, str], int] = {}
        for r in self.replicas:
            if r.node == node:
                held[r.pod_set] = held.get(r.pod_set, 0) + 1
                if (r.pod_set, r.index) in bound:
                    done[(r.pod_set, node)] = done.get((r.pod_set, node), 0) + 1
        parts = tuple(core_overlay.ReservedPart(ps, node, k, self.shapes[ps]) for ps, k in held.items())
        return (
            core_overlay.Reservation(self.job_id, self.attempt, parts),
            core_overlay.BoundReplicas(self.job_id, self.attempt, done),
        )


class Usability(enum.Enum):
    """Whether the placer may put new work on a cluster; anything but USABLE excludes it."""

    USABLE = "Usable"
    NO_SNAPSHOT = "NoSnapshot"
    DISCONNECTED = "Disconnected"
    STALE = "Stale"
    CORDONED = "Cordoned"
    READ_ONLY = "ReadOnly"


@dataclass
class ClusterEntry:
    """Mutable live state of one cluster (the catalog's cache; the placer reads snapshots of it)."""

    name: str
    meta: ClusterMeta
    connected: bool = False
    cordoned: bool = False
    sequence: int = 0
    has_snapshot: bool = False
    last_seen: float = 0.0
    last_report: float = 0.0
    disconnected_at: float | None = None
    nodes: dict[str, Node] = field(default_factory=dict)
    bound: dict[AttemptKey, frozenset[ReplicaKey]] = field(default_factory=dict)
    excluded_nodes: set[str] = field(default_factory=set)
    arrays: ClusterArrays | None = None
    empty: ClusterArrays | None = None
    leader_epoch: int = 0
    """Highest agent leader epoch seen from this cluster (a lower one is a deposed leader)."""
    overlaid: dict[str, Node] = field(default_factory=dict)
    """Memo of nodes after the reservations overlay; a node's entry goes when its reservations or report change."""
    """The same nodes with everything free (never-fit check); rebuilt when the node set changes."""

    def usability(self, now: float, stale_after_s: float) -> Usability:
        if self.cordoned:
            return Usability.CORDONED
        if self.meta.read_only:
            return Usability.READ_ONLY
        if not self.connected:
            return Usability.DISCONNECTED if self.has_snapshot else Usability.NO_SNAPSHOT
        if not self.has_snapshot:
            return Usability.NO_SNAPSHOT
        if now - self.last_seen > stale_after_s:
            return Usability.STALE
        return Usability.USABLE

    def silent_for(self, now: float) -> float:
        return now - self.last_seen


def empty_node(node: Node) -> Node:
    """A node with every healthy GPU, CPU, memory and pod slot free."""
    gpus = tuple(
        dataclasses.replace(g, milli_used=0, mig=tuple(dataclasses.replace(m, used=False) for m in g.mig))
        for g in node.gpus
    )
    return dataclasses.replace(
        node,
        gpus=gpus,
        cpu_milli_free=max(node.cpu_milli_allocatable, node.cpu_milli_free),
        memory_free=max(node.memory_allocatable, node.memory_free),
        pods_free=max(node.pods_free, 110),
        ready=True,
        cordoned=False,
    )


class DeltaGap(Exception):
    """A delta's base is not the latest report: the broker must ask for a resync."""


class Catalog:
    """Live inventory of every cluster plus the broker's reservations, feeding the numpy fleet."""

    def __init__(self, *, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self.clusters: dict[str, ClusterEntry] = {}
        self.reservations: dict[AttemptKey, Reservation] = {}
        self._by_cluster: dict[str, dict[AttemptKey, Reservation]] = {}
        self._by_job: dict[str, set[AttemptKey]] = {}
        self._by_node: dict[tuple[str, str], set[AttemptKey]] = {}
        self.fleet = Fleet()
        self.generation = 0
        """Bumped by every change a placement view reads (see fleetplan.view: a view of an older one is stale)."""

    # ---------------------------------------------------------------- connections

    def connect(self, meta: ClusterMeta, now: float) -> ClusterEntry:
        """A cluster's stream opened: nothing is placed there until its snapshot arrives."""
        self.generation += 1
        entry = self.clusters.get(meta.name)
        if entry is None:
            entry = ClusterEntry(meta.name, meta)
            self.clusters[meta.name] = entry
        entry.meta = meta
        entry.connected = True
        entry.has_snapshot = False
        entry.disconnected_at = None
        entry.last_seen = now
        return entry

    def disconnect(self, cluster: str, now: float) -> None:
        entry = self.clusters.get(cluster)
        if entry is not None and entry.connected:
            self.generation += 1
            entry.connected = False
            entry.disconnected_at = now
            self.fleet.set_usable(cluster, False)

    def heartbeat(self, cluster: str, now: float) -> None:
        entry = self.clusters.get(cluster)
        if entry is not None:
            entry.last_seen = now

    def set_cordoned(self, cluster: str, cordoned: bool) -> ClusterEntry:
        self.generation += 1
        entry = self.clusters.get(cluster)
        if entry is None:
            entry = ClusterEntry(cluster, ClusterMeta(cluster))
            self.clusters[cluster] = entry
        entry.cordoned = cordoned
        return entry

    # ---------------------------------------------------------------- reports

    def apply_report(self, report: InventoryReport, now: float) -> ClusterEntry:
        """Apply a snapshot or delta; a newer report lifts rejection exclusions (raises DeltaGap)."""
        self.generation += 1
        entry = self.clusters.get(report.cluster)
        if entry is None:
            entry = self.connect(report.meta or ClusterMeta(report.cluster), now)
        if report.meta is not None:
            entry.meta = report.meta
        if report.full:
            entry.nodes = {n.name: n for n in report.nodes}
            entry.has_snapshot = True
            entry.arrays = None
        else:
            if not entry.has_snapshot or report.base_sequence != entry.sequence:
                raise DeltaGap(f"delta base {report.base_sequence} != latest {entry.sequence}")
            for name in report.removed:
                entry.nodes.pop(name, None)
            for node in report.nodes:
                entry.nodes[node.name] = node
        entry.sequence = report.sequence
        entry.bound = dict(report.bound)
        entry.overlaid.clear()
        entry.excluded_nodes.clear()
        entry.last_seen = now
        entry.last_report = now
        self._refresh_arrays(entry, report)
        return entry

    def exclude_nodes(self, cluster: str, nodes: Iterable[str]) -> None:
        """Nodes a rejected dispatch named stay out of placement until the cluster's next report."""
        self.generation += 1
        entry = self.clusters.get(cluster)
        if entry is None:
            return
        entry.excluded_nodes.update(nodes)
        if entry.arrays is not None:
            entry.arrays.set_excluded(entry.excluded_nodes)
            self.fleet.refresh_summary(cluster)

    # ---------------------------------------------------------------- reservations

    def add_reservation(self, res: Reservation) -> None:
        """Hold a reservation in the overlay (incrementally: only its own replicas are touched)."""
        self.generation += 1
        if res.key in self.reservations:
            self.drop_reservation(res.key)
        self.reservations[res.key] = res
        self._by_cluster.setdefault(res.cluster, {})[res.key] = res
        self._by_job.setdefault(res.job_id, set()).add(res.key)
        for r in res.replicas:
            self._by_node.setdefault((res.cluster, r.node), set()).add(res.key)
        self._shift(res, +1)

    def drop_reservation(self, key: AttemptKey) -> None:
        res = self.reservations.pop(key, None)
        if res is None:
            return
        self.generation += 1
        self._by_cluster.get(res.cluster, {}).pop(key, None)
        keys = self._by_job.get(res.job_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_job[res.job_id]
        for r in res.replicas:
            held = self._by_node.get((res.cluster, r.node))
            if held is not None:
                held.discard(key)
                if not held:
                    del self._by_node[(res.cluster, r.node)]
        self._shift(res, -1)

    def reservations_of_job(self, job_id: str) -> list[AttemptKey]:
        return sorted(self._by_job.get(job_id, ()))

    def reservation_count(self, cluster: str) -> int:
        return len(self._by_cluster.get(cluster, ()))

    def reservations_touching(self, cluster: str, nodes: Iterable[str]) -> list[Reservation]:
        keys: set[AttemptKey] = set()
        for n in nodes:
            keys |= self._by_node.get((cluster, n), set())
        return [self.reservations[k] for k in sorted(keys)]

    def _unbound(self, res: Reservation) -> list[tuple[Reservation, ReservedReplica]]:
        entry = self.clusters.get(res.cluster)
        done = entry.bound.get(res.key, frozenset()) if entry else frozenset()
        return [(res, r) for r in res.replicas if (r.pod_set, r.index) not in done]

    def _shift(self, res: Reservation, sign: int) -> None:
        entry = self.clusters.get(res.cluster)
        if entry is None:
            return
        for res_, r in self._unbound(res):
            cached = entry.overlaid.get(r.node)
            if cached is None:
                continue
            if sign < 0:
                del entry.overlaid[r.node]
                continue
            try:  # a new hold: take it from the memoised overlaid node, as the overlay itself would
                entry.overlaid[r.node], _ = allocate(cached, res_.shapes[r.pod_set], 1)
            except CapacityError:
                del entry.overlaid[r.node]
        if entry.arrays is None:
            return
        entry.arrays.add_pending(self._unbound(res), sign)
        self.fleet.refresh_summary(res.cluster)

    def pending_replicas(self, cluster: str) -> list[tuple[Reservation, ReservedReplica]]:
        """Reserved replicas the cluster's latest report does not show bound yet (the overlay's input)."""
        out: list[tuple[Reservation, ReservedReplica]] = []
        for res in self._by_cluster.get(cluster, {}).values():
            out.extend(self._unbound(res))
        return out

    # ---------------------------------------------------------------- views

    def usable(self, now: float) -> list[ClusterEntry]:
        return [e for e in self.clusters.values() if e.usability(now, self.stale_after_s) is Usability.USABLE]

    def sweep(self, now: float) -> None:
        """Mark clusters silent past the bound as unusable in the fleet arrays."""
        self.generation += 1
        for entry in self.clusters.values():
            usable = entry.usability(now, self.stale_after_s) is Usability.USABLE
            self.fleet.set_usable(entry.name, usable)

    def _refresh_arrays(self, entry: ClusterEntry, report: InventoryReport) -> None:
        levels = tuple(l.key for l in entry.meta.levels)
        arrays = entry.arrays
        if arrays is None or report.full or not arrays.try_update(report.nodes, report.removed):
            arrays = ClusterArrays.build(entry.nodes.values(), levels, self.fleet.models)
            entry.arrays = arrays
            entry.empty = None
        self.fleet.put(entry.name, arrays)
        self._reapply_overlay(entry.name)
        self.fleet.set_usable(entry.name, entry.usability(entry.last_seen, self.stale_after_s) is Usability.USABLE)

    def overlaid_nodes(self, cluster: str, rows: Sequence[int]) -> list[Node]:
        """Nodes of `rows` minus reserved-but-unbound replicas: the core's reservations overlay, memoised per node."""
        entry = self.clusters[cluster]
        arrays = entry.arrays
        assert arrays is not None
        out: list[Node] = []
        for r in rows:
            node = arrays.nodes[r]
            done = entry.overlaid.get(node.name)
            if done is None:
                done = self._overlay_one(entry, node)
                entry.overlaid[node.name] = done
            out.append(done)
        return out

    def _overlay_one(self, entry: ClusterEntry, node: Node) -> Node:
        touching = self.reservations_touching(entry.name, (node.name,))
        if not touching:
            return node
        held = [res.on_node(node.name, entry.bound.get(res.key, frozenset())) for res in touching]
        report = core_overlay.ReportedNodes(entry.name, entry.sequence, (node,), tuple(b for _, b in held))
        return core_overlay.effective_nodes(report, [r for r, _ in held])[0]

    def empty_arrays(self, entry: ClusterEntry) -> ClusterArrays:
        """The cluster as if nothing ran on it: what never-fit checks use."""
        if entry.empty is None:
            levels = tuple(l.key for l in entry.meta.levels)
            entry.empty = ClusterArrays.build((empty_node(n) for n in entry.nodes.values()), levels, self.fleet.models)
        return entry.empty

    def _reapply_overlay(self, cluster: str) -> None:
        entry = self.clusters.get(cluster)
        if entry is None or entry.arrays is None:
            return
        entry.arrays.set_pending(self.pending_replicas(cluster))
        entry.arrays.set_excluded(entry.excluded_nodes)
        self.fleet.refresh_summary(cluster)
