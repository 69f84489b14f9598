"""The fleet's numpy pre-screen (fleetplan.arrays) held to the exact fit over random clusters and requests.

It is an upper bound: it may say "could fit" where the exact fit says no, never "cannot fit" where the exact
fit places the replica or the gang. Per node, `ClusterArrays.capacity` >= `placement.fit.capacity` (and equal
for whole-GPU and CPU/memory shapes on a node whose taints and labels admit the pod, as its docstring says);
per cluster, a gang the core's `fit_gang` places is never ruled out by `Fleet.prune`, `could_hold` or
`candidate_domains` (whose domains must include the one the gang went to).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.arrays import ClusterArrays, Fleet
from fleetplan.catalog import Reservation, ReservedReplica
from fleetplan.decide import demands_of
from placement import mig, overlay
from placement.allocation import allocate
from placement.fit import capacity, node_admits
from placement.model import (
    DEFAULT_RACK_LABEL,
    GPU_PRODUCT_LABEL,
    HOSTNAME_LABEL,
    WHOLE_GPU_MILLI,
    ZONE_LABEL,
    Gpu,
    JobRequest,
    Node,
    PodSet,
    PodShape,
    Taint,
    TopologyLevels,
)
from placement.topology import GangPlacement, fit_gang
from tests.placement.builders import GPU_TAINT, GPU_TOLERATION, mig_inst

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LEVELS = (ZONE_LABEL, DEFAULT_RACK_LABEL, HOSTNAME_LABEL)
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
MIG_1G = "1g.10gb"


@st.composite
def nodes(draw: st.DrawFn, i: int) -> Node:
    """A node as an agent reports it: GPUs of one model (free, shared, busy, broken or in MIG mode), MIG as
    extended counts, taints, readiness and a topology path (the rack may be missing)."""
    n = draw(st.sampled_from([0, 1, 2, 4, 8, 8]))
    model = draw(st.sampled_from([H100, A100]))
    memory = 81920 if model == H100 else 40960
    gpus = []
    for k in range(n):
        if model == A100 and draw(st.integers(0, 5)) == 0:
            starts = draw(st.lists(st.integers(0, 6), min_size=1, max_size=7, unique=True))
            gpus.append(Gpu(k, model, memory, mig=tuple(mig_inst(MIG_1G, s, 1, draw(st.booleans())) for s in starts)))
        else:
            gpus.append(
                Gpu(
                    k,
                    model,
                    memory,
                    draw(st.sampled_from([0, 0, 0, 250, 500, 1000])),
                    healthy=draw(st.integers(0, 15)) > 0,
                )
            )
    extended = {mig.resource_name(MIG_1G): draw(st.integers(0, 14))} if n == 0 and draw(st.booleans()) else {}
    name = f"n{i}"
    return Node(
        name=name,
        # GPU feature discovery labels every GPU node with its product (MIG-only nodes too)
        labels={GPU_PRODUCT_LABEL: model} if n or extended else {},
        taints=draw(st.sampled_from([(), (GPU_TAINT,), (GPU_TAINT,), (Taint("dedicated", "x", "NoSchedule"),)])),
        ready=draw(st.integers(0, 9)) > 0,
        cordoned=draw(st.integers(0, 9)) == 0,
        cpu_milli_allocatable=64000,
        cpu_milli_free=draw(st.sampled_from([64000, 64000, 16000, 4000, 0])),
        memory_allocatable=512 << 30,
        memory_free=draw(st.sampled_from([512 << 30, 512 << 30, 64 << 30, 0])),
        pods_free=draw(st.sampled_from([110, 110, 4, 1, 0])),
        gpus=tuple(gpus),
        extended_free=extended,
        topology=(draw(st.sampled_from(["z1", "z2"])), draw(st.sampled_from(["r1", "r2", "r3", None])), name),
    )


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    return [draw(nodes(i)) for i in range(draw(st.integers(1, 10)))]


@st.composite
def shapes(draw: st.DrawFn) -> PodShape:
    kind = draw(st.sampled_from(["whole", "whole", "share", "mig", "cpu"]))
    common: dict[str, object] = dict(
        cpu_milli=draw(st.sampled_from([0, 1000, 8000])),
        memory=draw(st.sampled_from([0, 1, 64])) << 30,
        tolerations=draw(st.sampled_from([(GPU_TOLERATION,), (GPU_TOLERATION,), ()])),
    )
    if kind != "cpu" and draw(st.integers(0, 2)) == 0:
        common["gpu_models"] = frozenset(
            draw(st.lists(st.sampled_from([H100, A100, "Tesla-T4"]), min_size=1, max_size=2))
        )
    if kind != "cpu" and draw(st.integers(0, 4)) == 0:
        common["min_gpu_memory_mib"] = draw(st.sampled_from([40000, 80000]))
    if kind == "whole":
        return PodShape(gpus=draw(st.sampled_from([1, 1, 2, 3, 4, 8])), **common)  # type: ignore[arg-type]
    if kind == "share":
        return PodShape(
            gpus=draw(st.sampled_from([1, 1, 2])), gpu_milli=draw(st.sampled_from([250, 500, 750])), **common
        )  # type: ignore[arg-type]
    if kind == "mig":
        return PodShape(mig_profile=MIG_1G, mig_count=draw(st.integers(1, 3)), **common)  # type: ignore[arg-type]
    return PodShape(**common)  # type: ignore[arg-type]


def _exactly_modelled(shape: PodShape) -> bool:
    """Shapes the arrays count exactly (ClusterArrays.capacity): whole GPUs, or CPU and memory only."""
    return shape.mig_count == 0 and not shape.dra and (shape.gpus == 0 or shape.gpu_milli >= WHOLE_GPU_MILLI)


@SETTINGS
@given(clusters(), st.lists(shapes(), min_size=1, max_size=5), st.sets(st.integers(0, 9), max_size=3))
def test_node_capacity_is_an_upper_bound_of_the_exact_fit(
    ns: list[Node], asked: list[PodShape], excluded: set[int]
) -> None:
    fleet = Fleet()
    arrays = ClusterArrays(ns, LEVELS, fleet.models)
    arrays.set_excluded(f"n{i}" for i in excluded)
    for shape in asked:
        caps = arrays.capacity(shape)
        for i, n in enumerate(ns):
            exact = 0 if i in excluded else capacity(n, shape).count
            assert caps[i] >= exact, (n, shape, int(caps[i]), exact)
            if _exactly_modelled(shape) and node_admits(n, shape) is None and i not in excluded:
                assert caps[i] == exact, (n, shape, int(caps[i]), exact)


@SETTINGS
@given(
    clusters(),
    st.lists(st.tuples(shapes(), st.integers(1, 4)), min_size=1, max_size=2),
    st.sampled_from([None, ZONE_LABEL, DEFAULT_RACK_LABEL, HOSTNAME_LABEL]),
)
def test_a_gang_the_exact_fit_places_is_never_pruned(
    ns: list[Node], sets: list[tuple[PodShape, int]], level: str | None
) -> None:
    req = JobRequest(
        "j", tuple(PodSet(f"s{k}", count, shape) for k, (shape, count) in enumerate(sets)), required_level=level
    )
    placed = fit_gang(ns, req, TopologyLevels(LEVELS))
    if not isinstance(placed, GangPlacement):
        return
    fleet = Fleet()
    arrays = ClusterArrays(ns, LEVELS, fleet.models)
    fleet.put("c", arrays)
    fleet.set_usable("c", True)
    demands = demands_of(req)
    depth = LEVELS.index(level) if level is not None else None
    assert fleet.prune(demands) == ["c"]
    assert arrays.could_hold(demands, depth)
    cands = arrays.candidate_domains(demands, depth, limit=len(ns))
    used = {arrays.row[name] for name in placed.nodes}
    assert any(used <= {int(r) for r in c.rows} for c in cands), (placed.domain, [c.path for c in cands])


def _overlaid(
    ns: list[Node], holds: list[tuple[PodShape, int, int]], fleet: Fleet | None = None
) -> tuple[list[Node], ClusterArrays]:
    """The exact overlay (core) and the arrays' overlay (pend_* columns) of the same reserved-but-unbound
    replicas: (shape, node index, replicas) holds, kept only where the exact fit placed them in order (as the
    broker reserves what `fit_gang` placed)."""
    state = list(ns)
    pending = []
    reservations = []
    for h, (shape, i, k) in enumerate(holds):
        i %= len(ns)
        if capacity(state[i], shape).count < k:
            continue
        state[i], _ = allocate(state[i], shape, k)
        replicas = tuple(ReservedReplica("w", r, ns[i].name) for r in range(k))
        pending += [(Reservation(f"j{h}", 1, "c", replicas, {"w": shape}), rep) for rep in replicas]
        reservations.append(overlay.Reservation(f"j{h}", 1, (overlay.ReservedPart("w", ns[i].name, k, shape),)))
    exact = overlay.effective_nodes(overlay.ReportedNodes("c", 1, tuple(ns)), reservations)
    arrays = ClusterArrays(ns, LEVELS, (fleet or Fleet()).models)
    arrays.set_pending(pending)
    return list(exact), arrays


@SETTINGS
@given(
    clusters(),
    st.lists(st.tuples(shapes(), st.integers(0, 9), st.integers(1, 3)), max_size=4),
    st.lists(shapes(), min_size=1, max_size=4),
)
def test_node_capacity_under_the_overlay_is_an_upper_bound_of_the_exact_fit(
    ns: list[Node], holds: list[tuple[PodShape, int, int]], asked: list[PodShape]
) -> None:
    exact_nodes, arrays = _overlaid(ns, holds)
    for shape in asked:
        caps = arrays.capacity(shape)
        for i, n in enumerate(exact_nodes):
            exact = capacity(n, shape).count
            assert caps[i] >= exact, (ns[i], holds, shape, int(caps[i]), exact)


@SETTINGS
@given(
    clusters(),
    st.lists(st.tuples(shapes(), st.integers(0, 9), st.integers(1, 3)), min_size=1, max_size=4),
    st.lists(st.tuples(shapes(), st.integers(1, 4)), min_size=1, max_size=2),
    st.sampled_from([None, ZONE_LABEL, DEFAULT_RACK_LABEL, HOSTNAME_LABEL]),
)
def test_a_gang_the_exact_fit_places_under_the_overlay_is_never_pruned(
    ns: list[Node], holds: list[tuple[PodShape, int, int]], sets: list[tuple[PodShape, int]], level: str | None
) -> None:
    fleet = Fleet()
    exact_nodes, arrays = _overlaid(ns, holds, fleet)
    req = JobRequest(
        "j", tuple(PodSet(f"s{k}", count, shape) for k, (shape, count) in enumerate(sets)), required_level=level
    )
    placed = fit_gang(exact_nodes, req, TopologyLevels(LEVELS))
    if not isinstance(placed, GangPlacement):
        return
    fleet.put("c", arrays)
    fleet.set_usable("c", True)
    demands = demands_of(req)
    depth = LEVELS.index(level) if level is not None else None
    assert fleet.prune(demands) == ["c"], (holds, sets)
    assert arrays.could_hold(demands, depth), (holds, sets)
    cands = arrays.candidate_domains(demands, depth, limit=len(ns))
    used = {arrays.row[name] for name in placed.nodes}
    assert any(used <= {int(r) for r in c.rows} for c in cands), (placed.domain, [c.path for c in cands])


@SETTINGS
@given(
    st.lists(st.sampled_from([0, 0, 0, 250, 500, 750, 1000]), min_size=1, max_size=8),
    st.lists(st.tuples(st.sampled_from([1, 1, 2]), st.sampled_from([250, 500, 750]), st.integers(1, 3)), max_size=4),
)
def test_whole_gpus_left_by_share_holds_are_bounded_from_above(
    milli_used: list[int], share_holds: list[tuple[int, int, int]]
) -> None:
    """Shares held on a node that has partly used GPUs: the whole GPUs the exact fit leaves are never more than
    the arrays say (shares first fill partly used GPUs, however the exact fit packs them)."""
    node = Node(
        "n0",
        cpu_milli_free=64000,
        memory_free=512 << 30,
        topology=("z1", "r1", "n0"),
        gpus=tuple(Gpu(k, H100, 81920, milli_used=m) for k, m in enumerate(milli_used)),
    )
    holds = [(PodShape(gpus=g, gpu_milli=milli), 0, k) for g, milli, k in share_holds]
    exact_nodes, arrays = _overlaid([node], holds)
    for gpus in (1, 2, 4):
        whole = PodShape(gpus=gpus)
        assert arrays.capacity(whole)[0] >= capacity(exact_nodes[0], whole).count, (milli_used, share_holds, gpus)


def test_share_holds_packed_on_one_gpu_leave_whole_gpus_free() -> None:
    """The exact fit packs held shares on one device; the bound must not count each share as a whole GPU gone."""
    node = Node(
        "n0",
        cpu_milli_free=64000,
        memory_free=512 << 30,
        topology=("z1", "r1", "n0"),
        gpus=(Gpu(0, H100, 81920), Gpu(1, H100, 81920)),
    )
    share, whole = PodShape(gpus=1, gpu_milli=250), PodShape(gpus=1)
    exact_nodes, arrays = _overlaid([node], [(share, 0, 2)])
    assert capacity(exact_nodes[0], whole).count == 1  # both shares on GPU 0, GPU 1 still whole
    assert arrays.capacity(whole)[0] == 1  # the bound, and here exact: 500 milli of shares spill onto one GPU


def test_share_holds_fill_partly_used_gpus_before_whole_ones() -> None:
    """A share held where a partly used GPU has room takes no whole GPU; one larger than that room takes one."""
    node = Node(
        "n0",
        cpu_milli_free=64000,
        memory_free=512 << 30,
        topology=("z1", "r1", "n0"),
        gpus=(Gpu(0, H100, 81920, milli_used=500), Gpu(1, H100, 81920), Gpu(2, H100, 81920)),
    )
    whole = PodShape(gpus=1)
    for held, whole_left in ((PodShape(gpus=1, gpu_milli=500), 2), (PodShape(gpus=1, gpu_milli=750), 1)):
        exact_nodes, arrays = _overlaid([node], [(held, 0, 1)])
        assert capacity(exact_nodes[0], whole).count == whole_left
        assert arrays.capacity(whole)[0] == whole_left
