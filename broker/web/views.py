"""The fleet view's aggregate documents (fleet picture, queues), built from the same handlers the gRPC API
calls; job documents are the API's own messages (broker.web.app).

Only aggregates leave here: GPU counts per cluster, model and domain, and per tenant counts of jobs by
why they wait. A tenant sees the clusters its policy lets it place on and its own tenant row; no job name
of another tenant is in any document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from broker.api.handlers.clusters import list_clusters
from broker.api.handlers.queues import QueueCounts, queue_counts, usage
from broker.api.ports import ClusterPorts, QueuePorts
from broker.api.serde import ts
from broker.tenancy.auth import Caller
from fleetplan.occupancy import GpuCounts, by_model
from fleetplan.pictures import OccupancyMemo
from placement.topology import level_name

__all__ = ["FleetPicture", "queues_document", "rfc3339"]


def rfc3339(t: float) -> str:
    return ts(t).ToJsonString()


class FleetPicture:
    """Every visible cluster's facts and occupancy, read from one fleet snapshot per document; a cluster's
    occupancy is computed again only when its capacity moved (in between, every poll of every browser reads
    the cached one)."""

    def __init__(self, clusters: ClusterPorts, probe_gpus: int) -> None:
        self.clusters = clusters
        self.probe_gpus = probe_gpus
        self.memo = OccupancyMemo(probe_gpus)

    def document(self, caller: Caller) -> dict[str, Any]:
        fleet = self.clusters.fleet_view()
        now = fleet.now
        seen: list[GpuCounts] = []
        clusters = []
        for view in list_clusters(self.clusters, caller, fleet=fleet):
            state = view.state
            occ = view.fleet.occupancy(state.name, self.memo)
            seen.extend(occ.gpus if occ else ())
            names = {lvl.key: lvl.name for lvl in state.meta.levels}
            level = names.get(occ.level, level_name(occ.level)) if occ and occ.level else ""
            clusters.append(
                {
                    "name": state.name,
                    "region": state.meta.region,
                    "role": state.meta.role,
                    "connected": state.connected,
                    "stale": view.stale,
                    "cordoned": state.cordoned,
                    "cordon_reason": view.cordon_reason,
                    "last_report_age_s": round(max(now - state.last_report, 0.0), 1) if state.last_report else None,
                    "nodes": state.nodes,
                    "active_attempts": view.active_attempts,
                    "levels": [lvl.name for lvl in state.meta.levels],
                    "gpus": [asdict(c) for c in occ.gpus] if occ else [],
                    "largest_probe_replicas": occ.largest_probe_replicas if occ else 0,
                    "domains": [
                        {
                            "path": list(d.path),
                            "level": level,
                            "nodes": d.nodes,
                            "model": d.model,
                            "gpus_total": d.gpus.total,
                            "gpus_free": d.gpus.free,
                            "gpus_reserved": d.gpus.reserved,
                            "whole_free_nodes": d.whole_free_nodes,
                            "probe_replicas": d.probe_replicas,
                        }
                        for d in (occ.domains if occ else ())
                    ],
                }
            )
        return {
            "evaluate_time": rfc3339(now),
            "probe_gpus": self.probe_gpus,
            "totals": [asdict(c) for c in by_model(seen)],
            "clusters": clusters,
        }


def _queue(counts: QueueCounts | None) -> dict[str, Any]:
    if counts is None:
        return {"queued": 0, "waiting": {}, "pending_gpus": {}}
    return {
        "queued": counts.queued,
        "waiting": {f"WAIT_REASON_{reason}": n for reason, n in sorted(counts.waiting.items())},
        "pending_gpus": {model: round(g, 3) for model, g in sorted(counts.pending_gpus.items())},
    }


def queues_document(queues: QueuePorts, caller: Caller) -> dict[str, Any]:
    """GetUsage's rows (own row for a tenant, every tenant for an admin) with each tenant's queue counts,
    and the fleet-wide counts. Read through the handler, not the audited GetUsage call: a page polling
    every few seconds is not an accounting export."""
    view = usage(queues, caller, "")
    per_tenant, fleet = queue_counts(queues, caller)
    rows = []
    for row in view.rows:
        rows.append(
            {
                "tenant": row.tenant,
                "weight": row.weight,
                "gpus": _ints(row.gpus),
                "quotas": _ints(row.quotas),
                "borrowed": _ints(row.borrowed),
                "usage_cost": round(row.usage_cost, 3),
                "fair_share_cost": round(row.fair_share_cost, 3),
                "demand_cost": round(row.demand_cost, 3),
                **_queue(per_tenant.get(row.tenant)),
            }
        )
    return {
        "evaluate_time": rfc3339(view.at),
        "capacity_cost": round(view.capacity_cost, 3),
        "fleet": _queue(fleet),
        "tenants": rows,
    }


def _ints(values: Mapping[str, float]) -> dict[str, float]:
    return {k: (int(v) if float(v).is_integer() else v) for k, v in sorted(values.items())}
