"""Scale mode's fleet shape and its recorded inventory: real-format nodes encoded once, replayed for every cluster."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extender.agent.encode import LabelFilter, ReportBuilder
from extender.config import ExtenderConfig
from extender.inventory import KINDS, Inventory
from fleetsim.processes import REPO
from placement.podspec import GPU_RESOURCE
from tandem.v1 import inventory_pb2 as inv

__all__ = [
    "FIXTURE",
    "FIXTURE_NODE",
    "FleetLayout",
    "GPUS_PER_NODE",
    "REPLICA_CPU_MILLI",
    "REPLICA_GPUS",
    "REPLICA_MEMORY",
    "RecordedInventory",
    "record_inventory",
]

FIXTURE = REPO / "tests" / "fixtures" / "cluster.json"
FIXTURE_NODE = "h100-r1-n1"
"""The fixture's HGX H100 node (8 x H100 80GB, 192 CPUs, 2 TiB), the shape every synthetic node takes."""
GPUS_PER_NODE = 8
REPLICA_GPUS = 8
"""Every replica of the scale mix takes a whole node's GPUs, so a node is either free or busy: the two
recorded variants of each node."""
REPLICA_CPU_MILLI = 96_000
REPLICA_MEMORY = 1 << 40


# ----------------------------------------------------------------------------- the fleet's shape


@dataclass(frozen=True, slots=True)
class FleetLayout:
    """`clusters` identical clusters of `nodes` HGX nodes each: racks of `nodes_per_rack` consecutive nodes,
    blocks of `racks_per_block` racks, one zone. Cluster names have one width, so renaming a recorded node
    never changes a length inside the encoded bytes."""

    clusters: int = 100
    nodes: int = 1000
    nodes_per_rack: int = 16
    racks_per_block: int = 8
    region: str = "region-1"
    """The fixture node's region label (every cluster is in it)."""
    role: str = "training"
    zone: str = "zone-a"
    tenant: str = "scale"
    namespace: str = "scale-jobs"

    @property
    def _width(self) -> int:
        return max(3, len(str(self.clusters - 1)))

    def cluster_name(self, k: int) -> str:
        return f"sc{k:0{self._width}d}"

    def cluster_names(self) -> list[str]:
        return [self.cluster_name(k) for k in range(self.clusters)]

    def node_name(self, cluster: str, i: int) -> str:
        return f"{cluster}-n{i:0{max(4, len(str(self.nodes - 1)))}d}"

    def rack_of(self, i: int) -> str:
        return f"r{i // self.nodes_per_rack:03d}"

    def block_of(self, i: int) -> str:
        return f"b{i // (self.nodes_per_rack * self.racks_per_block):02d}"

    @property
    def gpus_per_cluster(self) -> int:
        return self.nodes * GPUS_PER_NODE


# ----------------------------------------------------------------------------- recorded inventory


def _node_object(base: Mapping[str, Any], layout: FleetLayout, cluster: str, i: int) -> dict[str, Any]:
    node: dict[str, Any] = copy.deepcopy(dict(base))
    meta = node["metadata"]
    name = layout.node_name(cluster, i)
    meta["name"] = name
    meta["uid"] = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
    meta["labels"].update(
        {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": layout.zone,
            "topology.kubernetes.io/region": layout.region,
            "network.example.com/block": layout.block_of(i),
            "network.example.com/rack": layout.rack_of(i),
        }
    )
    address = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
    node["status"]["addresses"] = [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}]
    return node


def _replica_pod(layout: FleetLayout, node: str, i: int) -> dict[str, Any]:
    """A running pod holding one replica's resources (what a bound gang pod takes on its node)."""
    resources = {"cpu": f"{REPLICA_CPU_MILLI}m", "memory": str(REPLICA_MEMORY), GPU_RESOURCE: str(REPLICA_GPUS)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"replica-{i}", "namespace": layout.namespace, "uid": f"replica-{i}"},
        "spec": {
            "nodeName": node,
            "schedulerName": "tandem-scheduler",
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "trainer:1", "resources": {"requests": resources, "limits": dict(resources)}}
            ],
        },
        "status": {"phase": "Running"},
    }


def _encoded(
    config: ExtenderConfig, labels: LabelFilter, nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]
) -> list[bytes]:
    """The nodes as the agent reports them: the extender's inventory, then the agent's snapshot encoder."""
    inventory = Inventory(config)
    for kind in KINDS:
        inventory.replace(kind, nodes if kind == "Node" else pods if kind == "Pod" else [])
    facts = {f.name: f for f in inventory.snapshot().facts}
    report = ReportBuilder(labels).snapshot([facts[n["metadata"]["name"]] for n in nodes], [], 0.0)
    return [n.SerializeToString(deterministic=True) for n in report.nodes]


