"""Gang fit over topology domains: whole decisions (domain, assignment, refusal) for small clusters."""

import pytest

from placement.model import Node
from placement.reasons import Reason
from placement.topology import Assignment, GangPlacement, GangRefusal, domain_of, fit_gang, level_name, shrink_counts
from tests.placement.builders import BLOCK, HOST, LEVELS, RACK, ZONE, job, node, shape


def placed(result: GangPlacement | GangRefusal) -> GangPlacement:
    assert isinstance(result, GangPlacement), result
    return result


def refused(result: GangPlacement | GangRefusal) -> GangRefusal:
    assert isinstance(result, GangRefusal), result
    return result


def by_node(p: GangPlacement) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in p.assignments:
        out[a.node] = out.get(a.node, 0) + a.replicas
    return out


def test_required_rack_picks_the_rack_that_holds_the_gang() -> None:
    nodes = [
        node("r1a", rack="r1"),
        node("r1b", rack="r1"),
        node("r2a", rack="r2", used=range(4)),
        node("r2b", rack="r2", used=range(4)),
    ]
    p = placed(fit_gang(nodes, job(("w", 4, shape(4)), required=RACK), LEVELS))
    assert p.domain == ("z1", "b1", "r1")
    assert by_node(p) == {"r1a": 2, "r1b": 2}
    assert p.domain_labels == ((ZONE, "z1"), (BLOCK, "b1"), (RACK, "r1"))
    assert p.leftover_gpus == 0 and p.counts == {"w": 4}


def test_best_fit_keeps_the_big_domain_whole() -> None:
    nodes = [
        node("r1a", rack="r1"),
        node("r1b", rack="r1"),
        node("r2a", rack="r2", used=range(4)),
        node("r2b", rack="r2", used=range(4)),
    ]
    p = placed(fit_gang(nodes, job(("w", 2, shape(4)), required=RACK), LEVELS))
    assert p.domain == ("z1", "b1", "r2") and by_node(p) == {"r2a": 1, "r2b": 1}


def test_same_rack_name_in_two_blocks_is_two_domains() -> None:
    nodes = [node("a", block="b1", rack="r1"), node("b", block="b2", rack="r1")]
    r = refused(fit_gang(nodes, job(("w", 4, shape(4)), required=RACK), LEVELS))
    assert r.reason is Reason.DOMAIN_TOO_SMALL
    assert (r.have, r.want) == (2, 4)
    assert r.detail == "rack z1/b1/r1 holds room for 2 replicas of gang train-42, needs 4 (8 GPUs free there)"
    assert domain_of(nodes[0], LEVELS, 2) != domain_of(nodes[1], LEVELS, 2)
    assert placed(fit_gang(nodes, job(("w", 4, shape(4)), required=ZONE), LEVELS)).total == 4


def test_node_without_the_label_is_its_own_domain() -> None:
    nodes = [node("a", rack=None, used=range(4)), node("b", rack=None, used=range(4))]
    r = refused(fit_gang(nodes, job(("w", 2, shape(4)), required=RACK), LEVELS))
    assert r.reason is Reason.DOMAIN_TOO_SMALL and r.have == 1
    p = placed(fit_gang(nodes, job(("w", 2, shape(4)), required=BLOCK), LEVELS))
    assert by_node(p) == {"a": 1, "b": 1}
    # the synthetic value never leaks into node affinity labels
    assert p.domain_labels == ((ZONE, "z1"), (BLOCK, "b1"))


def test_preferred_level_spans_fewest_domains() -> None:
    nodes = [node("r1a", rack="r1"), node("r2a", rack="r2"), node("r2b", rack="r2")]
    p = placed(fit_gang(nodes, job(("w", 2, shape(8)), preferred=RACK), LEVELS))
    assert set(by_node(p)) == {"r2a", "r2b"} and p.spans == 1
    p = placed(fit_gang(nodes, job(("w", 3, shape(8)), preferred=RACK), LEVELS))
    assert p.spans == 2 and p.total == 3


