"""What one placement cycle decides over: the fleet as the catalog held it when the cycle began.

The catalog is the broker's live state; reports, reservations ending and cordons change it between
cycles. A `FleetView` fixes, for one cycle, which clusters are usable, their metadata, report sequence
and age, and reads their capacity (the numpy arrays and the reservations overlay). The cycle's own
holds go through the view (`hold`), so the next decision in the same cycle sees them taken; any other
change to the catalog makes the view stale, and using it then raises `StaleView` instead of deciding
over a mix of two states. In the broker a cycle is the run of decisions between two yields of the
event loop; in the fleet simulator's fast mode it is one virtual-time scheduling round.

The API and the fleet view read the fleet through a view taken per call too: the per-cluster facts are
frozen when it is taken, and the pictures they draw of a cluster's GPUs (`gpus`, `occupancy`) are frozen
records computed through it, so nothing outside the decision seam holds the catalog's live state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from fleetplan.arrays import ClusterArrays
from fleetplan.catalog import Catalog, ClusterMeta, Reservation, Usability
from fleetplan.occupancy import ClusterOccupancy
from fleetplan.pictures import ClusterGpus, OccupancyMemo, cluster_gpus
from placement.model import Node, PodShape

__all__ = ["ClusterState", "FleetView", "StaleView"]


class StaleView(RuntimeError):
    """The catalog changed outside the view since the view was taken: take a new one."""


@dataclass(frozen=True, slots=True)
class ClusterState:
    """One cluster as the cycle sees it (its capacity is read through the view)."""

    name: str
    meta: ClusterMeta
    usability: Usability
    cordoned: bool
    connected: bool
    """Its agent's stream is open."""
    sequence: int
    last_report: float
    """When its latest report was applied (0: never)."""
    nodes: int
    """Nodes in its latest report."""
    reservations: int
    """Reservations held on it when the view was taken (the ranking's queue length)."""

    @property
    def usable(self) -> bool:
        return self.usability is Usability.USABLE

    @property
    def has_nodes(self) -> bool:
        return self.nodes > 0


class FleetView:
    """The catalog frozen for one placement cycle; see the module docstring."""

    __slots__ = ("now", "stale_after_s", "clusters", "_catalog", "_generation", "_held")

    def __init__(self, catalog: Catalog, now: float) -> None:
        self.now = now
        self.stale_after_s = catalog.stale_after_s
        self._catalog = catalog
        self._generation = catalog.generation
        self._held: dict[str, int] = {}
        self.clusters: Mapping[str, ClusterState] = MappingProxyType(
            {
                e.name: ClusterState(
                    e.name,
                    e.meta,
                    e.usability(now, catalog.stale_after_s),
                    e.cordoned,
                    e.connected,
                    e.sequence,
                    e.last_report,
                    len(e.nodes),
                    catalog.reservation_count(e.name),
                )
                for e in catalog.clusters.values()
            }
        )

    def _live(self) -> Catalog:
        if self._catalog.generation != self._generation:
            raise StaleView("the catalog changed since this view was taken")
        return self._catalog

    # ------------------------------------------------------------------ capacity reads

    def arrays(self, cluster: str) -> ClusterArrays | None:
        """The cluster's capacity arrays (reported inventory minus reservations not yet bound)."""
        entry = self._live().clusters.get(cluster)
        return None if entry is None else entry.arrays

    def empty_arrays(self, cluster: str) -> ClusterArrays:
        """The cluster as if nothing ran on it (never-fit checks)."""
        catalog = self._live()
        return catalog.empty_arrays(catalog.clusters[cluster])

    def overlaid_nodes(self, cluster: str, rows: Sequence[int]) -> list[Node]:
        """The nodes of `rows` minus reserved-but-unbound replicas (the core's overlay, memoised per node)."""
        return self._live().overlaid_nodes(cluster, rows)

    def usable_rows(self, cluster: str) -> list[int]:
        """Rows of the nodes placement may use now (not excluded after a rejected dispatch)."""
        entry = self._live().clusters[cluster]
        arrays = entry.arrays
        if arrays is None:
            return []
        return [i for i, n in enumerate(arrays.nodes) if n.name not in entry.excluded_nodes]

    def prune(self, demands: Sequence[tuple[PodShape, int]]) -> list[str]:
        """Clusters whose fleet-wide summary could hold the demands (a cheap first cut over many clusters)."""
        return self._live().fleet.prune(demands)

    def total_free(self, cluster: str) -> int:
        return self._live().fleet.total_free(cluster)

    def gpu_totals(self) -> dict[str, int]:
        """GPUs per model over the usable clusters (the capacity fair shares divide)."""
        totals: dict[str, int] = {}
        for state in self.clusters.values():
            arrays = self.arrays(state.name) if state.usable else None
            for model, n in (arrays.gpu_totals() if arrays is not None else {}).items():
                totals[model] = totals.get(model, 0) + n
        return totals

    def gpus(self, cluster: str, depths: Iterable[int] = ()) -> ClusterGpus | None:
        """GPUs and free whole GPUs per model (and per domain of each level in `depths`); None: no report yet."""
        arrays = self.arrays(cluster)
        return None if arrays is None else cluster_gpus(arrays, depths)

    def occupancy(self, cluster: str, memo: OccupancyMemo) -> ClusterOccupancy | None:
        """What the cluster's GPUs are doing now (fleetplan.occupancy), through `memo`; None: no report yet."""
        arrays = self.arrays(cluster)
        return None if arrays is None else memo.of(arrays)

    def reservation_count(self, cluster: str) -> int:
        state = self.clusters.get(cluster)
        return (state.reservations if state else 0) + self._held.get(cluster, 0)

    # ------------------------------------------------------------------ the cycle's own holds

    def hold(self, reservations: Iterable[Reservation]) -> None:
        """Take capacity for decisions of this cycle, so the next decision in it sees them taken."""
        catalog = self._live()
        for res in reservations:
            catalog.add_reservation(res)
            self._held[res.cluster] = self._held.get(res.cluster, 0) + 1
        self._generation = catalog.generation
