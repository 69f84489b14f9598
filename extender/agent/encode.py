"""The extender's inventory as `tandem.v1` inventory reports: the one extender -> proto encoder.

The agent reports exactly the facts the extender's own filter uses (`NodeFacts.node`, bound
pods' usage subtracted, reservation holds NOT subtracted: the broker applies its own overlay).
`broker.api.serde_inventory.node_from_proto` is the exact inverse of `node_inventory` for every
field of the core Node except labels, of which only the allow-listed keys travel.

Pure: no I/O, no event loop. Times come from the caller (`now`, seconds since the epoch).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf import timestamp_pb2

from extender.facts import NodeFacts
from placement.mig import family_of
from placement.model import (
    CLIQUE_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    HOSTNAME_LABEL,
    ZONE_LABEL,
    AttributeValue,
    DraDevice,
    DraVersion,
    Gpu,
    Node,
)
from placement.podspec import GPU_RESOURCE
from tandem.v1 import common_pb2
from tandem.v1 import inventory_pb2 as inv

__all__ = [
    "AttemptKey",
    "DEFAULT_LABEL_KEYS",
    "LabelFilter",
    "ReportBuilder",
    "node_inventory",
    "quantity_text",
    "reservation_progress",
]

AttemptKey = tuple[str, int]
"""A reservation's (job id, attempt), as the broker and the wire name it."""

DEFAULT_LABEL_KEYS: tuple[str, ...] = (
    GPU_PRODUCT_LABEL,
    GPU_MEMORY_LABEL,
    "nvidia.com/gpu.count",
    "nvidia.com/mig.strategy",
    CLIQUE_LABEL,
    HOSTNAME_LABEL,
    ZONE_LABEL,
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/arch",
)
"""Node labels reported unless the configuration says otherwise: GFD's GPU facts and the
well-known placement labels tenants put in node selectors."""

_ALWAYS = (GPU_PRODUCT_LABEL,)
"""Read by the core itself (`Node.gpu_model` of a node without GPU devices, e.g. MIG mixed strategy)."""

_MEMO_LIMIT = 8192


@dataclass(frozen=True, slots=True)
class LabelFilter:
    """Which node label keys are reported: exact `keys` and key `prefixes` ("" allows every key)."""

    keys: frozenset[str]
    prefixes: tuple[str, ...] = ()
    _memo: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        topology_keys: Iterable[str],
        *,
        extra_keys: Iterable[str] = (),
        extra_prefixes: Iterable[str] = (),
        defaults: Iterable[str] = DEFAULT_LABEL_KEYS,
    ) -> LabelFilter:
        """The agent's allow-list: defaults + configured extras, plus the topology level keys and
        the GPU product label always (the broker's fit and domains read them)."""
        keys = frozenset(defaults) | frozenset(extra_keys) | frozenset(topology_keys) | frozenset(_ALWAYS)
        return cls(keys, tuple(sorted(set(extra_prefixes))))

    @classmethod
    def everything(cls) -> LabelFilter:
        """No filtering (for comparisons and debugging: real GPU nodes carry 50-100 labels)."""
        return cls(frozenset(), ("",))

    def allows(self, key: str) -> bool:
        hit = self._memo.get(key)
        if hit is None:
            hit = key in self.keys or any(key.startswith(p) for p in self.prefixes)
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = hit
        return hit

    def apply(self, labels: Mapping[str, str]) -> dict[str, str]:
        """The allowed subset of a node's labels."""
        memo, allows = self._memo, self.allows
        return {k: v for k, v in labels.items() if (memo[k] if k in memo else allows(k))}


# --------------------------------------------------------------------------- one node

_EFFECT = {
    "NoSchedule": inv.TAINT_EFFECT_NO_SCHEDULE,
    "PreferNoSchedule": inv.TAINT_EFFECT_PREFER_NO_SCHEDULE,
    "NoExecute": inv.TAINT_EFFECT_NO_EXECUTE,
}
_BINARY_UNITS = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


def quantity_text(value: int) -> str:
    """An integer quantity as Kubernetes writes it: the largest exact binary suffix ("80Gi"), else digits."""
    if value:
        for suffix, unit in _BINARY_UNITS:
            if value % unit == 0:
                return f"{value // unit}{suffix}"
    return str(value)


