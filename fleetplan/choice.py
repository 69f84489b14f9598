"""How a job's cluster is chosen, behind one interface: Tandem's decision and the baselines it is measured against.

`ClusterChoice.decide(view, req, policy_allows=..., excluded_clusters=...)` is the seam: the broker's
placer calls it once per job in a cycle (`--cluster-choice` picks the implementation), the fleet
simulator's fast mode calls the same objects in virtual time. Only the cluster choice differs:

* `tandem`: every allowed, fresh cluster's node-level inventory, exact gang fit in candidate domains,
  ranked by the core (fit, locality, queue, freshness).
* `aggregate` (Karmada-style): the allowed, fresh cluster whose nodes could take the most replicas of the
  job, summed node by node with no regard to topology; the job goes there or waits for it.
* `round-robin`: the allowed, fresh clusters in turn, one job each; the job goes to the next or waits.

The baselines still return node assignments inside their chosen cluster (the cluster agent carries out
pinned dispatches only); the fleet simulator's fast mode drops those and lets its kube-scheduler model
place the pods unpinned, as those systems do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence

from fleetplan.decide import (
    ClusterPredicate,
    Decision,
    WaitReason,
    allow_every_cluster,
    cluster_allowed,
    decide,
    decide_in,
    demands_of,
    level_index,
)
from fleetplan.view import ClusterState, FleetView
from placement.model import JobRequest

__all__ = [
    "ClusterChoice",
    "TandemChoice",
    "AggregateChoice",
    "RoundRobinChoice",
    "CHOICES",
    "make_choice",
    "usable_clusters",
]


class ClusterChoice(ABC):
    """The seam every cluster choice implements; `limit` is the candidate domains exact-fitted per cluster."""

    name: str

    def __init__(self, limit: int = 8) -> None:
        self.limit = limit

    def decide(
        self,
        view: FleetView,
        req: JobRequest,
        *,
        policy_allows: ClusterPredicate = allow_every_cluster,
        excluded_clusters: Collection[str] = (),
    ) -> Decision:
        """Where the job goes in this cycle's view, or why it waits."""
        return self.decide_among(view, req, policy_allows, excluded_clusters)

    @abstractmethod
    def decide_among(
        self, view: FleetView, req: JobRequest, policy_allows: ClusterPredicate, excluded_clusters: Collection[str]
    ) -> Decision:
        """`decide` with every argument given."""


class TandemChoice(ClusterChoice):
    name = "tandem"

    def decide_among(
        self, view: FleetView, req: JobRequest, policy_allows: ClusterPredicate, excluded_clusters: Collection[str]
    ) -> Decision:
        return decide(view, req, policy_allows=policy_allows, excluded_clusters=excluded_clusters, limit=self.limit)


def usable_clusters(
    view: FleetView, req: JobRequest, policy_allows: ClusterPredicate, excluded_clusters: Collection[str]
) -> list[ClusterState] | Decision:
    """Allowed, usable clusters that know the job's topology level; or why there are none."""
    allowed = [
        e for e in view.clusters.values() if cluster_allowed(e, req, policy_allows) and e.name not in excluded_clusters
    ]
    usable = [e for e in allowed if e.usable and level_index(e, req.required_level) is not False]
    if usable:
        return sorted(usable, key=lambda e: e.name)
    if allowed and all(e.cordoned for e in allowed):
        return Decision(None, WaitReason.CLUSTERS_CORDONED, "every allowed cluster is cordoned")
    return Decision(None, WaitReason.NO_FRESH_INVENTORY, "no allowed cluster is connected with a fresh report")


class _OneClusterBaseline(ClusterChoice):
    """A baseline: its own rule picks one usable cluster; the gang fits there now or the job waits."""

    chooser: str
    """Who picked the cluster, as the wait message says it."""

    def decide_among(
        self, view: FleetView, req: JobRequest, policy_allows: ClusterPredicate, excluded_clusters: Collection[str]
    ) -> Decision:
        cands = usable_clusters(view, req, policy_allows, excluded_clusters)
        if isinstance(cands, Decision):
            return cands
        cluster = self.pick_cluster(view, req, cands)
        choice, fragmented = decide_in(view, cluster, req, self.limit)
        if choice is not None:
            return Decision(choice)
        if fragmented:
            return Decision(
                None, WaitReason.TOPOLOGY_FRAGMENTED, f"{self.chooser} chose {cluster}; no domain there holds the gang"
            )
        return Decision(
            None, WaitReason.INSUFFICIENT_CAPACITY, f"{self.chooser} chose {cluster}; it has no room for the gang now"
        )

    @abstractmethod
    def pick_cluster(self, view: FleetView, req: JobRequest, cands: Sequence[ClusterState]) -> str:
        """The name of the candidate (usable, sorted by name, never empty) the job goes to."""


class AggregateChoice(_OneClusterBaseline):
    name = "aggregate"
    chooser = "aggregate count"

    def pick_cluster(self, view: FleetView, req: JobRequest, cands: Sequence[ClusterState]) -> str:
        return self.rank_first(view, req, cands)

    @staticmethod
    def rank_first(view: FleetView, req: JobRequest, cands: Sequence[ClusterState]) -> str:
        """The candidate whose nodes could take the most replicas of the job, summed node by node (as Karmada's
        replica estimator does): blind to whether they share one domain, so a gang may go where it cannot start."""
        demands = demands_of(req)

        def replicas_free(state: ClusterState) -> int:
            arrays = view.arrays(state.name)
            return -1 if arrays is None else sum(int(arrays.capacity(shape).sum()) for shape, _ in demands)

        return max(cands, key=lambda e: (replicas_free(e), e.name)).name


class RoundRobinChoice(_OneClusterBaseline):
    """Each job gets the next cluster in name order (the cursor advances with every job decided)."""

    name = "round-robin"
    chooser = "round-robin"

    def __init__(self, limit: int = 8) -> None:
        super().__init__(limit)
        self.turn = 0
        """How many jobs were decided so far: the next job gets cluster `turn % len(candidates)`."""

    def pick_cluster(self, view: FleetView, req: JobRequest, cands: Sequence[ClusterState]) -> str:
        cluster = cands[self.turn % len(cands)].name
        self.turn += 1
        return cluster


CHOICES = ("tandem", "aggregate", "round-robin")


def make_choice(name: str, limit: int = 8) -> ClusterChoice:
    """The cluster choice named `name` (one of CHOICES)."""
    kinds: dict[str, Callable[[int], ClusterChoice]] = {
        "tandem": TandemChoice,
        "aggregate": AggregateChoice,
        "round-robin": RoundRobinChoice,
    }
    if name not in kinds:
        raise ValueError(f"unknown cluster choice {name!r}: one of {', '.join(CHOICES)}")
    return kinds[name](limit)
