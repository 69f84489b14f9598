"""The fleet picture's counts (fleetplan.occupancy) against a per-node recount from the Node objects."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.arrays import ClusterArrays, ModelTable
from fleetplan.catalog import Reservation, ReservedReplica
from fleetplan.occupancy import occupancy, picture_depth
from placement.model import HOSTNAME_LABEL, Gpu, Node, PodShape

ZONE, RACK = "topology.kubernetes.io/zone", "network.example.com/rack"
LEVELS = (ZONE, RACK, HOSTNAME_LABEL)


def _node(i: int, zone: str, rack: str | None, gpus: int, busy: int, model: str, ready: bool, pods: int) -> Node:
    return Node(
        name=f"n{i}",
        ready=ready,
        pods_free=pods,
        gpus=tuple(Gpu(k, model, 81920, milli_used=1000 if k < busy else 0) for k in range(gpus)),
        topology=(zone, rack, f"n{i}"),
    )


nodes_st = st.lists(
    st.tuples(
        st.sampled_from(["z1", "z2"]),
        st.one_of(st.none(), st.sampled_from(["r1", "r2", "r3"])),
        st.sampled_from([0, 4, 8]),
        st.integers(0, 8),
        st.sampled_from(["H100", "A100"]),
        st.booleans(),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=24,
)


@settings(max_examples=150, deadline=None)
@given(nodes_st, st.lists(st.tuples(st.integers(0, 23), st.integers(1, 8)), max_size=10), st.sampled_from([1, 2, 4, 8]))
def test_counts_add_up_and_match_a_recount_per_node(raw: list[tuple], holds: list[tuple[int, int]], probe: int) -> None:
    nodes = [_node(i, z, r, g, min(b, g), m, ready, pods) for i, (z, r, g, b, m, ready, pods) in enumerate(raw)]
    arrays = ClusterArrays(nodes, LEVELS, ModelTable())
    pending = [
        (Reservation(f"j{h}", 1, "c", (), {"w": PodShape(gpus=g)}), ReservedReplica("w", 0, nodes[i % len(nodes)].name))
        for h, (i, g) in enumerate(holds)
    ]
    arrays.set_pending(pending)
    occ = occupancy(arrays, probe)

    # the recount: straight from the nodes and the holds on them
    held_gpus = {n.name: 0 for n in nodes}
    held_pods = {n.name: 0 for n in nodes}
    for res, rep in pending:
        held_gpus[rep.node] += res.shapes["w"].gpus
        held_pods[rep.node] += 1
    free, room, whole = {}, {}, {}
    for n in nodes:
        eff = max(n.free_whole_gpus - held_gpus[n.name], 0) if n.ready else 0
        free[n.name] = eff
        pods = max(n.pods_free - held_pods[n.name], 0) if n.ready else 0
        room[n.name] = min(eff // probe, pods) if n.gpus else 0
        whole[n.name] = bool(n.gpus) and eff == len(n.gpus)

    for counts in (*occ.gpus, *(d.gpus for d in occ.domains)):
        parts = (counts.free, counts.reserved, counts.used, counts.unavailable)
        assert min(parts) >= 0 and sum(parts) == counts.total
    for model_counts in occ.gpus:
        of_model = [n for n in nodes if n.gpus and n.gpu_model == model_counts.model]
        assert model_counts.total == sum(len(n.gpus) for n in of_model)
        assert model_counts.free == sum(free[n.name] for n in of_model)
        assert model_counts.reserved == sum(min(held_gpus[n.name], n.free_whole_gpus) for n in of_model if n.ready)
    assert sum(d.nodes for d in occ.domains) == len(nodes)
    assert sum(d.gpus.total for d in occ.domains) == sum(len(n.gpus) for n in nodes)

    depth = picture_depth(arrays)
    members: dict[tuple, list[Node]] = {}
    for n in nodes:
        path = n.topology[: depth + 1] if depth is not None else ()
        # a node without the label is a domain of its own (the core's rule)
        key = path if None not in path else (*path, n.name)
        members.setdefault(key, []).append(n)
    assert len(members) == len(occ.domains)
    by_counts = sorted(
        (sum(room[n.name] for n in ms), sum(free[n.name] for n in ms), sum(whole[n.name] for n in ms), len(ms))
        for ms in members.values()
    )
    assert by_counts == sorted((d.probe_replicas, d.gpus.free, d.whole_free_nodes, d.nodes) for d in occ.domains)
    assert occ.largest_probe_replicas == max(d.probe_replicas for d in occ.domains)


def test_the_picture_is_drawn_at_the_finest_level_most_nodes_are_labelled_with() -> None:
    labelled = [_node(i, "z1", f"r{i % 2}", 8, 0, "H100", True, 8) for i in range(4)]
    assert picture_depth(ClusterArrays(labelled, LEVELS, ModelTable())) == 1
    few = [_node(i, "z1", "r1" if i == 0 else None, 8, 0, "H100", True, 8) for i in range(4)]
    arrays = ClusterArrays(few, LEVELS, ModelTable())
    assert picture_depth(arrays) == 0  # one node in four has a rack: the zones are the picture
    assert [d.path for d in occupancy(arrays).domains] == [("z1",)]
    assert picture_depth(ClusterArrays(labelled, (HOSTNAME_LABEL,), ModelTable())) is None
    assert occupancy(ClusterArrays(labelled, (HOSTNAME_LABEL,), ModelTable())).level == ""
