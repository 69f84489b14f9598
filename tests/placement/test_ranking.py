"""Cluster ranking: feasible and allowed first, then fragmentation, locality, role, queue, freshness."""

from placement.model import JobRequest
from placement.ranking import ClusterOption, rank_clusters
from placement.reasons import Reason
from tests.placement.builders import job, shape

J = job(("w", 1, shape(1)))


def order(j: JobRequest, opts: list[ClusterOption], roles: tuple[str, ...] = ()) -> list[str]:
    return [r.cluster for r in rank_clusters(j, opts, role_preference=roles)]


def test_feasible_first_then_fragmentation() -> None:
    opts = [
        ClusterOption("a", feasible=False, refusal=Reason.DOMAIN_TOO_SMALL),
        ClusterOption("b", feasible=True, fragmentation_cost=0.5),
        ClusterOption("c", feasible=True, fragmentation_cost=0.1),
    ]
    ranked = rank_clusters(J, opts)
    assert [r.cluster for r in ranked] == ["c", "b", "a"]
    assert [r.eligible for r in ranked] == [True, True, False]
    assert ranked[2].reason is Reason.DOMAIN_TOO_SMALL
    assert ranked[0].explanation.startswith("eligible; fragmentation=0.1")
    assert [r.rank for r in ranked] == [0, 1, 2]


def test_locality_then_role_then_queue_then_freshness_then_name() -> None:
    j = JobRequest("j", J.pod_sets, locality=("eu-west", "c9"))
    opts = [
        ClusterOption("z", region="us", feasible=True),
        ClusterOption("c9", region="us", feasible=True),
        ClusterOption("e1", region="eu-west", role="inference", feasible=True),
        ClusterOption("e2", region="eu-west", role="training", queue_length=5, feasible=True),
        ClusterOption("e3", region="eu-west", role="training", queue_length=1, report_age_s=9, feasible=True),
        ClusterOption("e4", region="eu-west", role="training", queue_length=1, report_age_s=2, feasible=True),
        ClusterOption("a", region="us", feasible=True),
    ]
    assert order(j, opts, ("training", "inference")) == ["e4", "e3", "e2", "e1", "c9", "a", "z"]


def test_not_allowed_stale_cordoned_are_ineligible() -> None:
    j = JobRequest("j", J.pod_sets, allowed_regions=frozenset({"eu"}), allowed_roles=frozenset({"training"}))
    opts = [
        ClusterOption("us1", region="us", role="training", feasible=True),
        ClusterOption("eu1", region="eu", role="inference", feasible=True),
        ClusterOption("eu2", region="eu", role="training", feasible=True, stale=True),
        ClusterOption("eu3", region="eu", role="training", feasible=True, cordoned=True),
        ClusterOption("eu4", region="eu", role="training", feasible=True, fragmentation_cost=3),
    ]
    ranked = rank_clusters(j, opts)
    assert ranked[0].cluster == "eu4" and ranked[0].eligible
    reasons = {r.cluster: r.reason for r in ranked[1:]}
    assert reasons == {
        "us1": Reason.REGION_NOT_ALLOWED,
        "eu1": Reason.ROLE_NOT_ALLOWED,
        "eu2": Reason.CLUSTER_STALE,
        "eu3": Reason.CLUSTER_CORDONED,
    }
    only = JobRequest("j", J.pod_sets, allowed_clusters=frozenset({"x"}))
    assert rank_clusters(only, [ClusterOption("y", feasible=True)])[0].reason is Reason.CLUSTER_NOT_ALLOWED


def test_deterministic_regardless_of_input_order() -> None:
    opts = [ClusterOption(n, feasible=True) for n in "dcba"]
    assert order(J, opts) == order(J, list(reversed(opts))) == ["a", "b", "c", "d"]