def test_required_hostname_means_one_node() -> None:
    nodes = [node("a", used=range(6)), node("b", used=range(2))]
    p = placed(fit_gang(nodes, job(("w", 3, shape(2)), required=HOST), LEVELS))
    assert by_node(p) == {"b": 3}
    assert refused(fit_gang(nodes, job(("w", 4, shape(2)), required=HOST), LEVELS)).have == 3


def test_head_and_workers_fit_together() -> None:
    nodes = [node(f"n{i}", cpu=16) for i in range(2)]
    head = shape(0, cpu=8)
    worker = shape(4, cpu=4)
    p = placed(fit_gang(nodes, job(("head", 1, head), ("w", 4, worker), required=RACK), LEVELS))
    assert p.counts == {"head": 1, "w": 4}
    # each node: 2 workers use 8 cores; the head's 8 cores fit next to them
    assert sorted(a.pod_set for a in p.assignments) == ["head", "w", "w"]
    # with 12 cores per node the head cannot join two workers anywhere
    tight = [node(f"n{i}", cpu=12) for i in range(2)]
    assert isinstance(fit_gang(tight, job(("head", 1, head), ("w", 4, worker)), LEVELS), GangRefusal)


def test_elastic_gang_shrinks_to_what_fits() -> None:
    nodes = [node(f"n{i}") for i in range(3)]
    p = placed(fit_gang(nodes, job(("w", 5, shape(8)), min_available=2), LEVELS))
    assert p.counts == {"w": 3} and p.total == 3
    r = refused(fit_gang(nodes, job(("w", 5, shape(8)), min_available=4), LEVELS))
    assert r.want == 4 and r.have == 3


def test_elastic_keeps_the_head() -> None:
    nodes = [node(f"n{i}") for i in range(2)]
    p = placed(fit_gang(nodes, job(("head", 1, shape(1)), ("w", 4, shape(4)), min_available=3), LEVELS))
    assert p.counts == {"head": 1, "w": 3}


@pytest.mark.parametrize(
    ("total", "counts"),
    [(9, {"head": 1, "w": 8}), (5, {"head": 1, "w": 4}), (2, {"head": 1, "w": 1}), (1, {"head": 1, "w": 1})],
)
def test_shrink_counts(total: int, counts: dict[str, int]) -> None:
    j = job(("head", 1, shape(1)), ("w", 8, shape(1)))
    assert shrink_counts(j.pod_sets, total) == counts


def test_no_feasible_node_lists_reasons() -> None:
    nodes = [node("a", model="GB200"), node("b", model="GB200"), node("c", ready=False)]
    r = refused(fit_gang(nodes, job(("w", 2, shape(4, models=["H100"]))), LEVELS))
    assert r.reason is Reason.NO_FEASIBLE_NODE
    assert r.node_reasons == {Reason.GPU_MODEL_MISMATCH: 2, Reason.NOT_READY: 1}
    assert "GpuModelMismatch: 2 nodes" in r.detail


def test_unknown_level_and_invalid_job() -> None:
    r = refused(fit_gang([node()], job(("w", 1, shape(1)), required="example.com/row"), LEVELS))
    assert r.reason is Reason.UNKNOWN_TOPOLOGY_LEVEL
    assert refused(fit_gang([node()], job(("w", 0, shape(1))), LEVELS)).reason is Reason.INVALID_REQUEST


def test_whole_cluster_when_no_level() -> None:
    nodes = [node("a", rack="r1"), node("b", rack="r2")]
    p = placed(fit_gang(nodes, job(("w", 4, shape(4))), LEVELS))
    assert p.domain == () and p.level is None and by_node(p) == {"a": 2, "b": 2}


def test_single_replica_prefers_the_broken_node() -> None:
    nodes: list[Node] = [node("whole"), node("broken", used=range(4))]
    p = placed(fit_gang(nodes, job(("w", 1, shape(4))), LEVELS))
    assert p.assignments == (Assignment("w", "broken", 1),)


def test_level_name() -> None:
    assert [level_name(k) for k in LEVELS.keys] == ["zone", "block", "rack", "clique", "hostname"]