@functools.lru_cache(maxsize=256)
def _mig_slices(model: str) -> int:
    """Memory slices of a MIG-capable model (4 on A30, 8 on A100/H100-class); 0 if not known."""
    family = family_of(model)
    if family is None:
        return 0
    return 4 if family == "A30" else 8


def _gpu(g: Gpu) -> inv.GpuDevice:
    out = inv.GpuDevice(
        index=g.index,
        model=g.model,
        memory_mib=g.memory_mib,
        milli_in_use=g.milli_used,
        health=inv.GPU_HEALTH_HEALTHY if g.healthy else inv.GPU_HEALTH_UNHEALTHY,
        mig_mode=inv.MIG_MODE_ENABLED if g.mig else inv.MIG_MODE_DISABLED,
        mig_memory_slices=_mig_slices(g.model),
    )
    for m in g.mig:
        mi = out.mig_instances.add(profile=m.profile, placement_start=m.start, placement_size=m.size, in_use=m.used)
        if m.gi_profile_id is not None:
            mi.gi_profile_id = m.gi_profile_id
    return out


def _attribute(v: AttributeValue) -> inv.DeviceAttributeValue:
    if isinstance(v, bool):  # before int: bool is an int subclass
        return inv.DeviceAttributeValue(bool_value=v)
    if isinstance(v, int):
        return inv.DeviceAttributeValue(int_value=v)
    if isinstance(v, DraVersion):
        return inv.DeviceAttributeValue(version_value=v.text)
    return inv.DeviceAttributeValue(string_value=v)


def _dra(d: DraDevice) -> inv.DraDevice:
    return inv.DraDevice(
        driver=d.driver,
        pool=d.pool,
        name=d.name,
        allocated=d.allocated,
        attributes={k: _attribute(v) for k, v in d.attributes.items()},
        capacity={k: quantity_text(v) for k, v in d.capacity.items()},
    )


def node_inventory(node: Node, labels: LabelFilter, *, bound_pods: int = 0) -> inv.NodeInventory:
    """Every fact of a core Node the broker's fit reads, as a NodeInventory.

    bound_pods: pods holding resources on the node (`len(NodeFacts.pods)`); allocatable pods is
    `pods_free + bound_pods` (the core Node keeps only the free count).
    Extended resources: `extended_free` carries the core's counts plus `nvidia.com/gpu` = GPUs free
    whole; `extended_allocatable` carries only `nvidia.com/gpu` = number of GPU devices, for
    count-only readers (the core Node does not keep other resources' allocatable amounts).
    Neither has an `nvidia.com/gpu` entry on a node without GPU devices, so the decoder never
    synthesises GPUs from counts for it.
    """
    gpus = node.gpus
    ext_free = {k: v for k, v in node.extended_free.items() if k != GPU_RESOURCE}
    ext_alloc: dict[str, int] = {}
    if gpus:
        ext_free[GPU_RESOURCE] = node.free_whole_gpus
        ext_alloc[GPU_RESOURCE] = len(gpus)
    out = inv.NodeInventory(
        name=node.name,
        labels=labels.apply(node.labels),
        taints=[
            inv.Taint(key=t.key, value=t.value, effect=_EFFECT.get(t.effect, inv.TAINT_EFFECT_UNSPECIFIED))
            for t in node.taints
        ],
        ready=node.ready,
        unschedulable=node.cordoned,
        allocatable=inv.NodeResources(
            cpu_milli=node.cpu_milli_allocatable, memory_bytes=node.memory_allocatable, pods=node.pods_free + bound_pods
        ),
        free=inv.NodeResources(cpu_milli=node.cpu_milli_free, memory_bytes=node.memory_free, pods=node.pods_free),
        gpu_model=node.gpu_model or "",
        gpu_memory_mib=node.gpu_memory_mib,
        gpus=[_gpu(g) for g in gpus],
        extended_allocatable=ext_alloc,
        extended_free=ext_free,
        dra_devices=[_dra(d) for d in node.dra_devices],
    )
    segments = out.topology_path.segments
    for value in node.topology:
        if value is None:
            segments.add()
        else:
            segments.add(value=value)
    return out


# --------------------------------------------------------------------------- reservation progress

Replica = tuple[str, int, str]
"""(pod set, index, node) of one bound replica."""


def _gang_replicas(facts: NodeFacts) -> tuple[tuple[AttemptKey, Replica], ...]:
    """Bound gang pods on one node that name their replica (pod set label and completion index)."""
    out = []
    for p in facts.pods:
        g = p.gang
        if g is None or g.index is None or not (g.attempt.isascii() and g.attempt.isdigit()):
            continue
        out.append(((g.job, int(g.attempt)), (g.pod_set, g.index, facts.name)))
    return tuple(out)


