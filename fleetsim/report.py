"""The fleet simulator's report: figures per (mode, policy) over seeds, as JSON, Markdown tables and PNG plots.

`summarise` computes, `write_report` writes `report.md`, `report.json` and the plots into a directory the caller
chooses, `summary_table` is the short table the demo prints. Every figure says which mode produced it: wire mode
(real processes, compressed time) and fast mode (the decision code in virtual time) measure different things
(FLEET-NOTES S-1).
"""

from __future__ import annotations

import datetime
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetsim.model import FleetSpec, Outcome, RunResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "GANG_BUCKETS",
    "LARGE_GANG_REPLICAS",
    "percentile",
    "gang_bucket",
    "time_weighted_allocation",
    "summarise",
    "summary_table",
    "write_report",
]

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

MODE_TEXT = {
    "wire": "wire mode: the real broker, extender and agent processes over simulated Kubernetes control planes, "
    "with time compressed (the factor and the pipeline's measured overhead are in the notes); waits include "
    "the real pipeline's latency",
    "fast": "fast mode: the broker's decision code in virtual time (a discrete-event loop, no processes); the "
    "comparison of cluster choices over seeds",
}
JSON_NAME = "report.json"
MARKDOWN_NAME = "report.md"


# --------------------------------------------------------------------------- statistics


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


# --------------------------------------------------------------------------- text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if abs(seconds) < 120:
        return f"{seconds:.0f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _rate_pct(rate: float | None) -> str:
    return "–" if rate is None else f"{100 * rate:.2f}"