_NAME_OCCURRENCES = 3
"""A reported node's name appears as its name, its hostname label and the host segment of its topology path."""


@dataclass(frozen=True)
class RecordedInventory:
    """One cluster's nodes as the agent's encoder produced them, under the first cluster's name: per node the
    bytes with nothing bound (`free`) and with one replica bound (`busy`)."""

    layout: FleetLayout
    free: tuple[bytes, ...]
    busy: tuple[bytes, ...]
    record_s: float
    """Time the recording took (extender inventory + encoder, both variants)."""
    raw_labels: int
    """Labels on the fixture node; the reported ones are the allow-list's subset."""
    reported_labels: int
    untrimmed_snapshot_bytes: int
    """What one cluster's snapshot would weigh with every label reported (LabelFilter.everything())."""
    _snapshot_nodes: bytes = field(default=b"", repr=False)

    @property
    def template_cluster(self) -> str:
        return self.layout.cluster_name(0)

    @property
    def snapshot_bytes(self) -> int:
        """One cluster's snapshot nodes on the wire."""
        return len(self._snapshot_nodes)

    def _rename(self, data: bytes, cluster: str) -> bytes:
        if cluster == self.template_cluster:
            return data
        old, new = f"{self.template_cluster}-n".encode(), f"{cluster}-n".encode()
        assert len(old) == len(new), "cluster names must share one width"
        return data.replace(old, new)

    def node(self, cluster: str, i: int, bound_gpus: int) -> bytes:
        """NodeInventory bytes of node `i` of `cluster` with `bound_gpus` GPUs held by bound pods."""
        if bound_gpus not in (0, REPLICA_GPUS):
            raise ValueError(f"only free and {REPLICA_GPUS}-GPU-bound nodes were recorded, not {bound_gpus}")
        return self._rename((self.busy if bound_gpus else self.free)[i], cluster)

    def snapshot(
        self,
        cluster: str,
        sequence: int,
        now: float,
        bound: Mapping[int, int] | None = None,
        reservations: Iterable[inv.ReservationProgress] = (),
        applied_broker_sequence: int = 0,
    ) -> inv.InventorySnapshot:
        """The cluster's full report; nodes with bound pods (index -> GPUs) take their busy bytes."""
        snap = inv.InventorySnapshot(
            sequence=sequence, reservations=list(reservations), applied_broker_sequence=applied_broker_sequence
        )
        snap.observe_time.FromNanoseconds(int(now * 1e9))
        if not bound:
            snap.MergeFromString(self._rename(self._snapshot_nodes, cluster))  # the recorded report as sent
        else:
            for i in range(self.layout.nodes):
                snap.nodes.add().MergeFromString(self.node(cluster, i, bound.get(i, 0)))
        return snap


def record_inventory(layout: FleetLayout, fixture: Path = FIXTURE, node_name: str = FIXTURE_NODE) -> RecordedInventory:
    """Record one cluster's nodes through the extender's inventory and the agent's encoder, default label
    allow-list (the extender's topology keys + GPU facts + well-known placement labels)."""
    t0 = time.perf_counter()
    base = next(
        o
        for o in json.loads(fixture.read_text())["items"]
        if o.get("kind") == "Node" and o["metadata"]["name"] == node_name
    )
    config = ExtenderConfig()
    labels = LabelFilter.build(config.topology.keys)
    cluster = layout.cluster_name(0)
    nodes = [_node_object(base, layout, cluster, i) for i in range(layout.nodes)]
    free = _encoded(config, labels, nodes, [])
    pods = [_replica_pod(layout, n["metadata"]["name"], i) for i, n in enumerate(nodes)]
    busy = _encoded(config, labels, nodes, pods)
    record_s = time.perf_counter() - t0
    pattern = f"{cluster}-n".encode()
    for data in free + busy:  # renaming rewrites exactly the name, the hostname label and the host segment
        if data.count(pattern) != _NAME_OCCURRENCES:
            raise ValueError(f"a recorded node holds {pattern!r} {data.count(pattern)} times, not {_NAME_OCCURRENCES}")
    untrimmed = _encoded(config, LabelFilter.everything(), nodes[:1], [])[0]
    reported = inv.NodeInventory.FromString(free[0])
    snapshot_nodes = inv.InventorySnapshot(nodes=[inv.NodeInventory.FromString(b) for b in free]).SerializeToString(
        deterministic=True
    )
    return RecordedInventory(
        layout,
        tuple(free),
        tuple(busy),
        record_s,
        len(base["metadata"]["labels"]),
        len(reported.labels),
        len(untrimmed) * layout.nodes,
        snapshot_nodes,
    )
