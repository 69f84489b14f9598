"""The placement decision over a catalog: tables of fleets and gangs, whole decisions asserted."""

from __future__ import annotations

import pytest

from fleetplan.catalog import Catalog, ClusterMeta, InventoryReport, Level, Reservation, ReservedReplica
from fleetplan.decide import WaitReason, could_ever_fit, decide
from fleetplan.view import FleetView
from placement.model import Gpu, JobRequest, Node, PodSet, PodShape

LEVELS = (Level("zone", "z"), Level("rack", "r"), Level("host", "h"))
H100, A100 = "H100", "A100"


def mk(name: str, *, gpus: int = 8, free: int | None = None, model: str = H100, rack: str = "r1") -> Node:
    free = gpus if free is None else free
    return Node(
        name=name,
        cpu_milli_allocatable=64000,
        cpu_milli_free=64000,
        memory_allocatable=1 << 40,
        memory_free=1 << 40,
        gpus=tuple(Gpu(i, model, 81920, 0 if i < free else 1000) for i in range(gpus)),
        topology=("z1", rack, name),
    )


def fleet(**clusters: list[Node]) -> Catalog:
    c = Catalog(stale_after_s=30)
    for name, nodes in clusters.items():
        c.connect(ClusterMeta(name, region="eu", levels=LEVELS), now=0.0)
        c.apply_report(InventoryReport(name, 1, True, 0.0, tuple(nodes)), now=0.0)
    return c


def job(
    gpus: int = 8,
    replicas: int = 1,
    *,
    level: str | None = None,
    models: tuple[str, ...] = (),
    min_available: int | None = None,
    locality: tuple[str, ...] = (),
) -> JobRequest:
    shape = PodShape(gpus=gpus, gpu_models=frozenset(models))
    return JobRequest(
        "j",
        (PodSet("w", replicas, shape),),
        tenant="t",
        required_level=level,
        min_available=min_available,
        locality=locality,
    )


@pytest.mark.parametrize(
    ("clusters", "request_", "want_cluster", "want_nodes"),
    [
        # 16 free GPUs as 2 per node do not hold one 8-GPU pod; one whole node elsewhere does.
        ({"frag": [mk(f"f{i}", free=2) for i in range(8)], "whole": [mk("w1")]}, job(8), "whole", ["w1"]),
        # One rack must hold the gang: spread nodes lose to a full rack.
        (
            {
                "spread": [mk(f"s{i}", rack=f"r{i}") for i in range(4)],
                "rack": [mk(f"k{i}", rack="rA") for i in range(4)],
            },
            job(8, 4, level="rack"),
            "rack",
            ["k0", "k1", "k2", "k3"],
        ),
        # Best fit: a 4-GPU pod goes to the node with 4 free, keeping the whole node whole.
        ({"c": [mk("big"), mk("half", free=4, rack="r2")]}, job(4), "c", ["half"]),
        # Model constraint.
        ({"h": [mk("h1")], "a": [mk("a1", model=A100)]}, job(8, models=(A100,)), "a", ["a1"]),
        # Levels may be named by label key too.
        ({"c": [mk("x", rack="r1"), mk("y", rack="r2"), mk("z", rack="r2")]}, job(8, 2, level="r"), "c", ["y", "z"]),
    ],
)
def test_decisions(
    clusters: dict[str, list[Node]], request_: JobRequest, want_cluster: str, want_nodes: list[str]
) -> None:
    d = decide(FleetView(fleet(**clusters), 1.0), request_)
    assert d.choice is not None, d
    assert d.choice.cluster == want_cluster
    assert sorted({p.node for p in d.choice.assignments}) == want_nodes
    assert len(d.choice.assignments) == request_.total_replicas
    assert [p.index for p in d.choice.assignments] == list(range(request_.total_replicas))


@pytest.mark.parametrize(
    ("clusters", "request_", "wait"),
    [
        ({"frag": [mk(f"f{i}", free=2) for i in range(8)]}, job(8), WaitReason.INSUFFICIENT_CAPACITY),
        (
            {"spread": [mk(f"s{i}", rack=f"r{i}") for i in range(4)]},
            job(8, 2, level="rack"),
            WaitReason.TOPOLOGY_FRAGMENTED,
        ),
        ({}, job(8), WaitReason.NO_FRESH_INVENTORY),
    ],
)
def test_waits(clusters: dict[str, list[Node]], request_: JobRequest, wait: WaitReason) -> None:
    d = decide(FleetView(fleet(**clusters), 1.0), request_)
    assert d.choice is None and d.wait is wait


def test_pending_reservations_are_subtracted_by_the_exact_fit() -> None:
    cat = fleet(c=[mk("n1"), mk("n2", rack="r2")])
    cat.add_reservation(Reservation("other", 1, "c", (ReservedReplica("w", 0, "n1"),), {"w": PodShape(gpus=8)}))
    d = decide(FleetView(cat, 1.0), job(8))
    assert d.choice is not None and [p.node for p in d.choice.assignments] == ["n2"]
    cat.add_reservation(Reservation("third", 1, "c", (ReservedReplica("w", 0, "n2"),), {"w": PodShape(gpus=8)}))
    assert decide(FleetView(cat, 1.0), job(8)).choice is None


def test_elastic_gang_starts_with_what_fits_down_to_min_available() -> None:
    cat = fleet(c=[mk("n1"), mk("n2", rack="r2"), mk("n3", free=0, rack="r3")])
    d = decide(FleetView(cat, 1.0), job(8, 4, min_available=2))
    assert d.choice is not None and len(d.choice.assignments) == 2
    assert decide(FleetView(cat, 1.0), job(8, 4, min_available=3)).choice is None


def test_policy_and_selector_restrict_clusters() -> None:
    cat = fleet(a=[mk("a1")], b=[mk("b1")])
    d = decide(FleetView(cat, 1.0), job(8), policy_allows=lambda c: c.name == "b")
    assert d.choice is not None and d.choice.cluster == "b"
    d = decide(FleetView(cat, 1.0), job(8), excluded_clusters={"a", "b"})
    assert d.wait is WaitReason.NO_FRESH_INVENTORY


def test_locality_breaks_ties_between_equal_clusters() -> None:
    cat = fleet(a=[mk("a1")], b=[mk("b1")])
    assert decide(FleetView(cat, 1.0), job(8, locality=("b",))).choice.cluster == "b"  # type: ignore[union-attr]
    assert decide(FleetView(cat, 1.0), job(8, locality=("a",))).choice.cluster == "a"  # type: ignore[union-attr]


def test_could_ever_fit_looks_at_empty_clusters() -> None:
    cat = fleet(c=[mk("n1", free=0), mk("n2", free=0, rack="r2")])
    assert could_ever_fit(FleetView(cat, 1.0), job(8, 2), lambda _c: True)[0] is True
    fits, why = could_ever_fit(FleetView(cat, 1.0), job(16), lambda _c: True)
    assert fits is False and "even empty" in why
    assert could_ever_fit(FleetView(cat, 1.0), job(8, 2, level="rack"), lambda _c: True)[0] is False
    assert could_ever_fit(FleetView(cat, 1.0), job(8), lambda _c: False)[0] is False
    assert could_ever_fit(FleetView(fleet(), 1.0), job(8), lambda _c: True)[0] is None