def _progress(
    keys: Iterable[AttemptKey], bound: Mapping[AttemptKey, Iterable[Replica]]
) -> list[inv.ReservationProgress]:
    out = []
    for job, attempt in sorted(set(keys)):
        msg = inv.ReservationProgress(attempt=common_pb2.AttemptRef(job_id=job, attempt=attempt))
        for pod_set, index, node in sorted(set(bound.get((job, attempt), ()))):
            msg.bound.add(pod_set=pod_set, index=index, node=node)
        out.append(msg)
    return out


def reservation_progress(keys: Iterable[AttemptKey], facts: Iterable[NodeFacts]) -> list[inv.ReservationProgress]:
    """Per reservation the agent holds (every key appears, sorted), the replicas already bound,
    read from the bound gang pods of the inventory (`PodRecord.gang`)."""
    bound: dict[AttemptKey, list[Replica]] = {}
    for f in facts:
        for key, replica in _gang_replicas(f):
            bound.setdefault(key, []).append(replica)
    return _progress(keys, bound)


# --------------------------------------------------------------------------- reports


@dataclass(frozen=True, slots=True)
class _Sent:
    """What was last reported for one node, and the facts object it was encoded from."""

    facts: NodeFacts
    data: bytes
    replicas: tuple[tuple[AttemptKey, Replica], ...]


class DeltaWithoutSnapshot(RuntimeError):
    """A delta needs a base: the first report of a stream is a snapshot."""


def _timestamp(now: float) -> timestamp_pb2.Timestamp:
    t = timestamp_pb2.Timestamp()
    t.FromNanoseconds(int(now * 1e9))
    return t


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _wire_nodes(field_number: int, blobs: Iterable[bytes]) -> bytes:
    """Pre-serialised NodeInventory messages as the repeated field `field_number` of a report:
    protobuf encodes a repeated message field as concatenated (tag, length, bytes) records."""
    tag = _varint((field_number << 3) | 2)  # wire type 2: length-delimited
    parts: list[bytes] = []
    for data in blobs:
        parts += (tag, _varint(len(data)), data)
    return b"".join(parts)


