"""The fleet simulator's figures per (mode, policy) over seeds, computed from run results as a JSON-serialisable
summary (`summarise`): queueing delays, allocation, false dispatches, fair share, preemption.

Every figure says which mode produced it: wire mode (real processes, compressed time) and fast mode (the decision
code in virtual time) measure different things (FLEET-NOTES S-1).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from fleetsim.model import FleetSpec, Outcome, RunResult

__all__ = ["GANG_BUCKETS", "LARGE_GANG_REPLICAS", "gang_bucket", "percentile", "summarise", "time_weighted_allocation"]

GANG_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1),
    ("2-7", 2, 7),
    ("8-15", 8, 15),
    ("16-31", 16, 31),
    ("32+", 32, None),
)
"""Gang-size buckets by replicas: (label, smallest, largest or None)."""
LARGE_GANG_REPLICAS = 16
"""Gangs of at least this many replicas are the "large gangs" of the summary table."""


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0–100) with linear interpolation between closest ranks (numpy's default); None when
    there are no values."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def gang_bucket(replicas: int) -> str:
    for label, low, high in GANG_BUCKETS:
        if replicas >= low and (high is None or replicas <= high):
            return label
    return GANG_BUCKETS[0][0]


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _delay_stats(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": _round(percentile(values, 50)),
        "p95": _round(percentile(values, 95)),
        "p99": _round(percentile(values, 99)),
    }


def _run_end(run: RunResult) -> float:
    """When the run ended: its makespan, or the last thing seen when that is later (or the makespan is unset)."""
    seen = [t for t, _ in run.allocation]
    for o in run.outcomes:
        seen += [t for t in (o.submitted_s, o.started_s, o.finished_s) if t is not None]
    return max([run.makespan_s, *seen])


def time_weighted_allocation(run: RunResult) -> tuple[float | None, dict[str, float | None]]:
    """Mean GPU allocation while the workload arrives, in % of the fleet's GPUs and per cluster in % of its GPUs.

    The window is the first to the last arrival (the fleet under load; the drain after it says nothing about
    placement); without outcomes, the whole run. Samples are a step function: each holds from its time to the
    next sample's, the last one until the window's end. With no elapsed time the samples are averaged plainly.
    None without samples.
    """
    clusters = {c.name: c.gpus for c in run.fleet.clusters}
    arrivals = [o.item.arrival_s for o in run.outcomes]
    window_end = max(arrivals) if arrivals and max(arrivals) > 0 else None
    samples = sorted((s for s in run.allocation if window_end is None or s[0] <= window_end), key=lambda s: s[0])
    if not samples:
        return None, {name: None for name in clusters}
    end = window_end if window_end is not None else max(_run_end(run), samples[-1][0])
    spans = [(samples[i + 1][0] if i + 1 < len(samples) else end) - t for i, (t, _) in enumerate(samples)]
    total = sum(spans)
    weights = [s / total for s in spans] if total > 0 else [1.0 / len(samples)] * len(samples)
    per_cluster: dict[str, float | None] = {}
    for name, gpus in clusters.items():
        mean = sum(w * alloc.get(name, 0.0) for w, (_, alloc) in zip(weights, samples))
        per_cluster[name] = 100.0 * mean / gpus if gpus else None
    fleet_mean = sum(w * sum(alloc.values()) for w, (_, alloc) in zip(weights, samples))
    fleet_pct = 100.0 * fleet_mean / run.fleet.gpus if run.fleet.gpus else None
    return fleet_pct, per_cluster


def _gpu_seconds_received(run: RunResult) -> dict[str, float]:
    """GPU-seconds per tenant: each started item's GPU cost from its start to its end (or the run's end)."""
    end = _run_end(run)
    out: dict[str, float] = {}
    for o in run.outcomes:
        if o.started_s is None:
            continue
        stop = o.finished_s if o.finished_s is not None else end
        start = o.last_start_s if o.last_start_s is not None else o.started_s
        out[o.item.tenant] = out.get(o.item.tenant, 0.0) + o.item.gpu_cost * (max(stop - start, 0.0) + o.ran_s)
    return out


def _share_over_time(runs: Sequence[RunResult]) -> dict[str, Any] | None:
    """How far tenants' GPUs held were from their water-filled fair share, sample by sample over the arrival
    window: per sample the largest |held - fair| over tenants, in points of the fleet's GPUs; mean and p95 over
    every sample of every run, and each tenant's mean |held - fair|. The split gap compares shares of what is held
    with shares of the fair shares (idle GPUs no tenant can use then count for no one)."""
    worst: list[float] = []
    split: list[float] = []
    per_tenant: dict[str, list[float]] = {}
    for run in runs:
        arrivals = [o.item.arrival_s for o in run.outcomes]
        window_end = max(arrivals, default=0.0)
        gpus = run.fleet.gpus or 1
        for t, shares in run.tenant_shares:
            if t > window_end or not shares:
                continue
            gaps = {tenant: abs(held - fair) for tenant, (held, fair) in shares.items()}
            worst.append(100.0 * max(gaps.values()) / gpus)
            held_sum = sum(h for h, _ in shares.values())
            fair_sum = sum(f for _, f in shares.values())
            if held_sum > 0 and fair_sum > 0:
                split.append(100.0 * max(abs(h / held_sum - f / fair_sum) for h, f in shares.values()))
            for tenant, gap in gaps.items():
                per_tenant.setdefault(tenant, []).append(100.0 * gap / gpus)
    if not worst:
        return None
    return {
        "samples": len(worst),
        "mean_max_gap_pts": _round(sum(worst) / len(worst)),
        "p95_max_gap_pts": _round(percentile(worst, 95)),
        "mean_split_gap_pts": _round(sum(split) / len(split)) if split else None,
        "per_tenant_mean_gap_pts": {t: _round(sum(v) / len(v)) for t, v in sorted(per_tenant.items())},
    }


def _fair_share(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Received share of GPU-seconds against the weight-proportional share among the tenants with demand (tenants
    that submitted GPU work), GPU-seconds pooled over the runs."""
    weights = {t.name: t.weight for r in runs for t in r.fleet.tenants}
    received: dict[str, float] = {}
    demand: set[str] = set()
    for run in runs:
        for tenant, seconds in _gpu_seconds_received(run).items():
            received[tenant] = received.get(tenant, 0.0) + seconds
        demand |= {o.item.tenant for o in run.outcomes if o.item.gpu_cost > 0}
    total_weight = sum(weights.get(t, 1.0) for t in demand)
    total_received = sum(received.get(t, 0.0) for t in demand)
    per_tenant: dict[str, Any] = {}
    for tenant in sorted(demand):
        entitled = 100.0 * weights.get(tenant, 1.0) / total_weight if total_weight else None
        got = 100.0 * received.get(tenant, 0.0) / total_received if total_received else None
        per_tenant[tenant] = {
            "weight": weights.get(tenant, 1.0),
            "gpu_hours": _round(received.get(tenant, 0.0) / 3600.0),
            "entitled_pct": _round(entitled),
            "received_pct": _round(got),
            "deviation_pts": _round(got - entitled) if got is not None and entitled is not None else None,
        }
    deviations = [abs(v["deviation_pts"]) for v in per_tenant.values() if v["deviation_pts"] is not None]
    return {"per_tenant": per_tenant, "max_abs_deviation_pts": max(deviations) if deviations else None}


