"""The decision seam: a cycle's fleet view, the cluster choices behind one interface, and the broker
wiring them with events (placer and dispatcher hold no reference to each other)."""

from __future__ import annotations

import pytest

from fleetplan.catalog import InventoryReport, Reservation, ReservedReplica
from fleetplan.choice import CHOICES, AggregateChoice, RoundRobinChoice, TandemChoice, make_choice
from fleetplan.decide import WaitReason
from fleetplan.view import FleetView, StaleView
from placement.model import PodShape
from tests.broker.test_placer_decide import fleet, job, mk


def test_a_view_goes_stale_when_the_catalog_changes_outside_it() -> None:
    cat = fleet(a=[mk("a1")])
    view = FleetView(cat, 1.0)
    assert TandemChoice().decide(view, job(8)).choice is not None
    cat.apply_report(InventoryReport("a", 2, True, 0.0, (mk("a1", free=0),)), now=1.0)
    with pytest.raises(StaleView):
        TandemChoice().decide(view, job(8))
    assert TandemChoice().decide(FleetView(cat, 1.0), job(8)).wait is WaitReason.INSUFFICIENT_CAPACITY


def test_the_cycles_own_holds_are_seen_by_its_next_decision() -> None:
    cat = fleet(a=[mk("a1")], b=[mk("b1")])
    view = FleetView(cat, 1.0)
    first = TandemChoice().decide(view, job(8)).choice
    assert first is not None
    view.hold(
        [
            Reservation(
                "j1",
                1,
                first.cluster,
                tuple(ReservedReplica(p.pod_set, p.index, p.node) for p in first.assignments),
                {"w": PodShape(gpus=8)},
            )
        ]
    )
    second = TandemChoice().decide(view, job(8)).choice  # the view is still valid after its own hold
    assert second is not None and second.cluster != first.cluster
    assert TandemChoice().decide(view, job(8)).choice is not None  # a view never mutates by deciding
    assert view.reservation_count(first.cluster) == 1


def test_a_view_fixes_usability_for_its_cycle() -> None:
    cat = fleet(a=[mk("a1")])
    view = FleetView(cat, 1.0)
    late = FleetView(cat, 1000.0)  # the same catalog, read far past the staleness bound
    assert view.clusters["a"].usable and not late.clusters["a"].usable
    assert TandemChoice().decide(late, job(8)).wait is WaitReason.NO_FRESH_INVENTORY


def test_aggregate_counts_replicas_node_by_node_and_ignores_topology() -> None:
    # "wide" has the most free GPUs, one node per rack; "rack" has fewer but all in one rack.
    cat = fleet(wide=[mk(f"w{i}", rack=f"r{i}") for i in range(6)], rack=[mk(f"k{i}", rack="rA") for i in range(4)])
    gang = job(8, 4, level="rack")
    view = FleetView(cat, 1.0)
    tandem = TandemChoice().decide(view, gang)
    assert tandem.choice is not None and tandem.choice.cluster == "rack"
    aggregate = AggregateChoice().decide(view, gang)
    assert aggregate.choice is None and aggregate.wait is WaitReason.TOPOLOGY_FRAGMENTED
    assert "wide" in aggregate.message
    # A job with no topology requirement goes where the estimate is largest.
    single = AggregateChoice().decide(view, job(8))
    assert single.choice is not None and single.choice.cluster == "wide"


def test_round_robin_takes_the_clusters_in_turn() -> None:
    cat = fleet(a=[mk("a1"), mk("a2")], b=[mk("b1"), mk("b2")], c=[mk("c1")])
    rr = RoundRobinChoice()
    picks = []
    for _ in range(5):
        d = rr.decide(FleetView(cat, 1.0), job(8))
        assert d.choice is not None
        picks.append(d.choice.cluster)
    assert picks == ["a", "b", "c", "a", "b"]
    # Policy narrows the turn to the allowed clusters.
    d = RoundRobinChoice().decide(FleetView(cat, 1.0), job(8), policy_allows=lambda c: c.name == "c")
    assert d.choice is not None and d.choice.cluster == "c"


def test_every_choice_waits_with_a_reason_when_nothing_is_usable() -> None:
    cat = fleet(a=[mk("a1")])
    cat.set_cordoned("a", True)
    for name in CHOICES:
        d = make_choice(name).decide(FleetView(cat, 1.0), job(8))
        assert d.choice is None and d.wait is WaitReason.CLUSTERS_CORDONED, name
    with pytest.raises(ValueError, match="unknown cluster choice"):
        make_choice("most-free")


def test_the_broker_flag_selects_the_choice_and_the_shells_exchange_events() -> None:
    from broker.api import serde
    from broker.config import load_config
    from broker.hub import Hub

    cfg = load_config(["--db", ":memory:", "--cluster-choice", "round-robin", "--agent-insecure"])
    assert cfg.cluster_choice == "round-robin"
    hub = Hub(cfg, Hub.store_for(cfg), specs=serde.SPECS)
    assert hub.placer.choice.name == "round-robin"
    assert not hasattr(hub.dispatcher, "placer") and not hasattr(hub.placer, "dispatcher")
    with pytest.raises(SystemExit):
        load_config(["--db", ":memory:", "--cluster-choice", "most-free"])