class ReportBuilder:
    """Snapshots and deltas of one agent stream (a new stream uses a new builder).

    Remembers per node the bytes last reported and the NodeFacts they came from: facts are rebuilt
    only when their node changes, so an unchanged object is not encoded again, and a rebuilt one
    whose bytes did not change (e.g. only a reservation hold moved) is not sent again.
    """

    def __init__(self, labels: LabelFilter, *, first_sequence: int = 1) -> None:
        self.labels = labels
        self._next = first_sequence
        self.sequence = 0
        """Sequence of the last report produced (0 before the first)."""
        self._sent: dict[str, _Sent] | None = None
        self._bound: dict[AttemptKey, dict[str, tuple[Replica, ...]]] = {}
        self._reservations = b""
        self._progress_memo: tuple[frozenset[AttemptKey], list[inv.ReservationProgress], bytes] | None = None
        """Reservation progress of a key set, valid until the bound-replica index changes."""
        self._ready: dict[str, _Sent] = {}  # encoded ahead of the next report (see prepare)
        self.encoded_nodes = 0
        """Nodes encoded so far (unchanged facts objects are not counted): for metrics and tests."""

    def _encode(self, f: NodeFacts) -> _Sent:
        self.encoded_nodes += 1
        msg = node_inventory(f.node, self.labels, bound_pods=len(f.pods))
        return _Sent(f, msg.SerializeToString(deterministic=True), _gang_replicas(f))

    def _fresh(self, f: NodeFacts) -> _Sent:
        """The encoding of facts not reported yet: prepared ahead, else made now."""
        ready = self._ready.pop(f.name, None)
        return ready if ready is not None and ready.facts is f else self._encode(f)

    def prepare(self, facts: Iterable[NodeFacts], limit: int) -> int:
        """Encode up to `limit` nodes the next report needs and nobody encoded yet, so a large
        first snapshot can be spread over several turns of the caller's event loop; returns how
        many were encoded (0: the next report encodes nothing)."""
        sent = self._sent or {}
        done = 0
        for f in facts:
            if done >= limit:
                break
            last, ready = sent.get(f.name), self._ready.get(f.name)
            if (last is None or last.facts is not f) and (ready is None or ready.facts is not f):
                self._ready[f.name] = self._encode(f)
                done += 1
        return done

    def _index(self, name: str, old: _Sent | None, new: _Sent | None) -> None:
        """Move one node's bound gang replicas in the per-reservation index."""
        self._progress_memo = None
        if old is not None and old.replicas:
            for key, _ in old.replicas:
                on = self._bound.get(key)
                if on is not None:
                    on.pop(name, None)
                    if not on:
                        del self._bound[key]
        if new is not None and new.replicas:
            for key, replica in new.replicas:
                on = self._bound.setdefault(key, {})
                on[name] = on.get(name, ()) + (replica,)

    def _progress(self, reservations: Iterable[AttemptKey]) -> tuple[list[inv.ReservationProgress], bytes]:
        keys = frozenset(reservations)
        memo = self._progress_memo
        if memo is not None and memo[0] == keys:
            return memo[1], memo[2]
        flat = {k: [r for rs in self._bound.get(k, {}).values() for r in rs] for k in keys}
        progress = _progress(keys, flat)
        raw = b"".join(p.SerializeToString(deterministic=True) for p in progress)
        self._progress_memo = (keys, progress, raw)
        return progress, raw

    def _seq(self) -> int:
        seq = max(self._next, self.sequence + 1)
        self.sequence = seq
        return seq

    def snapshot(
        self,
        facts: Iterable[NodeFacts],
        reservations: Iterable[AttemptKey],
        now: float,
        *,
        cluster: inv.ClusterMetadata | None = None,
        applied_broker_sequence: int = 0,
    ) -> inv.InventorySnapshot:
        """The full inventory; what was sent per node is reset to exactly this report's nodes."""
        old = self._sent or {}
        sent: dict[str, _Sent] = {}
        for f in facts:
            s = old.get(f.name)
            sent[f.name] = s if s is not None and s.facts is f else self._fresh(f)
        self._sent = sent
        self._ready.clear()
        self._bound = {}
        self._progress_memo = None
        for name, s in sent.items():
            self._index(name, None, s)
        progress, self._reservations = self._progress(reservations)
        out = inv.InventorySnapshot(
            sequence=self._seq(),
            observe_time=_timestamp(now),
            reservations=progress,
            applied_broker_sequence=applied_broker_sequence,
        )
        if cluster is not None:
            out.cluster.CopyFrom(cluster)
        out.MergeFromString(_wire_nodes(inv.InventorySnapshot.NODES_FIELD_NUMBER, (s.data for s in sent.values())))
        return out

    def delta(
        self,
        facts: Sequence[NodeFacts],
        reservations: Iterable[AttemptKey],
        now: float,
        *,
        applied_broker_sequence: int = 0,
    ) -> inv.InventoryDelta | None:
        """Changes since the last report: upserted nodes whose bytes changed, removed names and the
        full reservations list; None when nothing changed (the sequence is then not used up).
        A new `applied_broker_sequence` alone is not a change: it rides on the next report."""
        sent = self._sent
        if sent is None:
            raise DeltaWithoutSnapshot("the first report of a stream must be a snapshot")
        upserts: list[bytes] = []
        for f in facts:
            name = f.name
            s = sent.get(name)
            if s is not None and s.facts is f:
                continue
            new = self._fresh(f)
            if s is None or s.data != new.data:
                upserts.append(new.data)
            if s is None or s.replicas != new.replicas:
                self._index(name, s, new)
            sent[name] = new
        removed: list[str] = []
        if len(sent) != len(facts):  # some reported node is gone (names in `facts` are unique)
            present = {f.name for f in facts}
            removed = sorted(n for n in sent if n not in present)
            for name in removed:
                self._index(name, sent.pop(name), None)
        progress, raw = self._progress(reservations)
        if not upserts and not removed and raw == self._reservations:
            return None
        self._reservations = raw
        base = self.sequence
        out = inv.InventoryDelta(
            sequence=self._seq(),
            base_sequence=base,
            observe_time=_timestamp(now),
            removed_node_names=removed,
            reservations=progress,
            applied_broker_sequence=applied_broker_sequence,
        )
        out.MergeFromString(_wire_nodes(inv.InventoryDelta.UPSERTED_NODES_FIELD_NUMBER, upserts))
        return out
