"""Hypothesis properties: no over-allocation, capacity == successive allocations, exact release,
gangs inside one required domain, overlay counts every reserved replica exactly once."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.allocation import allocate, release
from placement.dra import device_slices
from placement.errors import CapacityError
from placement.fit import capacity
from placement.model import DraDevice, DraRequest, Gpu, MigInstance, Node, PodShape
from placement.overlay import BoundReplicas, ReportedNodes, Reservation, ReservedPart, effective_nodes
from placement.topology import GangPlacement, domain_of, fit_gang
from tests.placement.builders import BLOCK, GIB, GPU_TAINT, GPU_TOLERATION, LEVELS, RACK, job, node

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILES = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 4}
MIG_STARTS = {"1g.10gb": range(7), "2g.20gb": (0, 2, 4), "3g.40gb": (0, 4)}


@st.composite
def mig_layout(draw: st.DrawFn) -> tuple[MigInstance, ...]:
    """A valid (non-overlapping) set of MIG instances on one 8-slice GPU."""
    taken = 0
    out = []
    for _ in range(draw(st.integers(1, 7))):
        profile = draw(st.sampled_from(sorted(PROFILES)))
        size = PROFILES[profile]
        start = draw(st.sampled_from(list(MIG_STARTS[profile])))
        span = ((1 << size) - 1) << start
        if taken & span:
            continue
        taken |= span
        out.append(MigInstance(profile, None, start, size, draw(st.booleans())))
    return tuple(out)


@st.composite
def gpus(draw: st.DrawFn) -> tuple[Gpu, ...]:
    n = draw(st.sampled_from([0, 2, 4, 8]))
    out = []
    for i in range(n):
        if draw(st.integers(0, 3)) == 0:
            out.append(Gpu(i, "H100", 81559, mig=draw(mig_layout())))
        else:
            out.append(
                Gpu(
                    i,
                    "H100",
                    81559,
                    draw(st.sampled_from([0, 0, 0, 0, 0, 250, 500, 700, 1000])),
                    healthy=draw(st.integers(0, 9)) > 0,
                )
            )
    return tuple(out)


def dra_device(i: int, allocated: bool) -> DraDevice:
    return DraDevice(
        "gpu.nvidia.com",
        "p",
        f"gpu-{i}",
        {"type": "gpu", "uuid": f"U{i}", "productName": "NVIDIA H200"},
        {"memory": 141 * GIB},
        allocated,
    )


def dyn_mig(parent: int, start: int, size: int, allocated: bool) -> DraDevice:
    return DraDevice(
        "gpu.nvidia.com",
        "p",
        f"gpu-{parent}-mig-{start}-{size}",
        {"type": "mig", "parentUUID": f"U{parent}", "profile": f"{size}s"},
        {f"memorySlice{k}": 1 for k in range(start, start + size)},
        allocated,
    )


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    devs = draw(gpus())
    dra: list[DraDevice] = []
    for i in range(draw(st.sampled_from([0, 2, 3]))):
        dra.append(dra_device(i, False))
        for start, size in ((0, 4), (4, 4), (0, 2), (2, 2)):
            if draw(st.booleans()):
                dra.append(dyn_mig(i, start, size, False))
    # Mark a consistent subset allocated: never two overlapping devices.
    busy: dict[str, int] = {}
    final = []
    for d in dra:
        sl = device_slices(d)
        assert sl is not None
        if draw(st.integers(0, 3)) == 0 and not busy.get(sl[0], 0) & sl[1]:
            busy[sl[0]] = busy.get(sl[0], 0) | sl[1]
            d = DraDevice(d.driver, d.pool, d.name, d.attributes, d.capacity, True)
        final.append(d)
    cpu = draw(st.sampled_from([0, 8, 64, 64, 64, 64])) * 1000
    mem = draw(st.sampled_from([0, 16, 64, 64, 64])) * GIB
    return Node(
        name="n",
        labels={},
        taints=(GPU_TAINT,),
        cpu_milli_allocatable=cpu,
        cpu_milli_free=cpu,
        memory_allocatable=mem,
        memory_free=mem,
        pods_free=draw(st.sampled_from([0, 3, 20, 20, 20])),
        gpus=devs,
        extended_free={"nvidia.com/mig-1g.10gb": draw(st.integers(0, 7))} if draw(st.booleans()) else {},
        dra_devices=tuple(final),
    )


@st.composite
def shapes(draw: st.DrawFn) -> PodShape:
    kind = draw(st.sampled_from(["whole", "share", "mig", "dra", "cpu"]))
    cpu = draw(st.sampled_from([0, 1, 4, 8])) * 1000
    mem = draw(st.sampled_from([0, 1, 8])) * GIB
    common = dict(cpu_milli=cpu, memory=mem, tolerations=(GPU_TOLERATION,))
    if kind == "whole":
        return PodShape(gpus=draw(st.integers(1, 4)), **common)  # type: ignore[arg-type]
    if kind == "share":
        return PodShape(
            gpus=draw(st.integers(1, 2)), gpu_milli=draw(st.sampled_from([100, 250, 300, 500, 1000])), **common
        )  # type: ignore[arg-type]
    if kind == "mig":
        return PodShape(
            mig_profile=draw(st.sampled_from(sorted(PROFILES))), mig_count=draw(st.integers(1, 2)), **common
        )  # type: ignore[arg-type]
    if kind == "dra":
        reqs = [DraRequest(draw(st.sampled_from(["gpu.nvidia.com", "mig.nvidia.com"])), (), draw(st.integers(1, 2)))]
        if draw(st.booleans()):
            reqs.append(DraRequest("mig.nvidia.com", (), 1))
        return PodShape(dra=tuple(reqs), **common)  # type: ignore[arg-type]
    return PodShape(**common)  # type: ignore[arg-type]


def check_invariants(n: Node) -> None:
    for g in n.gpus:
        assert 0 <= g.milli_used <= 1000
    assert n.cpu_milli_free >= 0 and n.memory_free >= 0 and n.pods_free >= 0
    assert all(v >= 0 for v in n.extended_free.values())
    busy: dict[str, int] = {}
    for d in n.dra_devices:
        if d.allocated:
            sl = device_slices(d)
            assert sl is not None
            assert not busy.get(sl[0], 0) & sl[1], f"overlapping DRA devices allocated: {d.name}"
            busy[sl[0]] = busy.get(sl[0], 0) | sl[1]


@st.composite
def mig_nodes(draw: st.DrawFn) -> Node:
    """Nodes whose GPUs are all in MIG mode, with room for pods."""
    devs = tuple(Gpu(i, "A100", 81920, mig=draw(mig_layout())) for i in range(draw(st.integers(1, 4))))
    return Node(
        "m",
        cpu_milli_free=64000,
        memory_free=64 * GIB,
        pods_free=draw(st.integers(1, 30)),
        gpus=devs,
        taints=(GPU_TAINT,),
    )


@st.composite
def mig_shapes(draw: st.DrawFn) -> PodShape:
    return PodShape(
        mig_profile=draw(st.sampled_from(sorted(PROFILES))),
        mig_count=draw(st.integers(1, 2)),
        cpu_milli=draw(st.sampled_from([0, 1000])),
        tolerations=(GPU_TOLERATION,),
    )


@SETTINGS
@given(mig_nodes(), mig_shapes())
def test_mig_never_over_allocated(n: Node, s: PodShape) -> None:
    check_allocation_loop(n, s)


@SETTINGS
@given(nodes(), shapes())
def test_never_over_allocate_and_capacity_counts_allocations(n: Node, s: PodShape) -> None:
    check_allocation_loop(n, s)


def check_allocation_loop(n: Node, s: PodShape) -> None:
    check_invariants(n)
    expected = capacity(n, s).count
    current = n
    done = 0
    while capacity(current, s).count > 0:
        before = current
        current, alloc = allocate(current, s)
        check_invariants(current)
        # every MIG instance and DRA device taken was free before
        for idx, start in alloc.mig:
            (inst,) = [i for g in before.gpus if g.index == idx for i in g.mig if i.start == start]
            assert not inst.used and inst.profile == s.mig_profile
        before_dra = {d.key: d for d in before.dra_devices}
        assert len(set(alloc.dra)) == len(alloc.dra)
        assert all(not before_dra[k].allocated for k in alloc.dra)
        assert len(alloc.gpus) == s.gpus and len({i for i, _ in alloc.gpus}) == s.gpus
        done += 1
        assert done <= 200
    assert done == expected
    if expected:
        many, _ = allocate(n, s, expected)
        assert capacity(many, s).count == 0
    try:
        allocate(n, s, expected + 1)
    except CapacityError:
        pass
    else:
        raise AssertionError("allocate beyond capacity must fail")


@SETTINGS
@given(nodes(), shapes(), st.integers(1, 4))
def test_allocate_then_release_restores_exactly(n: Node, s: PodShape, r: int) -> None:
    r = min(r, capacity(n, s).count)
    if r == 0:
        return
    after, alloc = allocate(n, s, r)
    assert release(after, alloc) == n


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    out = []
    for i in range(draw(st.integers(2, 12))):
        out.append(
            node(
                f"n{i}",
                gpus=draw(st.sampled_from([4, 8])),
                used=range(draw(st.sampled_from([0, 0, 2, 4, 8]))),
                block=draw(st.sampled_from(["b1", "b2", None])),
                rack=draw(st.sampled_from(["r1", "r2", "r3", None])),
                cpu=draw(st.integers(4, 64)),
            )
        )
    return out


@SETTINGS
@given(clusters(), st.integers(1, 8), st.sampled_from([1, 2, 4, 8]), st.sampled_from([RACK, BLOCK]), st.booleans())
def test_gang_never_spans_two_required_domains(
    ns: list[Node], count: int, per: int, level: str, with_head: bool
) -> None:
    from tests.placement.builders import shape

    sets = [("w", count, shape(per, cpu=2))]
    if with_head:
        sets.insert(0, ("head", 1, shape(0, cpu=4)))
    j = job(*sets, required=level, min_available=max(1, count // 2) + (1 if with_head else 0))
    result = fit_gang(ns, j, LEVELS)
    if not isinstance(result, GangPlacement):
        return
    depth = LEVELS.index(level)
    by_name = {n.name: n for n in ns}
    assert len({domain_of(by_name[a.node], LEVELS, depth) for a in result.assignments}) == 1
    assert result.total >= j.min_replicas
    for ps in j.pod_sets:
        assert sum(a.replicas for a in result.assignments if a.pod_set == ps.name) == result.counts[ps.name]
    # the assignment really fits: allocate it replica set by replica set
    state = dict(by_name)
    shapes_by = {ps.name: ps.shape for ps in j.pod_sets}
    for a in result.assignments:
        state[a.node], _ = allocate(state[a.node], shapes_by[a.pod_set], a.replicas)


@SETTINGS
@given(
    clusters(),
    st.lists(st.tuples(st.integers(0, 11), st.integers(1, 3), st.integers(0, 3)), max_size=6),
    st.sampled_from([1, 2, 4]),
)
def test_overlay_counts_every_reserved_replica_once(
    ns: list[Node], wanted: list[tuple[int, int, int]], per: int
) -> None:
    from tests.placement.builders import shape

    s = shape(per, cpu=1)
    base = {n.name: n for n in ns}
    full = dict(base)  # every reserved replica taken
    report = dict(base)  # only the bound ones taken (what the cluster reports)
    reservations = []
    bound = []
    for k, (idx, replicas, nbound) in enumerate(wanted):
        name = ns[idx % len(ns)].name
        replicas = min(replicas, capacity(full[name], s).count)
        if replicas == 0:
            continue
        nbound = min(nbound, replicas)
        full[name], _ = allocate(full[name], s, replicas)
        if nbound:
            report[name], _ = allocate(report[name], s, nbound)
        reservations.append(Reservation(f"g{k}", 1, (ReservedPart("w", name, replicas, s),)))
        bound.append(BoundReplicas(f"g{k}", 1, {("w", name): nbound}))
    eff = effective_nodes(ReportedNodes("c", 1, tuple(report[n.name] for n in ns)), reservations, bound)
    for e in eff:
        f = full[e.name]
        assert (e.free_whole_gpus, e.cpu_milli_free, e.memory_free, e.pods_free) == (
            f.free_whole_gpus,
            f.cpu_milli_free,
            f.memory_free,
            f.pods_free,
        )


@SETTINGS
@given(clusters(), st.integers(1, 6), st.sampled_from([1, 2, 4, 8]), st.sampled_from([RACK, BLOCK]))
def test_gang_takes_the_feasible_domain_with_least_leftover(ns: list[Node], count: int, per: int, level: str) -> None:
    from tests.placement.builders import shape

    j = job(("w", count, shape(per, cpu=2)), required=level)
    result = fit_gang(ns, j, LEVELS)
    depth = LEVELS.index(level)
    groups: dict[tuple[str, ...], list[Node]] = {}
    for n in ns:
        groups.setdefault(domain_of(n, LEVELS, depth), []).append(n)
    alone = {dom: fit_gang(members, j, LEVELS) for dom, members in groups.items()}
    feasible = {dom: r for dom, r in alone.items() if isinstance(r, GangPlacement)}
    if not isinstance(result, GangPlacement):
        assert not feasible
        return
    assert result.domain in feasible
    assert result.leftover_gpus == min(r.leftover_gpus for r in feasible.values())


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "1", "2Gi", "500m", "x", "Always", "In"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "spec",
                    "containers",
                    "initContainers",
                    "resources",
                    "requests",
                    "limits",
                    "cpu",
                    "memory",
                    "nvidia.com/gpu",
                    "tandem.dev/gpu-milli",
                    "nvidia.com/mig-1g.10gb",
                    "name",
                    "restartPolicy",
                    "nodeSelector",
                    "affinity",
                    "nodeAffinity",
                    "tolerations",
                    "overhead",
                    "resourceClaims",
                    "resourceClaimName",
                    "status",
                    "phase",
                    "nodeName",
                    "key",
                    "operator",
                    "values",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@SETTINGS
@given(JSON)
def test_podspec_never_crashes_on_garbage(pod: object) -> None:
    from placement.errors import PodSpecError
    from placement.podspec import holds_resources, shape_from_pod

    try:
        shape_from_pod(pod, {})  # type: ignore[arg-type]
    except PodSpecError:
        pass
    if isinstance(pod, dict):
        assert holds_resources(pod) in (True, False)


LEAF = st.sampled_from([None, True, -1, 0, 2, "", "1", "2Gi", "500m", "x", "1.5", "-1", "250", "1500"]) | st.lists(
    st.integers(), max_size=2
)


def bad(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the well-formed value, one time in eight a wrong-typed or garbage leaf."""
    return st.integers(0, 7).flatmap(lambda k: LEAF if k == 0 else good)