def _group_summary(mode: str, policy: str, runs: Sequence[RunResult]) -> dict[str, Any]:
    outcomes: list[Outcome] = [o for r in runs for o in r.outcomes]
    delays = [(o, d) for o in outcomes if (d := o.queueing_delay_s) is not None]
    tenants = sorted({o.item.tenant for o in outcomes})
    per_tenant = {t: _delay_stats([d for o, d in delays if o.item.tenant == t]) for t in tenants}
    per_bucket = {
        label: _delay_stats([d for o, d in delays if gang_bucket(o.item.replicas) == label])
        for label, _, _ in GANG_BUCKETS
    }

    dispatches = sum(o.dispatches for o in outcomes)
    false_dispatches = sum(o.false_dispatches for o in outcomes)
    causes = Counter(c for o in outcomes for c in o.false_dispatch_causes)

    seeds = sorted({r.seed for r in runs})
    allocations = [(r, *time_weighted_allocation(r)) for r in runs]
    fleet_pcts = [pct for _, pct, _ in allocations if pct is not None]
    cluster_names = [c.name for c in runs[0].fleet.clusters]
    per_cluster = {}
    for name in cluster_names:
        values = [v for _, _, pc in allocations if (v := pc.get(name)) is not None]
        per_cluster[name] = _round(sum(values) / len(values)) if values else None
    latencies_ms = [1000.0 * s for r in runs for s in r.decision_latency_s]
    makespans = {str(r.seed): _round(r.makespan_s or _run_end(r)) for r in runs}

    notes: list[str] = []
    for run in runs:
        notes += [n for n in run.notes if n not in notes]
    return {
        "mode": mode,
        "policy": policy,
        "runs": len(runs),
        "seeds": seeds,
        "jobs": len(outcomes),
        "placed": sum(o.placed_s is not None for o in outcomes),
        "started": len(delays),
        "finished": sum(o.finished_s is not None for o in outcomes),
        "queueing_delay_s": {
            "overall": _delay_stats([d for _, d in delays]),
            "large_gangs": _delay_stats([d for o, d in delays if o.item.replicas >= LARGE_GANG_REPLICAS]),
            "per_tenant": per_tenant,
            "per_gang_size": per_bucket,
            "not_started": len(outcomes) - len(delays),
        },
        "split_gangs": sum(o.split for o in outcomes),
        "false_dispatches": {
            "count": false_dispatches,
            "dispatches": dispatches,
            "rate": _round(false_dispatches / dispatches, 5) if dispatches else None,
            "causes": dict(causes.most_common()),
        },
        "replans": sum(max(o.dispatches - 1, 0) for o in outcomes),
        "duplicates": sum(o.duplicates for o in outcomes),
        "background_pods": sum(r.background_pods for r in runs),
        "allocation": {
            "mean_pct": _round(sum(fleet_pcts) / len(fleet_pcts)) if fleet_pcts else None,
            "per_cluster_pct": per_cluster,
            "per_seed_pct": {str(r.seed): _round(pct) for r, pct, _ in allocations},
            "p50_over_seeds_pct": _round(percentile(fleet_pcts, 50)) if len(fleet_pcts) > 1 else None,
        },
        "makespan_s": {
            "mean": _round(sum(v for v in makespans.values() if v is not None) / len(makespans)),
            "max": max((v for v in makespans.values() if v is not None), default=None),
            "per_seed": makespans,
        },
        "decision_latency_ms": (
            {
                "n": len(latencies_ms),
                "p50": _round(percentile(latencies_ms, 50)),
                "p99": _round(percentile(latencies_ms, 99)),
            }
            if latencies_ms
            else None
        ),
        "fair_share": _fair_share(runs),
        "fair_share_over_time": _share_over_time(runs),
        "preemption": {
            "victims": sum(o.preemptions for o in outcomes),
            "by_rule": dict(sum((Counter(r.preemptions) for r in runs), Counter())),
            "lost_gpu_hours": _round(sum(o.lost_gpu_s for o in outcomes) / 3600.0),
        },
        "notes": notes,
    }


