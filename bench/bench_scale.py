"""Scale mode (FLEET-NOTES S-5): the real broker process against 100 clusters x 1,000 nodes of synthetic agents.

Run: ``python -m bench.bench_scale [--clusters 100 --nodes 1000 --jobs 1000 --rate 40]`` (``--quick`` for a
smoke run). Writes bench/results/scale.md and bench/results/scale.json.

The agents (fleetsim.scale) all run in this process on asyncio and grpc.aio, each over its own mutual-TLS
stream; the broker is `python -m broker.main --config broker.yaml` with its SQLite store, so its CPU and RSS
(read from /proc) are its own. Two phases of jobs follow the connect: a steady one at a rate the broker
keeps up with, and an overload one offered faster than it can place, which shows its ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetsim.scale import (
    DEFAULT_MIX,
    FleetLayout,
    Phase,
    PhaseResult,
    ScaleResult,
    percentile,
    run_scale,
)

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 1 << 20


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return float("nan")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _phase_doc(p: PhaseResult) -> dict[str, Any]:
    lat = list(p.placement_latency_s.values())
    by_kind: dict[str, list[float]] = {}
    for job_id, label in p.kinds.items():
        by_kind.setdefault(label, []).append(p.placement_latency_s[job_id])
    return {
        "jobs": p.phase.jobs,
        "offered_per_s": p.phase.rate_per_s,
        "submit_s": round(p.submit_s, 2),
        "placed": p.placed,
        "place_window_s": round(p.place_window_s, 2),
        "placed_per_s": round(p.placed_per_s, 1),
        "placement_latency_p50_ms": _ms(percentile(lat, 50)),
        "placement_latency_p99_ms": _ms(percentile(lat, 99)),
        "placement_latency_max_ms": _ms(max(lat, default=0.0)),
        "placement_latency_by_kind": {
            k: {"jobs": len(v), "p50_ms": _ms(percentile(v, 50)), "p99_ms": _ms(percentile(v, 99))}
            for k, v in by_kind.items()
        },
        "decisions": int(p.decisions.count),
        "decision_p50_ms": _ms(p.decisions.quantile(0.5)),
        "decision_p99_ms": _ms(p.decisions.quantile(0.99)),
        "decision_mean_ms": _ms(p.decisions.mean),
        "time_to_placement_p50_ms": _ms(p.time_to_placement.quantile(0.5)),
        "time_to_placement_p99_ms": _ms(p.time_to_placement.quantile(0.99)),
        "broker_cpu_s_placing": round(p.place_cpu_s, 2),
        "agents_cpu_s_placing": round(p.agents_cpu_s, 2),
        "others_cpu_s_placing": round(p.others_cpu_s, 2),
        "broker_cpu_ms_per_placed_job": round(p.cpu_ms_per_placed_job, 2),
        "drain_s": round(p.drain_s, 2),
        "broker_cpu_s_until_drained": round(p.total_cpu_s, 2),
        "broker_cpu_ms_per_job_life": round(p.cpu_ms_per_job_life, 2),
        "broker_rss_mib_end": round(p.broker_rss_end / MIB, 1),
        "refused": p.refused[:10],
        "final_states": p.final_states,
    }


def _doc(r: ScaleResult, wall_s: float, load_start: tuple[float, float, float]) -> dict[str, Any]:
    lay, rec, t = r.layout, r.recorded, r.tally
    return {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "memory_gib": round(_memory_gib(), 1),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        },
        "layout": {
            "clusters": lay.clusters,
            "nodes_per_cluster": lay.nodes,
            "nodes": lay.clusters * lay.nodes,
            "gpus": lay.clusters * lay.gpus_per_cluster,
            "nodes_per_rack": lay.nodes_per_rack,
            "racks_per_block": lay.racks_per_block,
        },
        "inventory": {
            "record_s": round(rec.record_s, 2),
            "fixture_labels": rec.raw_labels,
            "reported_labels": rec.reported_labels,
            "snapshot_bytes_per_cluster": rec.snapshot_bytes,
            "snapshot_bytes_untrimmed": rec.untrimmed_snapshot_bytes,
        },
        "connect": {
            "seconds": round(r.connect_s, 2),
            "broker_cpu_s": round(r.connect_cpu_s, 2),
            "agents_cpu_s": round(r.connect_agents_cpu_s, 2),
            "others_cpu_s": round(r.connect_others_cpu_s, 2),
            "broker_rss_mib_idle": round(r.broker_rss_idle / MIB, 1),
            "broker_rss_mib_connected": round(r.broker_rss_connected / MIB, 1),
            "broker_idle_cpu_share": round(r.idle_cpu_per_s, 4),
        },
        "mix": [{"kind": k.label, "replicas": k.replicas, "level": k.level, "weight": k.weight} for k in r.mix],
        "run_seconds": list(r.run_seconds),
        "phases": [_phase_doc(p) for p in r.phases],
        "end": {
            "broker_rss_mib": round(r.broker_rss_end / MIB, 1),
            "broker_rss_mib_peak": round(r.broker_rss_peak / MIB, 1),
            "agents_process_rss_mib": round(r.agents_rss_end / MIB, 1),
        },
        "checks": {
            "overcommits": len(t.overcommits),
            "overcommit_examples": t.overcommits[:5],
            "redispatches": t.redispatches,
            "cancelled": t.cancelled,
            "stream_errors": t.stream_errors[:5],
            "max_cluster_gpus_held": max(t.peak_gpus.values(), default=0),
            "cluster_gpus": lay.gpus_per_cluster,
            "gangs_split": sum(
                1
                for p in r.phases
                for j, label in p.kinds.items()
                if _split(r, label, t.placements[j].racks, t.placements[j].blocks)
            ),
            "agent_messages_sent": t.messages_sent,
        },
        "wall_s": round(wall_s, 1),
    }


def _split(r: ScaleResult, label: str, racks: frozenset[str], blocks: frozenset[str]) -> bool:
    kind = next(k for k in r.mix if k.label == label)
    return (kind.level == "rack" and len(racks) != 1) or (kind.level == "block" and len(blocks) != 1)


def _write(d: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(d, indent=2) + "\n")
    m, lay, inv, c, ch, end = d["machine"], d["layout"], d["inventory"], d["connect"], d["checks"], d["end"]
    la0, la1 = (", ".join(f"{x:.2f}" for x in m[k]) for k in ("load_average_start", "load_average_end"))
    mix = ", ".join(f"{k['kind']} ({k['weight']:.0%})" for k in d["mix"])
    lines = [
        "# Scale mode: the broker against synthetic agents (FLEET-NOTES S-5)",
        "",
        f"Python {m['python']}, {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB. Load average "
        f"(1, 5, 15 min) {la0} at the start, {la1} at the end. Wall time of the whole run {d['wall_s']} s.",
        "",
        "## What runs",
        "",
        f"- {lay['clusters']} clusters x {lay['nodes_per_cluster']} nodes ({lay['nodes']:,} nodes, {lay['gpus']:,} "
        f"GPUs): racks of {lay['nodes_per_rack']} nodes, blocks of {lay['racks_per_block']} racks, one zone.",
        "- One synthetic agent per cluster, all in the benchmark process (asyncio, grpc.aio), each on its own "
        "mutual-TLS `ClusterService.Connect` stream with a client certificate naming its cluster. They speak the "
        "real agent's protocol through its own stream and message builders (`extender.agent.stream`, "
        "`extender.agent.wire`): Hello (name, region, role, topology levels, tenant namespaces), a full snapshot, "
        "coalesced deltas (0.15 s) when pods bind or end, heartbeats. Each Dispatch is accepted, its pods are "
        "reported gated at once, bound and running on the broker's Start, and succeeded "
        f"{d['run_seconds'][0]:g}-{d['run_seconds'][1]:g} s later (uniform), when their nodes are reported free.",
        "- Inventories are recorded: the HGX H100 node of tests/fixtures/cluster.json, renamed and given "
        "rack/block labels, went once through the extender's `Inventory` and the agent's encoder with the default "
        f"label allow-list ({inv['fixture_labels']} labels -> {inv['reported_labels']} reported), free and with "
        f"one 8-GPU replica bound ({inv['record_s']} s for both). Every cluster replays those bytes with its own "
        f"node names: {inv['snapshot_bytes_per_cluster']:,} bytes per cluster snapshot "
        f"({inv['snapshot_bytes_untrimmed']:,} with every label).",
        "- The broker: `python -m broker.main --config broker.yaml` in its own process (SQLite file store, WAL, "
        "synchronous=FULL; heartbeat interval 5 s). No API server, no extender, no kube-scheduler.",
        f"- Jobs (`broker.launcher.client`, one tenant): {mix}; every replica 8 GPUs, 96 CPUs, 1 TiB, tolerating the "
        "node's GPU taint. Submitted at a steady rate, one SubmitJobs call per 50 ms tick.",
        "",
        "## How it is measured",
        "",
        "- Broker CPU: user + system seconds from /proc/<pid>/stat; RSS: VmRSS (peak: VmHWM) from /proc/<pid>/status.",
        "- Connect: first Hello until ListClusters shows every cluster connected, fresh, with all its nodes "
        "(16 handshakes + snapshots in flight at a time).",
        "- Placed = the job's Dispatch reached its cluster's agent (QUEUED -> RESERVED -> DISPATCHED). Placed per "
        "second = jobs / (first submission -> last job's first Dispatch). Placement latency: a job's SubmitJobs "
        "call -> its Dispatch at the agent.",
        "- Decision latency: the broker's own histogram `tandem_broker_decision_seconds` (one `decide` per job "
        "per look) scraped from its metrics port before and after the phase; p50/p99 interpolated inside the "
        "buckets as PromQL's histogram_quantile does (bounds 0.5, 1, 2.5, 5, 10, 25 ms ...), so they are "
        "coarse. `time_to_placement` is its histogram from submission (or re-queue) to the committed reservation.",
        "- Broker CPU per placed job: broker CPU over the placement window / jobs. It covers everything the broker "
        "did meanwhile: submissions, decisions, commits, dispatches, and the agents' acks, statuses and deltas "
        "(including the ends of the phase's first jobs). CPU per job life runs until every job of the phase has "
        "ended.",
        "- The agents share the machine's two cores with the broker, and so does anything else running on it: the "
        "tables give the CPU the broker, the agents' process and all other processes (/proc/stat) used. Rates "
        "move with that competition from run to run; CPU per job moves less.",
        "",
        "## Connect",
        "",
        "| clusters x nodes | connect s | broker CPU s | agents' CPU s | other processes' CPU s | broker RSS idle "
        "MiB | broker RSS connected MiB | idle broker CPU (heartbeats) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {lay['clusters']} x {lay['nodes_per_cluster']} | {c['seconds']} | {c['broker_cpu_s']} | "
        f"{c['agents_cpu_s']} | {c['others_cpu_s']} | {c['broker_rss_mib_idle']} | {c['broker_rss_mib_connected']} | "
        f"{c['broker_idle_cpu_share']:.1%} |",
        "",
        "## Jobs",
        "",
        "Steady: offered at a rate the broker keeps up with, so placement latency is the pipeline's. Overload: "
        "offered faster than it places, so jobs queue (latency is mostly waiting) and placed/s is its ceiling "
        "here. Each phase waits until its jobs have all ended before the next starts.",
        "",
        "| phase | jobs | offered /s | placed /s | placement latency p50 / p99 ms | decisions | decision p50 / p99 "
        "ms | time to placement p50 / p99 ms | broker CPU ms / placed job | broker CPU ms / job life | placing: "
        "broker / agents' / other processes' CPU s | broker RSS MiB after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = ["steady", "overload"]
    for i, p in enumerate(d["phases"]):
        lines.append(
            f"| {names[i] if i < len(names) else i + 1} | {p['jobs']} | {p['offered_per_s']:g} | {p['placed_per_s']} | "
            f"{p['placement_latency_p50_ms']} / {p['placement_latency_p99_ms']} | {p['decisions']} | "
            f"{p['decision_p50_ms']} / {p['decision_p99_ms']} | {p['time_to_placement_p50_ms']} / "
            f"{p['time_to_placement_p99_ms']} | {p['broker_cpu_ms_per_placed_job']} | {p['broker_cpu_ms_per_job_life']}"
            f" | {p['broker_cpu_s_placing']} / {p['agents_cpu_s_placing']} / {p['others_cpu_s_placing']}"
            f" | {p['broker_rss_mib_end']} |"
        )
    lines += [
        "",
        "Placement latency by kind (submit -> Dispatch at the agent, p50 / p99 ms):",
        "",
        "| phase | " + " | ".join(k["kind"] for k in d["mix"]) + " |",
        "|---|" + "---:|" * len(d["mix"]),
    ]
    for i, p in enumerate(d["phases"]):
        cells = [
            f"{p['placement_latency_by_kind'][k['kind']]['p50_ms']} / "
            f"{p['placement_latency_by_kind'][k['kind']]['p99_ms']}"
            if k["kind"] in p["placement_latency_by_kind"]
            else "-"
            for k in d["mix"]
        ]
        lines.append(f"| {names[i] if i < len(names) else i + 1} | " + " | ".join(cells) + " |")
    states = "; ".join(", ".join(f"{k} {v}" for k, v in sorted(p["final_states"].items())) for p in d["phases"])
    lines += [
        "",
        "## End and checks",
        "",
        f"- Broker RSS at the end {end['broker_rss_mib']} MiB (peak {end['broker_rss_mib_peak']} MiB); the agents' "
        f"process {end['agents_process_rss_mib']} MiB.",
        f"- Final job states per phase: {states}.",
        f"- Nodes given more GPUs than they have: {ch['overcommits']}. Largest GPUs held at once in one cluster: "
        f"{ch['max_cluster_gpus_held']:,} of {ch['cluster_gpus']:,}. Gangs split across racks/blocks: "
        f"{ch['gangs_split']}. Dispatches after a job's first: {ch['redispatches']}; cancels: {ch['cancelled']}; "
        f"agent streams that ended: {len(ch['stream_errors'])}. Agent messages sent: {ch['agent_messages_sent']:,}.",
        "",
    ]
    (RESULTS / "scale.md").write_text("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--nodes", type=int, default=1000, help="nodes per cluster")
    p.add_argument("--jobs", type=int, default=1000, help="jobs of the steady phase")
    p.add_argument("--rate", type=float, default=40.0, help="submissions per second of the steady phase")
    p.add_argument("--overload-jobs", type=int, default=2000, help="jobs of the overload phase (0: none)")
    p.add_argument("--overload-rate", type=float, default=250.0, help="submissions per second of the overload phase")
    p.add_argument(
        "--run-seconds",
        type=float,
        nargs=2,
        default=(10.0, 20.0),
        metavar=("MIN", "MAX"),
        help="how long a job runs once started (uniform)",
    )
    p.add_argument("--quick", action="store_true", help="10 clusters x 200 nodes, 200 + 200 jobs")
    args = p.parse_args(argv)
    if args.quick:
        args.clusters, args.nodes, args.jobs, args.overload_jobs, args.run_seconds = 10, 200, 200, 200, (3.0, 6.0)
    phases = [Phase(args.jobs, args.rate)]
    if args.overload_jobs:
        phases.append(Phase(args.overload_jobs, args.overload_rate))
    layout = FleetLayout(clusters=args.clusters, nodes=args.nodes)
    load_start = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="tandem-scale-"))
    t0 = time.perf_counter()
    try:
        run_seconds = (args.run_seconds[0], args.run_seconds[1])
        result = asyncio.run(run_scale(workdir, layout, phases, mix=DEFAULT_MIX, run_seconds=run_seconds))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    doc = _doc(result, time.perf_counter() - t0, load_start)
    _write(doc)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
