"""The victim search: the cheapest set of whole gangs whose removal lets the waiting gang fit."""

from __future__ import annotations

from fleetplan.preempt import VictimCandidate, plan_preemption
from fleetplan.view import FleetView
from placement.model import PodShape
from tests.broker.test_placer_decide import fleet, job, mk

G8 = PodShape(gpus=8)


def victim(
    job_id: str,
    nodes: list[str],
    *,
    cluster: str = "c",
    stage: int = 2,
    lost: float = 1.0,
    priority: int = 0,
    shape: PodShape = G8,
) -> VictimCandidate:
    return VictimCandidate(job_id, cluster, tuple((n, shape) for n in nodes), stage, lost, priority)


def test_cheapest_sufficient_set_wins_and_unneeded_victims_are_pruned() -> None:
    cat = fleet(c=[mk(f"n{i}", free=0) for i in range(4)])
    cands = [
        victim("cheap", ["n0"], lost=1.0),
        victim("mid", ["n1"], lost=2.0),
        victim("dear", ["n2", "n3"], lost=50.0),
    ]
    plan = plan_preemption(FleetView(cat, 1.0), job(8, 2), cands)
    assert plan is not None
    assert [v.job_id for v in plan.victims] == ["cheap", "mid"]
    assert sorted(a.node for a in plan.choice.assignments) == ["n0", "n1"]
    assert plan.lost_gpu_hours == 3.0


def test_a_gang_is_freed_whole_even_when_one_of_its_nodes_would_do() -> None:
    cat = fleet(c=[mk("n0", free=0), mk("n1", free=0)])
    plan = plan_preemption(FleetView(cat, 1.0), job(8, 1), [victim("gang", ["n0", "n1"])])
    assert plan is not None and [v.job_id for v in plan.victims] == ["gang"]
    assert len(plan.choice.assignments) == 1


def test_required_domain_picks_the_rack_that_can_be_cleared_cheapest() -> None:
    # rack A: two cheap victims; rack B: one dear victim plus a free node. Needs 2 nodes in one rack.
    cat = fleet(
        c=[mk("a0", free=0, rack="rA"), mk("a1", free=0, rack="rA"), mk("b0", free=0, rack="rB"), mk("b1", rack="rB")]
    )
    cands = [victim("a-0", ["a0"], lost=1.0), victim("a-1", ["a1"], lost=1.5), victim("b-0", ["b0"], lost=2.0)]
    plan = plan_preemption(FleetView(cat, 1.0), job(8, 2, level="rack"), cands)
    assert plan is not None
    assert [v.job_id for v in plan.victims] == ["b-0"]  # 2.0 lost in rack B beats 2.5 in rack A
    assert sorted(a.node for a in plan.choice.assignments) == ["b0", "b1"]


def test_gated_victims_go_before_running_ones() -> None:
    cat = fleet(c=[mk("n0", free=0), mk("n1", free=0)])
    cands = [victim("running", ["n0"], stage=2, lost=0.0), victim("gated", ["n1"], stage=0, lost=0.0)]
    plan = plan_preemption(FleetView(cat, 1.0), job(8, 1), cands)
    assert plan is not None and [v.job_id for v in plan.victims] == ["gated"]


def test_no_plan_when_even_every_candidate_gone_is_not_enough() -> None:
    cat = fleet(c=[mk("n0", free=0), mk("n1", free=0, rack="r2")])
    cands = [victim("x", ["n0"]), victim("y", ["n1"])]
    assert plan_preemption(FleetView(cat, 1.0), job(8, 2, level="rack"), cands) is None
    assert plan_preemption(FleetView(cat, 1.0), job(8, 3), cands) is None


def test_only_allowed_clusters_are_searched() -> None:
    cat = fleet(a=[mk("a0", free=0)], b=[mk("b0", free=0)])
    cands = [victim("in-a", ["a0"], cluster="a", lost=0.1), victim("in-b", ["b0"], cluster="b", lost=9.0)]
    plan = plan_preemption(FleetView(cat, 1.0), job(8), cands, policy_allows=lambda c: c.name == "b")
    assert plan is not None and plan.choice.cluster == "b" and [v.job_id for v in plan.victims] == ["in-b"]