def _fleet_summary(fleet: FleetSpec) -> dict[str, Any]:
    return {
        "name": fleet.name,
        "gpus": fleet.gpus,
        "synthesised_topology": fleet.synthesised_topology,
        "clusters": [
            {
                "name": c.name,
                "region": c.region,
                "role": c.role,
                "gpus": c.gpus,
                "levels": [lv.name for lv in c.levels],
                "background_pods_per_min": c.background_pods_per_min,
                "groups": [
                    {
                        "name": g.name,
                        "gpu_model": g.gpu_model,
                        "nodes": g.nodes,
                        "gpus_per_node": g.gpus_per_node,
                        "mig": g.mig,
                        "nodes_per_rack": g.nodes_per_rack,
                        "racks_per_block": g.racks_per_block,
                        "clique_nodes": g.clique_nodes,
                    }
                    for g in c.groups
                ],
            }
            for c in fleet.clusters
        ],
        "tenants": [{"name": t.name, "weight": t.weight, "quota": dict(t.quota)} for t in fleet.tenants],
    }


def _label(run: RunResult) -> str:
    return f"{run.mode}/{run.policy} seed {run.seed}"


def summarise(results: Sequence[RunResult]) -> dict[str, Any]:
    """The figures of `results`, per (mode, policy) over its seeds, as a JSON-serialisable dict.

    Queueing delay = start (every replica bound) − submission, over the items that started (`not_started` counts the
    others). Percentiles interpolate linearly. Allocation is time-weighted per run, then averaged over seeds.
    Re-plans are the dispatches after an item's first. Fair share compares each tenant's share of the GPU-seconds
    received (GPU cost x run time of started items) with its weight's share among the tenants that submitted GPU work.
    """
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in results:
        groups.setdefault((run.mode, run.policy), []).append(run)
    fleets: dict[str, FleetSpec] = {}
    for run in results:
        fleets.setdefault(run.fleet.name, run.fleet)

    note_runs: dict[str, list[str]] = {}
    for run in results:
        for note in run.notes:
            note_runs.setdefault(note, []).append(_label(run))
    notes = [
        note if len(labels) == len(results) else f"{note} ({', '.join(labels)})" for note, labels in note_runs.items()
    ]
    if any(f.synthesised_topology for f in fleets.values()):
        notes.insert(0, "The racks, blocks and cliques of the fleet are synthesised (the source has no topology).")
    return {
        "fleets": [_fleet_summary(f) for f in fleets.values()],
        "runs": [
            {
                "mode": r.mode,
                "policy": r.policy,
                "seed": r.seed,
                "fleet": r.fleet.name,
                "jobs": len(r.outcomes),
                "background_pods": r.background_pods,
                "makespan_s": _round(r.makespan_s),
            }
            for r in results
        ],
        "groups": [_group_summary(mode, policy, runs) for (mode, policy), runs in groups.items()],
        "notes": notes,
    }
