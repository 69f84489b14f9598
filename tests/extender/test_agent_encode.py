"""The agent's inventory encoder: exact inverse of the broker's decoder, label allow-list, and
snapshot + deltas that rebuild in the broker's catalog what one fresh snapshot gives."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.api.serde_agent import report_from_delta, report_from_snapshot
from broker.api.serde_inventory import InventoryDecodeError, node_from_proto
from extender.agent.encode import (
    AttemptKey,
    DeltaWithoutSnapshot,
    LabelFilter,
    ReportBuilder,
    node_inventory,
    quantity_text,
    reservation_progress,
)
from extender.facts import NodeFacts
from extender.inventory import Inventory
from fleetplan.catalog import Catalog, ClusterEntry, ClusterMeta, Level
from placement.model import DraDevice, DraVersion, Gpu, MigInstance, Node, Taint
from placement.quantity import to_int_bytes
from tandem.v1 import inventory_pb2 as inv
from tests.extender.extender_builders import node as node_obj
from tests.extender.extender_builders import pod, reservation
from tests.extender.extender_support import make_inventory

TOPOLOGY = (
    "topology.kubernetes.io/zone",
    "network.example.com/block",
    "network.example.com/rack",
    "nvidia.com/gpu.clique",
    "kubernetes.io/hostname",
)
LABELS = LabelFilter.build(TOPOLOGY)
NOW = 1_780_000_000.25


def facts_of(i: Inventory) -> list[NodeFacts]:
    return list(i.snapshot().facts)


def round_trip(node: Node, labels: LabelFilter = LABELS, bound_pods: int = 0) -> Node:
    msg = node_inventory(node, labels, bound_pods=bound_pods)
    return node_from_proto(inv.NodeInventory.FromString(msg.SerializeToString()))


def attribute_types(node: Node) -> list[list[tuple[str, type]]]:
    """Attribute value types per device (True == 1 in Python, so equality alone would not tell)."""
    return [sorted((k, type(v)) for k, v in d.attributes.items()) for d in node.dra_devices]


# --------------------------------------------------------------------------- the fixture cluster

GPU_NODE_LABELS = [
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "network.example.com/block",
    "network.example.com/rack",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.product",
    "nvidia.com/mig.strategy",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
]
PLAIN_NODE_LABELS = [
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "network.example.com/block",
    "network.example.com/rack",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
]
EXPECTED_LABELS = {
    **{
        n: GPU_NODE_LABELS
        for n in ("h100-r1-n1", "h100-r1-n2", "h100-r2-n1", "h100-r2-n2", "h100-notready", "a100-mig-1", "t4-1")
    },
    **{n: sorted(GPU_NODE_LABELS + ["nvidia.com/gpu.clique"]) for n in ("gb200-r5-n1", "gb200-r5-n2", "gb200-r5-n3")},
    "cpu-1": PLAIN_NODE_LABELS,
    "h200-dra-1": PLAIN_NODE_LABELS,
}


def test_every_fixture_node_round_trips_except_dropped_labels() -> None:
    facts = facts_of(make_inventory())
    assert sorted(f.name for f in facts) == sorted(EXPECTED_LABELS)
    for f in facts:
        back = round_trip(f.node, bound_pods=len(f.pods))
        assert sorted(back.labels) == EXPECTED_LABELS[f.name], f.name
        assert back == dataclasses.replace(f.node, labels={k: f.node.labels[k] for k in back.labels}), f.name
        assert attribute_types(back) == attribute_types(f.node)
        msg = node_inventory(f.node, LABELS, bound_pods=len(f.pods))
        assert msg.allocatable.pods == 110, f.name  # every fixture node allows 110 pods
        assert len(msg.topology_path.segments) == len(TOPOLOGY)
    by_name = {f.name: f for f in facts}
    dra = by_name["h200-dra-1"].node
    assert dra.dra_devices and any(d.allocated for d in dra.dra_devices)
    assert round_trip(dra).dra_devices == dra.dra_devices
    # No GPU devices under the MIG mixed strategy: the model comes from the (always kept) product label.
    mig = by_name["a100-mig-1"].node
    assert not mig.gpus and mig.gpu_model == "NVIDIA-A100-SXM4-80GB"
    assert round_trip(mig).gpu_model == mig.gpu_model
    # The clique level is missing on H100 nodes: an unset segment, not an empty string.
    seg = node_inventory(by_name["h100-r1-n1"].node, LABELS).topology_path.segments[3]
    assert not seg.HasField("value")


def test_extended_counts_for_count_only_readers() -> None:
    by_name = {f.name: f for f in facts_of(make_inventory())}
    h100 = node_inventory(by_name["h100-r1-n1"].node, LABELS)
    assert h100.extended_allocatable["nvidia.com/gpu"] == 8
    assert h100.extended_free["nvidia.com/gpu"] == by_name["h100-r1-n1"].node.free_whole_gpus
    mig = node_inventory(by_name["a100-mig-1"].node, LABELS)
    assert "nvidia.com/gpu" not in mig.extended_allocatable and "nvidia.com/gpu" not in mig.extended_free
    assert dict(mig.extended_free) == dict(by_name["a100-mig-1"].node.extended_free)


def test_quantity_text_is_exact_and_readable() -> None:
    assert quantity_text(141 * 2**30) == "141Gi"
    assert quantity_text(0) == "0"
    assert quantity_text(1536) == "1536"  # 1.5Ki is not an integer number of Ki
    for v in (1, 1023, 1024, 3 * 2**20, 2**62, -(2**31), 10**12 + 7):
        assert to_int_bytes(quantity_text(v)) == v


def test_bad_capacity_is_refused_with_the_device_named() -> None:
    msg = inv.NodeInventory(
        name="n1", dra_devices=[inv.DraDevice(driver="d", pool="p", name="x", capacity={"memory": "lots"})]
    )
    with pytest.raises(InventoryDecodeError, match="d/p/x"):
        node_from_proto(msg)


# --------------------------------------------------------------------------- generated nodes

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
INT64 = st.integers(-(2**63), 2**63 - 1)
MODELS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A30", "Tesla-T4", "NVIDIA-GB200"]


@st.composite
def gpus(draw: st.DrawFn) -> tuple[Gpu, ...]:
    model = draw(st.sampled_from(MODELS))
    out = []
    for i in draw(st.lists(st.integers(0, 63), unique=True, max_size=8)):
        mig = tuple(
            MigInstance(
                draw(st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb", ""])),
                draw(st.none() | st.integers(0, 50)),
                draw(st.integers(0, 7)),
                draw(st.integers(1, 8)),
                draw(st.booleans()),
            )
            for _ in range(draw(st.integers(0, 3)))
        )
        out.append(
            Gpu(
                i,
                draw(st.sampled_from([model, model, MODELS[3]])),
                draw(st.integers(0, 2**20)),
                0 if mig else draw(st.sampled_from([0, 1000]) | st.integers(0, 1000)),
                mig,
                draw(st.booleans()),
            )
        )
    return tuple(out)


ATTRIBUTE = st.one_of(TEXT, INT64, st.booleans(), TEXT.map(DraVersion))
CAPACITY = st.one_of(st.integers(-(2**40), 2**62), st.integers(0, 2**20).map(lambda x: x * 2**30))
DRA = st.builds(
    DraDevice,
    TEXT,
    TEXT,
    TEXT,
    st.dictionaries(TEXT, ATTRIBUTE, max_size=5),
    st.dictionaries(TEXT, CAPACITY, max_size=3),
    st.booleans(),
)
LABEL_KEYS = list(TOPOLOGY) + [
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.family",
    "feature.node.kubernetes.io/cpu-x",
    "team.example.com/pool",
    "kubernetes.io/os",
]
NODES = st.builds(
    Node,
    name=TEXT,
    labels=st.dictionaries(st.sampled_from(LABEL_KEYS), TEXT, max_size=6),
    taints=st.lists(
        st.builds(Taint, TEXT, TEXT, st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])), max_size=3
    ).map(tuple),
    ready=st.booleans(),
    cordoned=st.booleans(),
    cpu_milli_allocatable=INT64,
    cpu_milli_free=INT64,
    memory_allocatable=INT64,
    memory_free=INT64,
    pods_free=st.integers(-10, 5000),
    gpus=gpus(),
    extended_free=st.dictionaries(
        st.sampled_from(["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "example.com/fpga", "tandem.dev/other"]),
        INT64,
        max_size=3,
    ),
    dra_devices=st.lists(DRA, max_size=3).map(tuple),
    topology=st.lists(st.none() | TEXT, max_size=5).map(tuple),
)
EXTRA = LabelFilter.build(
    TOPOLOGY, extra_keys=("team.example.com/pool",), extra_prefixes=("feature.node.kubernetes.io/",)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NODES, st.integers(0, 200))
def test_generated_nodes_round_trip_exactly(node: Node, bound: int) -> None:
    back = round_trip(node, EXTRA, bound)
    dropped = {"kubernetes.io/os", "nvidia.com/gpu.family"}  # the LABEL_KEYS that EXTRA does not allow
    assert back == dataclasses.replace(node, labels={k: v for k, v in node.labels.items() if k not in dropped})
    assert attribute_types(back) == attribute_types(node)
    assert node_inventory(node, EXTRA, bound_pods=bound).allocatable.pods == node.pods_free + bound
    assert round_trip(node, LabelFilter.everything()) == node


# --------------------------------------------------------------------------- the allow-list


def test_topology_keys_and_product_label_are_always_kept() -> None:
    f = LabelFilter.build(
        ("site.example.com/hall", "site.example.com/row"),
        defaults=(),
        extra_keys=("team.example.com/pool",),
        extra_prefixes=("feature.node.kubernetes.io/cpu-",),
    )
    labels = {
        "site.example.com/hall": "h1",
        "site.example.com/row": "",
        "nvidia.com/gpu.product": "H100",
        "team.example.com/pool": "a",
        "feature.node.kubernetes.io/cpu-cpuid.AVX512": "true",
        "feature.node.kubernetes.io/kernel-version.full": "6.8",
        "nvidia.com/gfd.timestamp": "1",
        "kubernetes.io/hostname": "n1",
        "team.example.com/pool-2": "b",
    }
    assert f.apply(labels) == {
        "site.example.com/hall": "h1",
        "site.example.com/row": "",
        "nvidia.com/gpu.product": "H100",
        "team.example.com/pool": "a",
        "feature.node.kubernetes.io/cpu-cpuid.AVX512": "true",
    }
    assert LabelFilter.everything().apply(labels) == labels
    default = LabelFilter.build(TOPOLOGY)
    assert default.allows("node.kubernetes.io/instance-type") and default.allows("nvidia.com/gpu.clique")
    assert not default.allows("nvidia.com/gpu.family") and not default.allows("kubernetes.io/os")


# --------------------------------------------------------------------------- reports


def gang_pod(name: str, job: str, attempt: int, pod_set: str, index: int, node: str, gpus: int = 1) -> dict[str, Any]:
    return pod(
        name,
        gpus=gpus,
        node_name=node,
        phase="Running",
        labels={
            "tandem.dev/job": job,
            "tandem.dev/attempt": str(attempt),
            "tandem.dev/pod-set": pod_set,
            "batch.kubernetes.io/job-completion-index": str(index),
        },
    )


def test_snapshot_then_nothing_changed_gives_no_delta() -> None:
    i = make_inventory()
    b = ReportBuilder(LABELS)
    snap = b.snapshot(facts_of(i), [], NOW)
    assert snap.sequence == 1 and len(snap.nodes) == 12
    assert snap.observe_time.ToNanoseconds() == int(NOW * 1e9)
    assert b.delta(facts_of(i), [], NOW + 1) is None
    i.apply("Pod", "ADDED", pod("pending-only", gpus=1))  # not bound: nothing changes
    assert b.delta(facts_of(i), [], NOW + 2) is None
    encoded = b.encoded_nodes
    # A reservation rebuilds the node's facts (a new hold) but not the node: encoded, not sent.
    i.apply("ConfigMap", "ADDED", reservation("other", "1", {"h100-r1-n1": 1}, gpus=2))
    assert b.delta(facts_of(i), [], NOW + 3) is None
    assert b.encoded_nodes == encoded + 1
    # A label outside the allow-list changed: the same.
    i.apply("Node", "MODIFIED", node_obj("h100-r2-n1", labels={"nvidia.com/gfd.timestamp": "1999999999"}))
    assert b.delta(facts_of(i), [], NOW + 4) is None
    assert b.sequence == 1


def test_a_bind_sends_exactly_that_node_and_the_bound_replica() -> None:
    i = make_inventory()
    b = ReportBuilder(LABELS)
    key: AttemptKey = ("train-42", 3)
    b.snapshot(facts_of(i), [key], NOW)
    i.apply("Pod", "ADDED", gang_pod("train-42-3-workers-0", "train-42", 3, "workers", 0, "h100-r2-n2"))
    d = b.delta(facts_of(i), [key], NOW + 1)
    assert d is not None
    assert [n.name for n in d.upserted_nodes] == ["h100-r2-n2"] and not d.removed_node_names
    assert (d.sequence, d.base_sequence) == (2, 1)
    assert [
        (p.attempt.job_id, p.attempt.attempt, [(r.pod_set, r.index, r.node) for r in p.bound]) for p in d.reservations
    ] == [("train-42", 3, [("workers", 0, "h100-r2-n2")])]
    by_name = {f.name: f for f in facts_of(i)}
    assert node_from_proto(d.upserted_nodes[0]).gpus == by_name["h100-r2-n2"].node.gpus


def test_node_removed_and_reservation_alone_are_changes() -> None:
    i = make_inventory()
    b = ReportBuilder(LABELS, first_sequence=10)
    assert b.snapshot(facts_of(i), [], NOW).sequence == 10
    i.apply("Node", "DELETED", node_obj("t4-1"))
    d = b.delta(facts_of(i), [], NOW)
    assert d is not None and list(d.removed_node_names) == ["t4-1"] and not d.upserted_nodes
    d2 = b.delta(facts_of(i), [("job-a", 1)], NOW)  # a new reservation, nothing bound yet
    assert d2 is not None and not d2.upserted_nodes and not d2.removed_node_names
    assert [(p.attempt.job_id, list(p.bound)) for p in d2.reservations] == [("job-a", [])]
    assert (d.sequence, d2.base_sequence, d2.sequence) == (11, 11, 12)
    assert b.delta(facts_of(i), [("job-a", 1)], NOW) is None
    snap = b.snapshot(facts_of(i), [], NOW)
    assert snap.sequence == 13 and len(snap.nodes) == 11


def test_prepare_spreads_the_encoding_and_changes_nothing_sent() -> None:
    i = make_inventory()
    b = ReportBuilder(LABELS)
    assert b.prepare(facts_of(i), 5) == 5
    assert b.prepare(facts_of(i), 100) == 7
    assert b.prepare(facts_of(i), 100) == 0
    snap = b.snapshot(facts_of(i), [], NOW)
    assert b.encoded_nodes == 12
    assert snap.SerializeToString(deterministic=True) == ReportBuilder(LABELS).snapshot(
        facts_of(i), [], NOW
    ).SerializeToString(deterministic=True)
    i.apply("Pod", "ADDED", pod("bound-1", gpus=1, node_name="t4-1", phase="Running"))
    assert b.prepare(facts_of(i), 100) == 1
    d = b.delta(facts_of(i), [], NOW)
    assert d is not None and [n.name for n in d.upserted_nodes] == ["t4-1"] and b.encoded_nodes == 13


def test_delta_needs_a_snapshot_first() -> None:
    with pytest.raises(DeltaWithoutSnapshot):
        ReportBuilder(LABELS).delta(facts_of(make_inventory()), [], NOW)


def test_reservation_progress_lists_every_held_reservation() -> None:
    i = make_inventory(
        [
            gang_pod("a-0", "job-a", 2, "workers", 0, "h100-r1-n2"),
            gang_pod("a-1", "job-a", 2, "workers", 1, "h100-r1-n2"),
            gang_pod("a-h", "job-a", 2, "head", 0, "h100-r2-n1"),
            gang_pod("old", "job-a", 1, "workers", 0, "h100-r2-n2"),  # an older attempt
            gang_pod("b-0", "job-b", 1, "workers", 0, "h100-r2-n2"),
        ]
    )  # not held by the agent
    out = reservation_progress([("job-c", 1), ("job-a", 2)], facts_of(i))
    assert [(p.attempt.job_id, p.attempt.attempt, [(r.pod_set, r.index, r.node) for r in p.bound]) for p in out] == [
        ("job-a", 2, [("head", 0, "h100-r2-n1"), ("workers", 0, "h100-r1-n2"), ("workers", 1, "h100-r1-n2")]),
        ("job-c", 1, []),
    ]
    b = ReportBuilder(LABELS)
    assert list(b.snapshot(facts_of(i), [("job-c", 1), ("job-a", 2)], NOW).reservations) == out


# --------------------------------------------------------------------------- the catalog contract

META = ClusterMeta("c1", levels=tuple(Level(k.rsplit("/", 1)[-1], k) for k in TOPOLOGY))
GPU_NODES = ("h100-r1-n1", "h100-r1-n2", "h100-r2-n1", "h100-r2-n2", "gb200-r5-n1", "t4-1", "a100-mig-1")
OPS = (
    "bind",
    "gang",
    "unbind",
    "finish",
    "add_node",
    "remove_node",
    "cordon",
    "relabel",
    "reserve",
    "release",
    "flush",
    "flush",
)


class Cluster:
    """The fixture cluster changing at random, with the agent's held reservation keys."""

    def __init__(self) -> None:
        self.inv = make_inventory()
        self.pods: list[dict[str, Any]] = []
        self.added: list[str] = []
        self.held: dict[AttemptKey, dict[str, Any]] = {}
        self.n = 0

    def names(self) -> list[str]:
        return sorted(f.name for f in self.inv.snapshot().facts)

    def step(self, op: str, rng: random.Random) -> None:
        self.n += 1
        names = self.names()
        gpu_nodes = [n for n in names if n in GPU_NODES or n in self.added]
        if op == "bind" and gpu_nodes:
            p = pod(f"p{self.n}", gpus=rng.choice([0, 1, 2]), node_name=rng.choice(gpu_nodes), phase="Running")
            self.inv.apply("Pod", "ADDED", p)
            self.pods.append(p)
        elif op == "gang" and self.held and gpu_nodes:
            (job, attempt) = rng.choice(sorted(self.held))
            p = gang_pod(
                f"g{self.n}", job, attempt, rng.choice(["workers", "head"]), rng.randrange(4), rng.choice(gpu_nodes)
            )
            self.inv.apply("Pod", "ADDED", p)
            self.pods.append(p)
        elif op in ("unbind", "finish") and self.pods:
            p = self.pods.pop(rng.randrange(len(self.pods)))
            if op == "finish":
                p["status"]["phase"] = "Succeeded"
            self.inv.apply("Pod", "DELETED" if op == "unbind" else "MODIFIED", p)
        elif op == "add_node":
            name = f"new-{self.n}"
            self.inv.apply("Node", "ADDED", node_obj(rng.choice(GPU_NODES[:5]), name=name))
            self.added.append(name)
        elif op == "remove_node" and names:
            self.inv.apply("Node", "DELETED", {"kind": "Node", "metadata": {"name": rng.choice(names)}})
        elif op in ("cordon", "relabel") and names:
            name = rng.choice(names)
            base = name if name in EXPECTED_LABELS else "h100-r1-n2"
            obj = node_obj(base, name=name, cordoned=op == "cordon", labels={"nvidia.com/gfd.timestamp": str(self.n)})
            self.inv.apply("Node", "MODIFIED", obj)
        elif op == "reserve" and gpu_nodes:
            key = (f"job-{self.n}", rng.randint(1, 3))
            cm = reservation(key[0], str(key[1]), {rng.choice(gpu_nodes): rng.randint(1, 2)}, gpus=1)
            self.inv.apply("ConfigMap", "ADDED", cm)
            self.held[key] = cm
        elif op == "release" and self.held:
            key = rng.choice(sorted(self.held))
            self.inv.apply("ConfigMap", "DELETED", self.held.pop(key))


