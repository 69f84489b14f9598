"""One README table row per benchmark: which figures of its results it quotes, and in which words.

Each row quotes the best and the worst row of its benchmark's result table, so a slow scenario cannot
hide behind a fast one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from bench_results import (
    FiguresError,
    Results,
    Row,
    best,
    count,
    kilo,
    kilobytes,
    md_figure,
    megabytes,
    ms,
    pair,
    rate,
    seconds,
    span,
    worst,
)

# -- one row per benchmark -------------------------------------------------------------------------


def replay_row(results: Results) -> tuple[str, str]:
    data = results.json["replay"]
    by_trace: Mapping[str, Mapping[str, Row]] = data["results"]
    cells = [
        dict(policy, trace=trace, policy=name)
        for trace, policies in by_trace.items()
        for name, policy in policies.items()
    ]
    ours = by_trace["default"]["tandem-frag"]
    paper_fgd = by_trace["default"]["fgd"]["paper"]
    frag = [c for c in cells if c["policy"] == "tandem-frag"]
    low, high = (
        worst(frag, "vs_paper_fgd130", higher_is_better=True),
        best(frag, "vs_paper_fgd130", higher_is_better=True),
    )
    baselines = [
        dict(c, gap=round(abs(c["mean_alloc130"] - c["paper"]["mean_alloc130"]), 2)) for c in cells if "paper" in c
    ]
    off_default = max(c["gap"] for c in baselines if c["trace"] == "default")
    off = worst(baselines, "gap")
    slow, fast = (
        worst(cells, "decisions_per_second", higher_is_better=True),
        best(cells, "decisions_per_second", higher_is_better=True),
    )
    frag_slow = worst(frag, "decisions_per_second", higher_is_better=True)
    label = f"`replay` (FGD protocol, {len(data['seeds'])} seeds)"
    text = (
        f"tandem-frag {ours['mean_alloc130']:.2f} % allocated at 130 % load on `default` vs FGD's "
        f"published {paper_fgd['mean_alloc130']:.2f} %; vs published FGD at 130 % on every trace: best "
        f"{high['vs_paper_fgd130']:+.2f} points ({high['trace']}), worst {low['vs_paper_fgd130']:+.2f} "
        f"({low['trace']}). Our baselines within {off_default:.2f} points of the paper's on `default`, "
        f"worst {off['gap']:.2f} ({off['policy']} on {off['trace']}); {kilo(slow['decisions_per_second'])}"
        f"–{kilo(fast['decisions_per_second'])} decisions/s per process (slowest: {frag_slow['policy']} "
        f"on {frag_slow['trace']})"
    )
    return label, text


def _extender_scenario(row: Row) -> str:
    if row["passed"] == row["candidates"]:
        where = f"{row['cluster']} (all {count(row['candidates'])} pass)"
    else:
        where = f"{row['cluster']} cluster"
    return f"{where}, {'same pod shape' if row['cached'] else 'a new pod shape per request'}"


def extender_row(results: Results) -> tuple[str, str]:
    data = results.json["extender"]
    rows: list[Row] = data["rows"]
    nodes = max(r["nodes"] for r in rows)
    names = sorted(
        (r for r in rows if r["nodes"] == nodes and r["mode"] == "names"), key=lambda r: float(r["pair_p99_ms"])
    )
    top, bottom = best(names, "pair_p99_ms"), worst(names, "pair_p99_ms")
    goal = float(md_figure(results, "extender", r"Goal: pair p99 <= ([\d.]+) ms"))
    met = sum(1 for r in names if r["pair_p99_ms"] <= goal)

    def scenario(r: Row) -> str:
        tag = " (best)" if r is top else " (worst p99)" if r is bottom else ""
        return (
            f"{_extender_scenario(r)}{tag}: p50 {ms(r['pair_p50_ms'])}, p99 {ms(r['pair_p99_ms'])}, "
            f"{count(r['pairs_per_s'])} pairs/s"
        )

    loads = [float(r["load_1m"]) for r in names]
    decide = [r for r in data["decide_in_process"] if r["nodes"] == nodes]
    churn = [r for r in data["churn_in_process"] if r["nodes"] == nodes]
    nodelist = [r for r in rows if r["nodes"] == nodes and r["mode"] == "nodelist"]
    nodelist_worst = worst(nodelist, "pair_p99_ms")
    label = f"`extender`, {count(nodes)} candidate nodes, names mode, filter + prioritize pair over loopback HTTP"
    text = (
        "; ".join(scenario(r) for r in names)
        + f"; load {min(loads):.2f}–{max(loads):.2f} (goal p99 ≤ {goal:g} ms: met by {met} of {len(names)}). "
        + "The decision work alone, in process: "
        + f"p50 {span([r['pair_p50_ms'] for r in decide], ms)}, "
        + f"p99 {span([r['pair_p99_ms'] for r in decide], ms)}; with a bind before every pair "
        + f"p50 {ms(churn[0]['pair_after_bind_p50_ms'])}, p99 {ms(churn[0]['pair_after_bind_p99_ms'])}. "
        + "NodeList mode (`nodeCacheCapable: false`) is parse-bound: "
        + f"p50 {span([r['pair_p50_ms'] for r in nodelist], ms)}, worst p99 "
        + f"{ms(nodelist_worst['pair_p99_ms'])}: {_extender_scenario(nodelist_worst)} — use names mode"
    )
    return label, text


def broker_submissions_row(results: Results) -> tuple[str, str]:
    rows: list[Row] = results.json["broker"]["submissions"]
    connected = [r for r in rows if r["cluster"]]
    alone = sorted((r for r in rows if not r["cluster"]), key=lambda r: -int(r["items_per_call"]))
    top = best(connected, "per_s", higher_is_better=True)
    bottom = worst(connected, "per_s", higher_is_better=True)
    goal = md_figure(results, "broker", r"Goals: >= ([\d,]+) durable submissions/s")

    def per_call(r: Row) -> str:
        n = int(r["items_per_call"])
        return f"{n} jobs per `SubmitJobs` call" if n > 1 else "one job per call"

    label = "`broker`, durable submissions over gRPC (TLS, SQLite FULL sync, placer running, a cluster connected)"
    text = (
        f"best {rate(top['per_s'])} with {per_call(top)} (call p99 {ms(top['call_p99_ms'])}); worst "
        f"{rate(bottom['per_s'])} with {per_call(bottom)} (gRPC's per-call cost in Python dominates; "
        f"call p99 {ms(bottom['call_p99_ms'])}); without a cluster "
        + " and ".join(rate(r["per_s"]) for r in alone)
        + f" (goal ≥ {goal}/s)"
    )
    return label, text


def broker_decisions_row(results: Results) -> tuple[str, str]:
    data = results.json["broker"]["decisions"]
    rows: list[Row] = data["rows"]
    top, bottom = best(rows, "p99_ms"), worst(rows, "p99_ms")
    goal = md_figure(results, "broker", r"decision p99 <= ([\d.]+) ms")
    label = (
        f"`broker`, placement decision for a gang over {data['clusters']} clusters × "
        f"{count(data['nodes_per_cluster'])} nodes"
    )
    text = (
        f"p50 {ms(data['all_p50_ms'])}, p99 {ms(data['all_p99_ms'])} over all {len(rows)} jobs; "
        f"best ({top['job']}) p99 {ms(top['p99_ms'])}; worst ({bottom['job']}) p99 "
        f"{ms(bottom['p99_ms'])}, max {ms(bottom['max_ms'])} (goal p99 ≤ {goal} ms)"
    )
    return label, text


def store_row(results: Results) -> tuple[str, str]:
    runs: list[Row] = results.json["store"]["runs"]
    sqlite = [r for r in runs if r["mode"] in ("group commit", "one txn per submission")]
    group = next(r for r in sqlite if r["mode"] == "group commit" and r["submitters"] == 64)
    single = next(r for r in sqlite if r["mode"] == "one txn per submission" and r["submitters"] == 64)
    top = best(sqlite, "per_s", higher_is_better=True)
    bottom = worst(sqlite, "per_s", higher_is_better=True)
    pg = [r for r in runs if r["mode"].startswith("PostgreSQL") and r["submitters"] == 64]
    pg_group = next(r for r in pg if "group commit" in r["mode"])
    pg_single = next(r for r in pg if "one txn" in r["mode"])
    label = "`store`, group commit vs one transaction per submission"
    text = (
        f"{group['submitters']} concurrent submitters (SQLite): {rate(group['per_s'])} "
        f"({count(group['per_s_min'])}–{count(group['per_s_max'])} over {group['runs']} runs), ack p99 "
        f"{ms(group['ack_p99_ms'])} vs {rate(single['per_s'])}, ack p99 {ms(single['ack_p99_ms'])}; "
        f"best: {top['mode']}, {top['submitters']} submitters, {rate(top['per_s'])}; worst: {bottom['mode']}, "
        f"{bottom['submitters']} submitters, {rate(bottom['per_s'])}, ack p99 {ms(bottom['ack_p99_ms'])}; "
        f"PostgreSQL at {pg_group['submitters']}: {rate(pg_group['per_s'])} vs {rate(pg_single['per_s'])} "
        f"(disk-dependent; 1-min load {results.json['store']['meta']['load_avg_1m']:.2f})"
    )
    return label, text


def _case(row: Row) -> str:
    return str(row["case"]).split(": ", 1)[1]


def placement_row(results: Results) -> tuple[str, str]:
    rows: list[Row] = results.json["placement"]["rows"]
    capacity = [r for r in rows if "us_per_node" in r]
    gangs = [r for r in rows if str(r["case"]).startswith("fit_gang()")]
    nodes = re.search(r"(\d+) nodes", str(gangs[0]["case"]))
    if nodes is None:
        raise FiguresError("placement.json: no node count in the fit_gang() case")
    fast_c, slow_c = best(capacity, "us_per_node"), worst(capacity, "us_per_node")
    fast_g, slow_g = best(gangs, "p50_ms"), worst(gangs, "p50_ms")
    label = "`placement`, core fit"
    text = (
        f"`capacity()` best {fast_c['us_per_node']:.1f} µs per node ({_case(fast_c)}), worst "
        f"{slow_c['us_per_node']:.1f} µs ({_case(slow_c)}); `fit_gang()` over {count(int(nodes.group(1)))} "
        f"nodes p50 best {ms(fast_g['p50_ms'])} ({_case(fast_g)}), worst {ms(slow_g['p50_ms'])} "
        f"({_case(slow_g)})"
    )
    return label, text


def agent_row(results: Results) -> tuple[str, str]:
    rows: list[Row] = sorted(results.json["agent"]["rows"], key=lambda r: int(r["nodes"]))
    small, large = rows[0], rows[-1]
    allow = [r["snapshot_allow_list"] for r in rows]
    every = [r["snapshot_all_labels"] for r in rows]
    deltas = sorted(large["deltas"], key=lambda d: int(d["window_nodes"]))
    label = (
        f"`agent`, inventory reports (~{large['labels_per_node']:.0f} labels per node, "
        f"{large['labels_reported_per_node']:.1f} reported)"
    )
    text = (
        f"snapshot {megabytes(allow[0]['bytes'])} at {count(small['nodes'])} nodes, "
        f"{megabytes(allow[-1]['bytes'])} at {count(large['nodes'])} "
        f"({megabytes(every[0]['bytes'])} / {megabytes(every[-1]['bytes'])} with every label); encode "
        f"{pair(allow[0]['cold_cpu_p50_ms'], allow[-1]['cold_cpu_p50_ms'])} cold (CPU, load "
        f"{small['load_1m']:.2f} / {large['load_1m']:.2f}), worst {ms(every[-1]['cold_cpu_p50_ms'])} "
        f"with every label at {count(large['nodes'])}; "
        f"{pair(allow[0]['warm_cpu_p50_ms'], allow[-1]['warm_cpu_p50_ms'])} on a resync; a delta of "
        + " / ".join(str(d["window_nodes"]) for d in deltas)
        + f" changed nodes at {count(large['nodes'])} nodes: "
        + " / ".join(kilobytes(d["bytes_p50"]) for d in deltas)
        + ", "
        + " / ".join(ms(d["encode_cpu_p50_ms"]).split(" ")[0] for d in deltas)
        + " ms ("
        + " / ".join(count(d["node_updates_per_s"]) for d in deltas)
        + " node updates/s)"
    )
    return label, text


def fairness_row(results: Results) -> tuple[str, str]:
    conv = results.json["fairness"]["convergence"]
    reclaim = results.json["fairness"]["reclaim"]
    weights = md_figure(results, "fairness", r"tenants weighted ([\d :]+?) on")
    split = conv["split_second_half_pct"]
    times = reclaim["submit_to_dispatch_s"]
    label = "`fairness`, the real broker with a scripted cluster"
    text = (
        f"tenants weighted {weights} within one job of their fair share {conv['converged_after_s']:g} s after "
        f"the others arrived ({conv['within_one_job_after_pct']:.1f} % of samples after), GPUs in use "
        f"split "
        + " / ".join(f"{v:.1f}" for v in split.values())
        + " % ("
        + " / ".join(split)
        + "); borrowed GPUs back to their owner (submit → Dispatch) "
        f"p50 {times['p50']:.3f} s, worst of {reclaim['runs']} runs {times['max']:.3f} s, with rounds "
        f"every {reclaim['interval_s']:g} s, grace not included"
    )
    return label, text


def fleetview_row(results: Results) -> tuple[str, str]:
    data = results.json["fleetview"]
    setup = data["setup"]
    renders: Mapping[str, Mapping[str, float]] = data["browser"]["first_render_ms"]
    pages: list[dict[str, Any]] = sorted(({"page": k, **v} for k, v in renders.items()), key=lambda r: float(r["p95"]))
    bottom = worst(pages, "p95")
    names = {
        "fleet": f"fleet ({count(data['browser']['domain_cells'])} rack cells)",
        "waiting job": f"a waiting job with {setup['clusters']} per-cluster verdicts",
    }

    def page(r: Row) -> str:
        tag = "worst: " if r is bottom else ""
        return f"{tag}{names.get(str(r['page']), str(r['page']))} {pair(r['p50'], r['p95'])}"

    live = data["browser"]["live_update_ms"]
    label = (
        f"`fleetview`, the real broker and headless Chromium, {setup['clusters']} clusters × "
        f"{count(setup['nodes'])} nodes, {count(setup['jobs'])} jobs"
    )
    text = (
        "first render p50 / p95: "
        + ", ".join(page(r) for r in pages)
        + f" (one exact gang fit per cluster); a cancel on the open jobs page p50 {ms(live['p50'])}, "
        f"p95 {ms(live['p95'])}"
    )
    return label, text


def fleet_row(results: Results) -> tuple[str, str]:
    rows: list[Row] = sorted(results.json["fleet"]["results"], key=lambda r: int(r["replicas"]))
    bottom = worst(rows, "running_max_s")
    label = "`fleet`, two simulated clusters end to end"

    def gang(r: Row) -> str:
        return f"{r['replicas']} × {r['gpus_per_replica']}"

    text = (
        "submission to every pod bound: "
        + ", ".join(
            f"{gang(r)}-GPU gang p50 {seconds(r['bound_p50_s'])} (max {seconds(r['bound_max_s'])})" for r in rows
        )
        + "; to RUNNING p50 "
        + " / ".join(seconds(r["running_p50_s"]) for r in rows)
        + f", worst {seconds(bottom['running_max_s'])} ({gang(bottom)}, max of {bottom['runs']} runs) "
        "(includes placement, dispatch, admission dry run, object creation, the Job controller, pins, "
        "Start, binding through the extender; excludes image pulls)"
    )
    return label, text


def scale_row(results: Results) -> tuple[str, str]:
    data = results.json["scale"]
    phases: list[Row] = data["phases"]
    top, bottom = best(phases, "placement_latency_p99_ms"), worst(phases, "placement_latency_p99_ms")
    connect, layout, checks = data["connect"], data["layout"], data["checks"]

    def phase(r: Row, tag: str) -> str:
        overload = " (overload)" if r["placed_per_s"] < r["offered_per_s"] else ""
        return (
            f"{tag}: {r['offered_per_s']:g} jobs/s offered{overload}: {r['placed_per_s']:.1f} placed/s, submit → "
            f"Dispatch p50 {ms(r['placement_latency_p50_ms'])}, p99 {ms(r['placement_latency_p99_ms'])}, "
            f"decision p99 {ms(r['decision_p99_ms'])}, broker CPU {ms(r['broker_cpu_ms_per_placed_job'])} "
            "per placed job"
        )

    label = (
        f"`scale`, the real broker against {layout['clusters']} synthetic agents × "
        f"{count(layout['nodes_per_cluster'])} nodes (no API servers, no extenders)"
    )
    text = (
        f"connect {connect['seconds']:.1f} s, broker RSS {connect['broker_rss_mib_connected']:.0f} MiB; "
        f"{phase(top, 'best')}; {phase(bottom, 'worst')}; "
        f"{checks['overcommits']} overcommits, {checks['gangs_split']} split gangs"
    )
    return label, text


ROWS: tuple[Callable[[Results], tuple[str, str]], ...] = (
    replay_row,
    extender_row,
    broker_submissions_row,
    broker_decisions_row,
    store_row,
    placement_row,
    agent_row,
    fairness_row,
    fleetview_row,
    fleet_row,
    scale_row,
)
