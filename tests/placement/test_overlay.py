"""Reservations overlay: unbound parts subtracted once, bound parts never again, conflicts reported."""

from placement.fit import capacity
from placement.overlay import (
    BoundReplicas,
    ReportedNodes,
    Reservation,
    ReservedPart,
    apply_overlay,
    capacity_with_reservations,
    effective_nodes,
    subtract_held,
    unbound_parts,
)
from placement.reasons import Reason
from placement.topology import GangPlacement, fit_gang
from tests.placement.builders import LEVELS, RACK, job, node, shape

W = shape(4)


def res(*parts: tuple[str, int], job_id: str = "g1", attempt: int = 1) -> Reservation:
    return Reservation(job_id, attempt, tuple(ReservedPart("w", n, r, W) for n, r in parts))


def test_unbound_part_is_subtracted() -> None:
    report = ReportedNodes("c1", 7, (node("a"), node("b")))
    a, b = effective_nodes(report, [res(("a", 1), ("b", 2))])
    assert (a.free_whole_gpus, b.free_whole_gpus) == (4, 0)


def test_bound_part_is_not_subtracted_twice() -> None:
    # The report already shows one replica bound on "a" (its GPUs are used in the report).
    report = ReportedNodes("c1", 8, (node("a", used=range(4)), node("b")), (BoundReplicas("g1", 1, {("w", "a"): 1}),))
    a, b = effective_nodes(report, [res(("a", 1), ("b", 2))])
    assert (a.free_whole_gpus, b.free_whole_gpus) == (4, 0)


def test_bound_can_be_passed_explicitly_and_over_binding_clamps() -> None:
    report = ReportedNodes("c1", 8, (node("a", used=range(8)),))
    (a,) = effective_nodes(report, [res(("a", 1))], [BoundReplicas("g1", 1, {("w", "a"): 3})])
    assert a.free_whole_gpus == 0
    assert unbound_parts(res(("a", 2)), BoundReplicas("g1", 1, {("w", "a"): 1})) == [ReservedPart("w", "a", 1, W)]


def test_other_attempts_bindings_do_not_count() -> None:
    report = ReportedNodes("c1", 8, (node("a"),), (BoundReplicas("g1", 0, {("w", "a"): 2}),))
    (a,) = effective_nodes(report, [res(("a", 2), attempt=1)])
    assert a.free_whole_gpus == 0


def test_exclude_own_reservation() -> None:
    report = ReportedNodes("c1", 1, (node("a"),))
    (a,) = effective_nodes(report, [res(("a", 2))], exclude=("g1", 1))
    assert a.free_whole_gpus == 8


def test_conflicts_when_the_report_no_longer_has_room() -> None:
    report = ReportedNodes("c1", 9, (node("a", used=range(6)),))
    ov = apply_overlay(report, [res(("a", 1), ("gone", 1))])
    assert [(c.node, c.replicas, c.reason) for c in ov.conflicts] == [
        ("a", 1, Reason.INSUFFICIENT_GPUS),
        ("gone", 1, None),
    ]
    assert ov.nodes[0].free_whole_gpus == 2


def test_two_reservations_stack_and_holders_are_named() -> None:
    report = ReportedNodes("c1", 1, (node("a"),))
    ov = apply_overlay(report, [res(("a", 1), job_id="g1"), res(("a", 1), job_id="g2")])
    assert ov.nodes[0].free_whole_gpus == 0
    assert ov.holders == {"a": ("g1", "g2")}
    reported, effective = report.nodes[0], ov.nodes[0]
    f = capacity_with_reservations(reported, effective, W, ov.holders["a"])
    assert f.reason is Reason.RESERVED_FOR_GANG and "g1, g2" in f.detail
    # a shape that would not fit anyway keeps its real reason
    assert (
        capacity_with_reservations(reported, effective, shape(16), ov.holders["a"]).reason is Reason.GPU_COUNT_TOO_LARGE
    )


def test_reservation_from_placement_round_trip() -> None:
    nodes = (node("a", rack="r1"), node("b", rack="r1"), node("c", rack="r2"))
    j = job(("w", 3, W), required=RACK)
    p = fit_gang(nodes, j, LEVELS)
    assert isinstance(p, GangPlacement)
    r = Reservation.from_placement(j, p, attempt=3)
    assert r.key == ("train-42", 3) and sum(part.replicas for part in r.parts) == 3
    eff = effective_nodes(ReportedNodes("c1", 1, nodes), [r])
    assert sum(n.free_whole_gpus for n in eff) == 24 - 12
    # once bound, the report's own numbers carry it: the overlay adds nothing
    bound_nodes = tuple(n for n in eff)
    bound = BoundReplicas("train-42", 3, {(part.pod_set, part.node): part.replicas for part in r.parts})
    again = effective_nodes(ReportedNodes("c1", 2, bound_nodes, (bound,)), [r])
    assert again == bound_nodes
    assert all(capacity(n, W).count >= 0 for n in again)


def test_a_hold_that_no_longer_fits_takes_what_is_left() -> None:
    # 8 free GPUs, a hold of 3 x 4 GPUs: two fit, the third is the shortfall
    held, short, fit = subtract_held(node("a"), W, 3)
    assert (held.free_whole_gpus, short, fit.count) == (0, 1, 2)
    held, short, _ = subtract_held(node("a"), W, 1)
    assert (held.free_whole_gpus, short) == (4, 0)