def summary_table(summary: dict[str, Any]) -> str:
    """One fixed-width line per (mode, policy): jobs, mean GPU allocation, p95 wait of large gangs (≥ 16 replicas),
    split gangs, false-dispatch rate and mean makespan."""
    header = (
        "policy",
        "mode",
        "seeds",
        "jobs",
        "alloc %",
        f"p95 wait ≥{LARGE_GANG_REPLICAS}",
        "split",
        "false-disp %",
        "makespan",
    )
    rows = [header]
    for g in summary["groups"]:
        rows.append(
            (
                g["policy"],
                g["mode"],
                str(len(g["seeds"])),
                str(g["jobs"]),
                _pct(g["allocation"]["mean_pct"]),
                _duration(g["queueing_delay_s"]["large_gangs"]["p95"]),
                str(g["split_gangs"]),
                _rate_pct(g["false_dispatches"]["rate"]),
                _duration(g["makespan_s"]["mean"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]  # a cause may hold "|"
    return out + [""]


def _fleet_markdown(fleet: dict[str, Any]) -> list[str]:
    tenants = ", ".join(f"{t['name']} (weight {t['weight']:g})" for t in fleet["tenants"])
    out = [f"Fleet `{fleet['name']}`: {len(fleet['clusters'])} clusters, {fleet['gpus']} GPUs. Tenants: {tenants}.", ""]
    rows = []
    for c in fleet["clusters"]:
        # Only the topology the cluster has levels for.
        groups = "; ".join(
            f"{g['nodes']} × {g['gpus_per_node']} {g['gpu_model']}"
            + (f" (MIG {g['mig']})" if g["mig"] else "")
            + (f", racks of {g['nodes_per_rack']}" if "rack" in c["levels"] else "")
            + (f", {g['racks_per_block']} racks/block" if "block" in c["levels"] else "")
            + (f", cliques of {g['clique_nodes']}" if g["clique_nodes"] else "")
            for g in c["groups"]
        )
        rows.append(
            (
                c["name"],
                c["region"],
                c["role"],
                " > ".join(c["levels"]),
                groups,
                c["gpus"],
                f"{c['background_pods_per_min']:g}",
            )
        )
    out += _table(("cluster", "region", "role", "levels", "node groups", "GPUs", "background pods/min"), rows)
    if fleet["synthesised_topology"]:
        out += ["The racks, blocks and cliques of this fleet are **synthesised**: the source has no topology.", ""]
    return out


def _mode_markdown(mode: str, groups: Sequence[dict[str, Any]], plots: Sequence[str]) -> list[str]:
    tag = f"({mode} mode)"
    out = [f"## Results — {mode} mode", "", f"Every figure in this section comes from {MODE_TEXT.get(mode, mode)}.", ""]
    out += [f"### Overview {tag}", ""]
    out += _table(
        (
            "policy",
            "seeds",
            "jobs",
            "placed",
            "started",
            "finished",
            "GPU alloc % while arriving (mean)",
            "alloc % p50 over seeds",
            "makespan (mean)",
            "split gangs",
            "false dispatches (rate %)",
            "re-plans",
            "duplicates",
            "decision ms p50 / p99",
        ),
        [
            (
                g["policy"],
                len(g["seeds"]),
                g["jobs"],
                g["placed"],
                g["started"],
                g["finished"],
                _pct(g["allocation"]["mean_pct"]),
                _pct(g["allocation"]["p50_over_seeds_pct"]),
                _duration(g["makespan_s"]["mean"]),
                g["split_gangs"],
                (
                    f"{g['false_dispatches']['count']} of {g['false_dispatches']['dispatches']} "
                    f"({_rate_pct(g['false_dispatches']['rate'])})"
                ),
                g["replans"],
                g["duplicates"],
                (
                    f"{_pct(g['decision_latency_ms']['p50'], 2)} / {_pct(g['decision_latency_ms']['p99'], 2)}"
                    if g["decision_latency_ms"]
                    else "–"
                ),
            )
            for g in groups
        ],
    )

    def delay_rows(key: str) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for g in groups:
            for name, s in g["queueing_delay_s"][key].items():
                if s["n"]:
                    rows.append(
                        (g["policy"], name, s["n"], _duration(s["p50"]), _duration(s["p95"]), _duration(s["p99"]))
                    )
        return rows

    out += [
        f"### Queueing delay by gang size {tag}",
        "",
        "Submission to every replica bound, over the items that started; gang size in replicas.",
        "",
    ]
    out += _table(("policy", "replicas", "started", "p50", "p95", "p99"), delay_rows("per_gang_size"))
    out += [f"### Queueing delay by tenant {tag}", ""]
    out += _table(("policy", "tenant", "started", "p50", "p95", "p99"), delay_rows("per_tenant"))
    out += _table(
        ("policy", "never started", f"p95 wait, gangs ≥ {LARGE_GANG_REPLICAS} replicas"),
        [
            (g["policy"], g["queueing_delay_s"]["not_started"], _duration(g["queueing_delay_s"]["large_gangs"]["p95"]))
            for g in groups
        ],
    )

    clusters = list(groups[0]["allocation"]["per_cluster_pct"]) if groups else []
    out += [
        f"### GPU allocation per cluster {tag}",
        "",
        (
            "Time-weighted mean of the allocation samples (Tandem's and background pods'), % of each cluster's "
            "GPUs, averaged over seeds."
        ),
        "",
    ]
    out += _table(
        ("policy", *clusters, "fleet"),
        [
            (
                g["policy"],
                *(_pct(g["allocation"]["per_cluster_pct"].get(c)) for c in clusters),
                _pct(g["allocation"]["mean_pct"]),
            )
            for g in groups
        ],
    )

    cause_rows = [(g["policy"], cause, n) for g in groups for cause, n in g["false_dispatches"]["causes"].items()]
    out += [f"### False-dispatch causes {tag}", ""]
    out += _table(("policy", "cause", "count"), cause_rows) if cause_rows else ["No false dispatches.", ""]

    out += [
        f"### Fair share {tag}",
        "",
        (
            "Share of the GPU-seconds received against the weight-proportional share among the tenants that "
            "submitted GPU work (a tenant that asks for less than its share cannot reach it)."
        ),
        "",
    ]
    out += _table(
        ("policy", "tenant", "weight", "GPU-hours", "entitled %", "received %", "deviation (points)"),
        [
            (
                g["policy"],
                t,
                f"{v['weight']:g}",
                _pct(v["gpu_hours"]),
                _pct(v["entitled_pct"]),
                _pct(v["received_pct"]),
                _pct(v["deviation_pts"]),
            )
            for g in groups
            for t, v in g["fair_share"]["per_tenant"].items()
        ],
    )
    out += _table(
        ("policy", "max abs deviation (points)"),
        [(g["policy"], _pct(g["fair_share"]["max_abs_deviation_pts"])) for g in groups],
    )
    timed = [g for g in groups if g.get("fair_share_over_time")]
    if timed:
        out += [
            f"### Fair share over time, and preemption {tag}",
            "",
            (
                "Each allocation sample while jobs arrive: every tenant's GPUs held against its water-filled fair "
                "share (demand-capped, by weight, of the fleet's GPUs); the largest gap per sample, in points of "
                "the fleet's GPUs. Work lost = GPU-hours run since a victim's last checkpoint."
            ),
            "",
        ]
        out += _table(
            (
                "policy",
                "samples",
                "largest gap, mean (points)",
                "largest gap, p95 (points)",
                "split gap, mean (points)",
                "per tenant mean gap (points)",
                "victims",
                "by rule",
                "GPU-hours lost",
            ),
            [
                (
                    g["policy"],
                    g["fair_share_over_time"]["samples"],
                    _pct(g["fair_share_over_time"]["mean_max_gap_pts"]),
                    _pct(g["fair_share_over_time"]["p95_max_gap_pts"]),
                    _pct(g["fair_share_over_time"]["mean_split_gap_pts"]),
                    ", ".join(
                        f"{t} {_pct(v)}" for t, v in g["fair_share_over_time"]["per_tenant_mean_gap_pts"].items()
                    ),
                    g["preemption"]["victims"],
                    ", ".join(f"{k} {v}" for k, v in sorted(g["preemption"]["by_rule"].items())) or "–",
                    _pct(g["preemption"]["lost_gpu_hours"]),
                )
                for g in timed
            ],
        )
    if plots:
        out += [f"### Plots {tag}", ""]
        out += [f"![{p} ({mode} mode)]({p})" for p in plots] + [""]
    return out


def _markdown(summary: dict[str, Any], plots: dict[str, list[str]], shared_plots: Sequence[str]) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    modes = list(dict.fromkeys(g["mode"] for g in summary["groups"]))
    out = ["# Fleet simulation report", "", f"Written {now}. {len(summary['runs'])} runs.", "", "## What was run", ""]
    out += [f"- **{mode}** — {MODE_TEXT.get(mode, mode)}." for mode in modes] + [""]
    out += _table(
        ("mode", "policy", "seeds", "jobs per run", "background pods"),
        [
            (
                g["mode"],
                g["policy"],
                ", ".join(str(s) for s in g["seeds"]),
                ", ".join(
                    sorted(
                        {
                            str(r["jobs"])
                            for r in summary["runs"]
                            if (r["mode"], r["policy"]) == (g["mode"], g["policy"])
                        }
                    )
                ),
                g["background_pods"],
            )
            for g in summary["groups"]
        ],
    )
    out += ["## Fleet", ""]
    for fleet in summary["fleets"]:
        out += _fleet_markdown(fleet)
    out += ["## Notes", ""]
    out += [f"- {n}" for n in summary["notes"]] or ["- none"]
    out += ["", "## Summary", "", "Mode per row in the `mode` column.", "", "```", summary_table(summary), "```", ""]
    for mode in modes:
        out += _mode_markdown(mode, [g for g in summary["groups"] if g["mode"] == mode], plots.get(mode, []))
    if shared_plots:
        out += [
            "## Split gangs and false dispatches, every policy",
            "",
            "Each bar is labelled with its policy and mode.",
            "",
        ]
        out += [f"![{p}]({p})" for p in shared_plots] + [""]
    return "\n".join(out)


# --------------------------------------------------------------------------- plots


def _new_figure(width: float, height: float) -> Figure:
    # Figure + the Agg canvas directly: no pyplot, so no global state and no interactive backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _axes_grid(fig: Figure, count: int, columns: int) -> list[Axes]:
    cols = max(1, min(columns, count))
    rows = -(-count // cols)
    axes = fig.subplots(rows, cols, squeeze=False)
    flat: list[Axes] = [a for row in axes for a in row]
    for extra in flat[count:]:
        extra.set_visible(False)
    return flat[:count]


def _plot_allocation(mode: str, runs_by_policy: dict[str, list[RunResult]], path: Path) -> None:
    policies = list(runs_by_policy)
    fig = _new_figure(6.0 * min(len(policies), 2), 3.6 * -(-len(policies) // 2))
    fig.suptitle(f"GPU allocation per cluster — {mode} mode")
    for ax, policy in zip(_axes_grid(fig, len(policies), 2), policies):
        run = min(runs_by_policy[policy], key=lambda r: r.seed)
        samples = sorted(run.allocation, key=lambda s: s[0])
        hours = [t / 3600.0 for t, _ in samples]
        for cluster in run.fleet.clusters:
            if cluster.gpus:
                ax.step(
                    hours,
                    [100.0 * a.get(cluster.name, 0.0) / cluster.gpus for _, a in samples],
                    where="post",
                    label=cluster.name,
                    linewidth=1.2,
                )
        if run.fleet.gpus and samples:
            ax.step(
                hours,
                [100.0 * sum(a.values()) / run.fleet.gpus for _, a in samples],
                where="post",
                label="fleet",
                color="black",
                linestyle="--",
                linewidth=1.0,
            )
        ax.set_title(f"{policy} (seed {run.seed})")
        ax.set_xlabel("simulated hours")
        ax.set_ylabel("% of GPUs allocated")
        ax.set_ylim(0, 105)
        if not samples:
            ax.text(0.5, 0.5, "no allocation samples", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.legend(fontsize="small", loc="lower right")
    fig.savefig(path)


def _boxes(ax: Axes, groups: dict[str, list[float]], title: str) -> None:
    labels = [k for k, v in groups.items() if v]
    ax.set_title(title)
    if not labels:
        ax.text(0.5, 0.5, "no started items", ha="center", va="center", transform=ax.transAxes)
        return
    ax.boxplot([[v / 60.0 for v in groups[k]] for k in labels])
    ax.set_xticks(range(1, len(labels) + 1), labels)
    ax.set_yscale("symlog", linthresh=1.0)  # waits span seconds to hours; zero waits stay on the axis
    ax.set_ylim(bottom=0)
    ax.set_ylabel("queueing delay (min)")


def _plot_queueing(mode: str, runs_by_policy: dict[str, list[RunResult]], path: Path) -> None:
    policies = list(runs_by_policy)
    fig = _new_figure(11.0, 3.2 * len(policies))
    fig.suptitle(f"Queueing delay per tenant and per gang size — {mode} mode (all seeds)")
    axes = fig.subplots(len(policies), 2, squeeze=False)
    for row, policy in zip(axes, policies):
        outcomes = [o for r in runs_by_policy[policy] for o in r.outcomes]
        started = [(o, d) for o in outcomes if (d := o.queueing_delay_s) is not None]
        by_tenant: dict[str, list[float]] = {}
        for o, d in sorted(started, key=lambda od: od[0].item.tenant):
            by_tenant.setdefault(o.item.tenant, []).append(d)
        by_size: dict[str, list[float]] = {label: [] for label, _, _ in GANG_BUCKETS}
        for o, d in started:
            by_size[gang_bucket(o.item.replicas)].append(d)
        _boxes(row[0], by_tenant, f"{policy}: per tenant")
        _boxes(row[1], by_size, f"{policy}: per gang size (replicas)")
    fig.savefig(path)


def _plot_splits_and_false_dispatches(summary: dict[str, Any], path: Path) -> None:
    groups = summary["groups"]
    labels = [f"{g['policy']}\n({g['mode']})" for g in groups]
    fig = _new_figure(max(8.0, 2.4 * len(groups) + 2), 4.0)
    fig.suptitle("Split gangs and false dispatches per policy (mode under each bar)")
    split_ax, false_ax = fig.subplots(1, 2, squeeze=True)
    positions = list(range(len(groups)))
    splits = split_ax.bar(positions, [g["split_gangs"] for g in groups], color="tab:red")
    split_ax.bar_label(splits)  # a zero bar is invisible without its number
    split_ax.set_title("split gangs (count, all seeds)")
    rates = false_ax.bar(
        positions, [100.0 * (g["false_dispatches"]["rate"] or 0.0) for g in groups], color="tab:orange"
    )
    false_ax.bar_label(rates, fmt="%.2f")
    false_ax.set_title("false dispatches (% of dispatches)")
    for ax in (split_ax, false_ax):
        ax.set_xticks(positions, labels, fontsize="small")
    fig.savefig(path)


def write_report(results: Sequence[RunResult], out_dir: Path) -> Path:
    """Write `report.md`, `report.json` and the PNG plots of `results` into `out_dir` (created); the report's path."""
    if not results:
        raise ValueError("no run results to report")
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarise(results)
    (out_dir / JSON_NAME).write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")

    by_mode: dict[str, dict[str, list[RunResult]]] = {}
    for run in results:
        by_mode.setdefault(run.mode, {}).setdefault(run.policy, []).append(run)
    plots: dict[str, list[str]] = {}
    for mode, runs_by_policy in by_mode.items():
        allocation, queueing = f"allocation-{mode}.png", f"queueing-{mode}.png"
        _plot_allocation(mode, runs_by_policy, out_dir / allocation)
        _plot_queueing(mode, runs_by_policy, out_dir / queueing)
        plots[mode] = [allocation, queueing]
    shared = "splits-false-dispatches.png"
    _plot_splits_and_false_dispatches(summary, out_dir / shared)

    report = out_dir / MARKDOWN_NAME
    report.write_text(_markdown(summary, plots, [shared]), encoding="utf-8")
    return report
