"""Catalog freshness, deltas, exclusions and the numpy fleet summaries, held against the core's exact fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.arrays import ClusterArrays, ModelTable
from fleetplan.catalog import (
    Catalog,
    ClusterMeta,
    DeltaGap,
    InventoryReport,
    Level,
    Reservation,
    ReservedReplica,
    Usability,
)
from placement.fit import capacity
from placement.model import Gpu, Node, PodShape, TopologyLevels
from placement.topology import group_by_level

LEVELS = (Level("zone", "z"), Level("rack", "r"), Level("host", "h"))
H100, A100 = "H100", "A100"


def mk(
    name: str,
    *,
    gpus: int = 8,
    free: int | None = None,
    model: str = H100,
    rack: str = "r1",
    cpu: int = 64000,
    ready: bool = True,
) -> Node:
    free = gpus if free is None else free
    return Node(
        name=name,
        ready=ready,
        cpu_milli_allocatable=cpu,
        cpu_milli_free=cpu,
        memory_allocatable=1 << 40,
        memory_free=1 << 40,
        gpus=tuple(Gpu(i, model, 81920, 0 if i < free else 1000) for i in range(gpus)),
        topology=("z1", rack, name),
    )


def report(
    cluster: str,
    seq: int,
    nodes: list[Node],
    *,
    full: bool = True,
    base: int = 0,
    removed: tuple[str, ...] = (),
    bound: dict | None = None,
) -> InventoryReport:
    return InventoryReport(cluster, seq, full, 0.0, tuple(nodes), removed, bound or {}, base)


@pytest.fixture
def catalog() -> Catalog:
    c = Catalog(stale_after_s=30)
    c.connect(ClusterMeta("c1", levels=LEVELS), now=100.0)
    return c


def test_connected_cluster_without_snapshot_is_not_usable(catalog: Catalog) -> None:
    assert catalog.clusters["c1"].usability(100.0, 30) is Usability.NO_SNAPSHOT
    assert catalog.fleet.prune([(PodShape(gpus=1), 1)]) == []
    catalog.apply_report(report("c1", 1, [mk("n1")]), now=101.0)
    assert catalog.clusters["c1"].usability(101.0, 30) is Usability.USABLE
    assert catalog.fleet.prune([(PodShape(gpus=1), 1)]) == ["c1"]


def test_stale_and_disconnected_clusters_are_excluded_not_empty(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk("n1")]), now=100.0)
    catalog.sweep(131.0)
    assert catalog.clusters["c1"].usability(131.0, 30) is Usability.STALE
    assert catalog.fleet.prune([(PodShape(gpus=1), 1)]) == []
    catalog.heartbeat("c1", 131.0)
    catalog.sweep(131.0)
    assert catalog.fleet.prune([(PodShape(gpus=1), 1)]) == ["c1"]
    catalog.disconnect("c1", 132.0)
    assert catalog.clusters["c1"].usability(132.0, 30) is Usability.DISCONNECTED
    assert catalog.fleet.prune([(PodShape(gpus=1), 1)]) == []
    # Its inventory is kept (for never-fit checks) but never read as zero capacity.
    assert catalog.clusters["c1"].nodes


def test_cordon_excludes(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk("n1")]), now=100.0)
    catalog.set_cordoned("c1", True)
    catalog.sweep(100.0)
    assert catalog.clusters["c1"].usability(100.0, 30) is Usability.CORDONED
    assert catalog.fleet.prune([(PodShape(gpus=1), 1)]) == []


def test_delta_updates_rows_in_place_and_gaps_are_refused(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk("n1"), mk("n2", rack="r2")]), now=100.0)
    arrays = catalog.clusters["c1"].arrays
    catalog.apply_report(report("c1", 2, [mk("n1", free=3)], full=False, base=1), now=101.0)
    assert catalog.clusters["c1"].arrays is arrays  # same columns, one row changed
    assert list(arrays.eff_free_gpu()) == [3, 8]
    with pytest.raises(DeltaGap):
        catalog.apply_report(report("c1", 4, [mk("n1")], full=False, base=3), now=102.0)
    catalog.apply_report(report("c1", 3, [mk("n3", rack="r3")], full=False, base=2, removed=("n2",)), now=103.0)
    assert sorted(catalog.clusters["c1"].nodes) == ["n1", "n3"]
    assert sorted(catalog.clusters["c1"].arrays.row) == ["n1", "n3"]


def test_reservation_overlay_counts_unbound_replicas_once(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk("n1"), mk("n2", rack="r2")]), now=100.0)
    shape = PodShape(gpus=4)
    res = Reservation("j1", 1, "c1", (ReservedReplica("w", 0, "n1"), ReservedReplica("w", 1, "n1")), {"w": shape})
    catalog.add_reservation(res)
    assert list(catalog.clusters["c1"].arrays.eff_free_gpu()) == [0, 8]
    # One replica bound: the report shows its GPUs used, the overlay subtracts only the other.
    catalog.apply_report(
        report("c1", 2, [mk("n1", free=4), mk("n2", rack="r2")], bound={("j1", 1): frozenset({("w", 0)})}), now=101.0
    )
    assert list(catalog.clusters["c1"].arrays.eff_free_gpu()) == [0, 8]
    catalog.apply_report(
        report("c1", 3, [mk("n1", free=0), mk("n2", rack="r2")], bound={("j1", 1): frozenset({("w", 0), ("w", 1)})}),
        now=102.0,
    )
    assert list(catalog.clusters["c1"].arrays.eff_free_gpu()) == [0, 8]
    catalog.drop_reservation(("j1", 1))
    assert list(catalog.clusters["c1"].arrays.eff_free_gpu()) == [0, 8]


def test_overlaid_nodes_subtract_only_the_replicas_not_yet_bound(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk("n1", gpus=16)]), now=100.0)
    replicas = (ReservedReplica("w", 0, "n1"), ReservedReplica("w", 1, "n1"))
    catalog.add_reservation(Reservation("j1", 1, "c1", replicas, {"w": PodShape(gpus=4)}))
    [n1] = catalog.overlaid_nodes("c1", [0])
    assert n1.free_whole_gpus == 8  # both held
    # replica 0 is bound: the report shows its 4 GPUs used, and the overlay holds only replica 1's
    catalog.apply_report(report("c1", 2, [mk("n1", gpus=16, free=12)], bound={("j1", 1): frozenset({("w", 0)})}), 101.0)
    [n1] = catalog.overlaid_nodes("c1", [0])
    assert n1.free_whole_gpus == 8


def test_rejected_nodes_excluded_until_newer_report(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk("n1"), mk("n2", rack="r2")]), now=100.0)
    catalog.exclude_nodes("c1", ["n1"])
    assert list(catalog.clusters["c1"].arrays.eff_free_gpu()) == [0, 8]
    catalog.apply_report(report("c1", 2, [mk("n1"), mk("n2", rack="r2")]), now=101.0)
    assert list(catalog.clusters["c1"].arrays.eff_free_gpu()) == [8, 8]


def test_fleet_prunes_by_summaries(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk(f"f{i}", free=2) for i in range(8)]), now=100.0)
    catalog.connect(ClusterMeta("c2", levels=LEVELS), now=100.0)
    catalog.apply_report(report("c2", 1, [mk("w1", model=A100)]), now=100.0)
    # 16 free GPUs in c1, but never 8 on one node.
    assert catalog.fleet.prune([(PodShape(gpus=8), 1)]) == ["c2"]
    assert catalog.fleet.prune([(PodShape(gpus=8, gpu_models=frozenset({H100})), 1)]) == []
    assert catalog.fleet.prune([(PodShape(gpus=2), 8)]) == ["c1"]


def test_candidate_domains_need_the_whole_gang_in_one_domain() -> None:
    nodes = [mk("a", rack="r1"), mk("b", rack="r1"), mk("c", rack="r2"), mk("d", rack="r3", free=4)]
    arrays = ClusterArrays.build(nodes, ("z", "r", "h"), ModelTable())
    cands = arrays.candidate_domains([(PodShape(gpus=8), 2)], level=1, limit=8)
    assert [c.path for c in cands] == [("z1", "r1")]
    assert arrays.candidate_domains([(PodShape(gpus=8), 3)], level=1, limit=8) == []
    assert len(arrays.candidate_domains([(PodShape(gpus=8), 3)], level=0, limit=8)) == 1


def test_fleet_domains_follow_the_core_rule_for_missing_labels() -> None:
    # Two nodes with rack r1 but no zone label are NOT one rack: a missing label makes each node its
    # own domain at that level and below, as placement.topology.domain_of says.
    a = dataclasses.replace(mk("a", rack="r1"), topology=(None, "r1", "a"))
    b = dataclasses.replace(mk("b", rack="r1"), topology=(None, "r1", "b"))
    c, d = mk("c", rack="r2"), mk("d", rack="r2")
    arrays = ClusterArrays.build([a, b, c, d], ("z", "r", "h"), ModelTable())
    levels = TopologyLevels(("z", "r", "h"))
    for depth in range(3):
        core = group_by_level([a, b, c, d], levels, depth)
        fleet_groups: dict[int, list[str]] = {}
        for i, dom in enumerate(arrays.dom[depth]):
            fleet_groups.setdefault(int(dom), []).append(arrays.nodes[i].name)
        assert sorted(fleet_groups.values()) == sorted([n.name for n in g] for g in core.values())
    cands = arrays.candidate_domains([(PodShape(gpus=8), 2)], level=1, limit=8)
    assert [c.path for c in cands] == [("z1", "r2")]


@settings(max_examples=60, deadline=None)
@given(
    frees=st.lists(st.integers(0, 8), min_size=1, max_size=12),
    want=st.integers(1, 8),
    cpus=st.lists(st.integers(0, 64000), min_size=12, max_size=12),
    cpu_want=st.integers(0, 16000),
)
def test_numpy_capacity_equals_core_fit_for_whole_gpu_shapes(
    frees: list[int], want: int, cpus: list[int], cpu_want: int
) -> None:
    nodes = [
        Node(
            name=f"n{i}",
            cpu_milli_allocatable=64000,
            cpu_milli_free=cpus[i],
            memory_allocatable=1 << 40,
            memory_free=1 << 40,
            gpus=tuple(Gpu(k, H100, 81920, 0 if k < f else 1000) for k in range(8)),
            topology=("z", "r", f"n{i}"),
        )
        for i, f in enumerate(frees)
    ]
    shape = PodShape(gpus=want, cpu_milli=cpu_want)
    arrays = ClusterArrays.build(nodes, ("z", "r", "h"), ModelTable())
    assert list(arrays.capacity(shape)) == [min(capacity(n, shape).count, 110) for n in nodes]
    assert int(np.sum(arrays.eff_free_gpu())) == sum(frees)


def test_memoised_overlay_matches_a_fresh_one(catalog: Catalog) -> None:
    catalog.apply_report(report("c1", 1, [mk("n1"), mk("n2", rack="r2")]), now=100.0)
    entry = catalog.clusters["c1"]
    rows = [0, 1]
    catalog.overlaid_nodes(entry.name, rows)  # warm the memo
    for i in range(5):
        catalog.add_reservation(
            Reservation(f"j{i}", 1, "c1", (ReservedReplica("w", 0, "n1"),), {"w": PodShape(gpus=2)})
        )
        catalog.overlaid_nodes(entry.name, rows)
    catalog.drop_reservation(("j1", 1))
    memo = [n.free_whole_gpus for n in catalog.overlaid_nodes(entry.name, rows)]
    entry.overlaid.clear()
    fresh = [n.free_whole_gpus for n in catalog.overlaid_nodes(entry.name, rows)]
    assert memo == fresh == [0, 8]  # after dropping j1, four holds of 2 GPUs fill n1


class _Res:
    def __init__(self, shapes: dict[str, PodShape]) -> None:
        self.shapes = shapes


class _Rep:
    def __init__(self, pod_set: str, node: str) -> None:
        self.pod_set, self.node = pod_set, node


_SHAPES = {
    "g1": PodShape(gpus=1),
    "g8": PodShape(gpus=8, cpu_milli=8000, memory=64 << 30),
    "a2": PodShape(gpus=2, gpu_models=frozenset({A100})),
    "cpu": PodShape(cpu_milli=16000),
    "half": PodShape(gpus=1, gpu_milli=500),
}


@settings(max_examples=60, deadline=None)
@given(
    frees=st.lists(st.integers(0, 8), min_size=1, max_size=12),
    ops=st.lists(
        st.tuples(st.sampled_from(sorted(_SHAPES)), st.integers(0, 11), st.sampled_from([1, -1])), max_size=12
    ),
)
def test_patched_arrays_equal_a_rebuild_after_holds_and_releases(
    frees: list[int], ops: list[tuple[str, int, int]]
) -> None:
    nodes = [mk(f"n{i}", free=f, rack=f"r{i % 3}", model=A100 if i % 4 == 0 else H100) for i, f in enumerate(frees)]
    arrays = ClusterArrays.build(nodes, ("z", "r", "h"), ModelTable())
    res = _Res(_SHAPES)

    def derived() -> list[np.ndarray]:
        return (
            [arrays.eff_free_gpu().copy()]
            + [arrays.capacity(s).copy() for s in _SHAPES.values()]
            + [arrays.domain_caps(lvl).copy() for lvl in (None, 0, 1, 2)]
        )

    derived()  # warm every cache, so the holds below patch them instead of rebuilding
    for name, i, sign in ops:
        arrays.add_pending([(res, _Rep(name, f"n{i % len(nodes)}"))], sign)
        patched = derived()
        arrays._changed()  # drop every derived array: rebuilt from the columns
        rebuilt = derived()
        for p, r in zip(patched, rebuilt):
            assert p.tolist() == r.tolist()
