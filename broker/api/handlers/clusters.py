"""The cluster calls: the clusters a caller may see, read from a fleet snapshot, and cordon / uncordon."""

from __future__ import annotations

from dataclasses import dataclass

from broker.api.ports import ClusterPorts
from broker.domain import errors
from broker.tenancy.auth import Caller, CallerKind
from fleetplan.catalog import Usability
from fleetplan.pictures import ClusterGpus
from fleetplan.view import ClusterState, FleetView

__all__ = ["ClusterView", "list_clusters", "get_cluster", "cordon"]


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One cluster as the API shows it: its facts in the fleet snapshot it was read from, and that snapshot."""

    state: ClusterState
    cordon_reason: str
    fleet: FleetView
    """The snapshot: the cluster's GPUs are read through it, before the call yields to the event loop."""

    @property
    def stale(self) -> bool:
        """Its agent stopped reporting, or its stream is closed."""
        return self.state.usability in (Usability.STALE, Usability.DISCONNECTED)

    @property
    def active_attempts(self) -> int:
        """Reservations held on it when the snapshot was taken."""
        return self.state.reservations

    def gpus(self, with_domains: bool = False) -> ClusterGpus | None:
        """GPUs per model; with the domains of every topology level but the finest (the only one if just one)."""
        levels = len(self.state.meta.levels)
        depths = range(levels - 1 if levels > 1 else levels) if with_domains else range(0)
        return self.fleet.gpus(self.state.name, depths)


def _view(clusters: ClusterPorts, fleet: FleetView, state: ClusterState) -> ClusterView:
    return ClusterView(state, clusters.cordon_reasons.get(state.name, ""), fleet)


def list_clusters(
    clusters: ClusterPorts, caller: Caller, *, region: str = "", role: str = "", fleet: FleetView | None = None
) -> list[ClusterView]:
    """The clusters the caller may see, sorted by name; `region` / `role` (from Hello) filter when set.
    `fleet`: the snapshot to read them from (default: one taken now)."""
    fleet = fleet if fleet is not None else clusters.fleet_view()
    pol = clusters.policy.current().tenants.get(caller.name) if caller.kind is CallerKind.TENANT else None
    out = []
    for name in sorted(fleet.clusters):
        state = fleet.clusters[name]
        if pol is not None and not pol.allows_place(name, state.meta.region, state.meta.role):
            continue
        if (region and state.meta.region != region) or (role and state.meta.role != role):
            continue
        out.append(_view(clusters, fleet, state))
    return out


def get_cluster(clusters: ClusterPorts, caller: Caller, name: str) -> ClusterView:
    for view in list_clusters(clusters, caller):
        if view.state.name == name:
            return view
    raise errors.NotFound(f"cluster {name} not found", cluster=name)


async def cordon(clusters: ClusterPorts, caller: Caller, name: str, cordoned: bool, reason: str) -> ClusterView:
    """Durable first (a cordon survives a restart), then in effect for the placer."""
    if not reason:
        raise errors.InvalidArgument.fields(errors.FieldViolation("reason", "required (audit log)"))
    if name not in clusters.fleet_view().clusters:
        raise errors.NotFound(f"cluster {name} not found", cluster=name)
    await clusters.set_cordon(name, reason if cordoned else None, caller.name)
    fleet = clusters.fleet_view()
    return _view(clusters, fleet, fleet.clusters[name])
