"""The fleet simulator's summary as text: the fixed-width table the demo prints (`summary_table`) and the
Markdown of `report.md` (`markdown`), section by section."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any

from fleetsim.summary import LARGE_GANG_REPLICAS

__all__ = ["MODE_TEXT", "markdown", "summary_table"]

MODE_TEXT = {
    "wire": "wire mode: the real broker, extender and agent processes over simulated Kubernetes control planes, "
    "with time compressed (the factor and the pipeline's measured overhead are in the notes); waits include "
    "the real pipeline's latency",
    "fast": "fast mode: the broker's decision code in virtual time (a discrete-event loop, no processes); the "
    "comparison of cluster choices over seeds",
}


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


def markdown(summary: dict[str, Any], plots: dict[str, list[str]], shared_plots: Sequence[str]) -> str:
    """`report.md` of `summary`, linking the plots drawn per mode (`plots`) and for every policy (`shared_plots`)."""
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