QTY = st.sampled_from(["1", "2Gi", "500m", "250", "4", "-1", "1.5", "x", "1e3"]) | LEAF
RESOURCES = st.dictionaries(
    st.sampled_from(
        [
            "cpu",
            "memory",
            "nvidia.com/gpu",
            "tandem.dev/gpu-milli",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-3g.40gb",
            "example.com/x",
        ]
    ),
    QTY,
    max_size=3,
)
CONTAINER = bad(
    st.fixed_dictionaries(
        {"name": st.just("c")},
        optional={
            "resources": bad(
                st.fixed_dictionaries({}, optional={"requests": bad(RESOURCES), "limits": bad(RESOURCES)})
            ),
            "restartPolicy": bad(st.sampled_from(["Always", "Never"])),
        },
    )
)
EXPR = st.fixed_dictionaries(
    {
        "key": bad(st.sampled_from(["nvidia.com/gpu.product", "zone"])),
        "operator": bad(st.sampled_from(["In", "Exists", "NotIn"])),
    },
    optional={"values": bad(st.lists(st.sampled_from(["A", "B"]), max_size=2))},
)
TERM = bad(st.fixed_dictionaries({}, optional={"matchExpressions": bad(st.lists(bad(EXPR), max_size=2))}))
POD = st.fixed_dictionaries(
    {
        "spec": st.fixed_dictionaries(
            {"containers": bad(st.lists(CONTAINER, max_size=2))},
            optional={
                "initContainers": bad(st.lists(CONTAINER, max_size=2)),
                "overhead": bad(RESOURCES),
                "nodeSelector": bad(
                    st.dictionaries(
                        st.sampled_from(["nvidia.com/gpu.product", "zone"]), st.sampled_from(["A", "z"]), max_size=2
                    )
                ),
                "tolerations": bad(
                    st.lists(
                        bad(st.fixed_dictionaries({}, optional={"key": LEAF, "operator": LEAF, "effect": LEAF})),
                        max_size=2,
                    )
                ),
                "affinity": bad(
                    st.fixed_dictionaries(
                        {
                            "nodeAffinity": bad(
                                st.fixed_dictionaries(
                                    {
                                        "requiredDuringSchedulingIgnoredDuringExecution": bad(
                                            st.fixed_dictionaries(
                                                {"nodeSelectorTerms": bad(st.lists(TERM, max_size=2))}
                                            )
                                        )
                                    }
                                )
                            )
                        }
                    )
                ),
                "resourceClaims": bad(
                    st.lists(
                        bad(
                            st.fixed_dictionaries(
                                {"name": st.just("g")},
                                optional={"resourceClaimName": bad(st.sampled_from(["claim", ""]))},
                            )
                        ),
                        max_size=2,
                    )
                ),
                "resources": bad(st.fixed_dictionaries({}, optional={"requests": bad(RESOURCES)})),
            },
        )
    },
    optional={
        "status": bad(st.fixed_dictionaries({}, optional={"phase": bad(st.sampled_from(["Running", "Succeeded"]))}))
    },
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(POD)
def test_podspec_never_crashes_on_malformed_pods(pod: dict[str, object]) -> None:
    from placement.errors import PodSpecError
    from placement.podspec import shape_from_pod

    try:
        s = shape_from_pod(pod, {"claim": [DraRequest("gpu.nvidia.com", (), 1)]})
    except PodSpecError as exc:
        assert exc.field
        return
    assert s.cpu_milli >= 0 and s.memory >= 0 and s.gpus >= 0 and 0 < s.gpu_milli <= 1000
