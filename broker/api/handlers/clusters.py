"""The cluster calls: the clusters a caller may see, read from a fleet snapshot, and cordon / uncordon."""

from __future__ import annotations

from dataclasses import dataclass

from broker.api.ports import ClusterPorts
from broker.domain import errors
from broker.tenancy.auth import Caller, CallerKind
from fleetplan.catalog import ClusterEntry, Usability
from fleetplan.view import ClusterState

__all__ = ["ClusterView", "list_clusters", "get_cluster", "cordon"]


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One cluster as the API shows it: its record and the facts of the snapshot it was read from."""

    entry: ClusterEntry
    stale: bool
    active_attempts: int
    cordon_reason: str


def _view(clusters: ClusterPorts, state: ClusterState) -> ClusterView:
    return ClusterView(
        clusters.cluster_records[state.name],
        state.usability in (Usability.STALE, Usability.DISCONNECTED),
        state.reservations,
        clusters.cordon_reasons.get(state.name, ""),
    )


def list_clusters(clusters: ClusterPorts, caller: Caller, *, region: str = "", role: str = "") -> list[ClusterView]:
    """The clusters the caller may see, sorted by name; `region` / `role` (from Hello) filter when set."""
    fleet = clusters.fleet_view()
    pol = clusters.policy.current().tenants.get(caller.name) if caller.kind is CallerKind.TENANT else None
    out = []
    for name in sorted(fleet.clusters):
        state = fleet.clusters[name]
        if pol is not None and not pol.allows_place(name, state.meta.region, state.meta.role):
            continue
        if (region and state.meta.region != region) or (role and state.meta.role != role):
            continue
        out.append(_view(clusters, state))
    return out


def get_cluster(clusters: ClusterPorts, caller: Caller, name: str) -> ClusterView:
    for view in list_clusters(clusters, caller):
        if view.entry.name == name:
            return view
    raise errors.NotFound(f"cluster {name} not found", cluster=name)


async def cordon(clusters: ClusterPorts, caller: Caller, name: str, cordoned: bool, reason: str) -> ClusterView:
    """Durable first (a cordon survives a restart), then in effect for the placer."""
    if not reason:
        raise errors.InvalidArgument.fields(errors.FieldViolation("reason", "required (audit log)"))
    if name not in clusters.cluster_records:
        raise errors.NotFound(f"cluster {name} not found", cluster=name)
    await clusters.set_cordon(name, reason if cordoned else None, caller.name)
    return _view(clusters, clusters.fleet_view().clusters[name])
