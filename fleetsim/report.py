"""The fleet simulator's report directory: `write_report` writes `report.json` (the summary), `report.md` and the
PNG plots it draws (allocation over time, queueing delays, split gangs and false dispatches)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetsim.model import RunResult
from fleetsim.report_markdown import markdown
from fleetsim.summary import GANG_BUCKETS, gang_bucket, summarise

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["JSON_NAME", "MARKDOWN_NAME", "write_report"]

JSON_NAME = "report.json"
MARKDOWN_NAME = "report.md"


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
    report.write_text(markdown(summary, plots, [shared]), encoding="utf-8")
    return report