def catalog_view(
    entry: ClusterEntry,
) -> tuple[dict[str, Node], dict[AttemptKey, frozenset[tuple[str, int]]], dict[str, int]]:
    assert entry.arrays is not None
    free = dict(zip((n.name for n in entry.arrays.nodes), entry.arrays.eff_free_gpu().tolist()))
    return dict(entry.nodes), dict(entry.bound), free


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(OPS), max_size=30), st.integers(0, 2**32))
def test_snapshot_plus_deltas_equal_one_fresh_snapshot_in_the_catalog(ops: list[str], seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster()
    builder = ReportBuilder(LABELS)
    live = Catalog(stale_after_s=60)
    live.connect(META, NOW)
    live.apply_report(report_from_snapshot("c1", builder.snapshot(cluster.inv.snapshot().facts, [], NOW), NOW), NOW)
    sequences = [builder.sequence]
    for op in ops + ["flush"]:
        if op != "flush":
            cluster.step(op, rng)
            continue
        d = builder.delta(cluster.inv.snapshot().facts, cluster.held, NOW)
        if d is not None:
            assert d.base_sequence == sequences[-1] < d.sequence
            sequences.append(d.sequence)
            live.apply_report(report_from_delta("c1", d, NOW), NOW)
        fresh = Catalog(stale_after_s=60)
        fresh.connect(META, NOW)
        snap = ReportBuilder(LABELS).snapshot(cluster.inv.snapshot().facts, cluster.held, NOW)
        fresh.apply_report(report_from_snapshot("c1", snap, NOW), NOW)
        assert catalog_view(live.clusters["c1"]) == catalog_view(fresh.clusters["c1"])
        assert set(live.clusters["c1"].bound) == set(cluster.held)
