"""Agent inventory reports: snapshot size and encode cost, delta size and rate (FLEET-NOTES A-21).

The cluster is the fixture cluster's node shapes replicated (as in bench_extender: bound pods,
ResourceSlices and claims per copy, so 1 node in 12 is a MIG node and 1 in 12 a DRA node), with
the ~60 GFD / NFD / cloud labels real GPU nodes carry and bound gang pods of held reservations.
The inventory is the extender's own (`Inventory` -> `Snapshot.facts`); the encoder is
`extender.agent.encode.ReportBuilder`. Timed: building the report message and serialising it to
bytes (what the gRPC stream then writes), wall clock and CPU time of this process.

* snapshot, cold: a new builder (a new stream after an agent start): every node encoded;
* snapshot, warm: the same builder again (a resync): node bytes reused, the message reassembled;
* delta, K nodes changed in one coalescing window (a pod bound on each), K = 1, 10, 100; the
  facts rebuild (`Inventory.snapshot()`, shared with the extender's filter) is timed apart.

Run: python -m bench.bench_agent [--quick]   -> bench/results/agent.{md,json}
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.bench_extender import FIXTURES, REPO, RESULTS, synth_cluster

SIZES = (1000, 5000)
WINDOWS = (1, 10, 100)

_NFD_CPUID = ("AESNI", "AVX", "AVX2", "AVX512F", "AVX512VNNI", "AMXBF16", "AMXINT8", "FMA3")
_EXTRA_LABELS: dict[str, str] = {
    **{f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true" for f in _NFD_CPUID},
    "feature.node.kubernetes.io/cpu-hardware_multithreading": "true",
    "feature.node.kubernetes.io/cpu-model.family": "6",
    "feature.node.kubernetes.io/cpu-model.id": "143",
    "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
    "feature.node.kubernetes.io/cpu-pstate.status": "active",
    "feature.node.kubernetes.io/cpu-pstate.turbo": "true",
    "feature.node.kubernetes.io/kernel-config.NO_HZ": "true",
    "feature.node.kubernetes.io/kernel-version.full": "6.8.0-1015-nvidia",
    "feature.node.kubernetes.io/kernel-version.major": "6",
    "feature.node.kubernetes.io/kernel-version.minor": "8",
    "feature.node.kubernetes.io/memory-numa": "true",
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/pci-15b3.present": "true",
    "feature.node.kubernetes.io/rdma.available": "true",
    "feature.node.kubernetes.io/rdma.capable": "true",
    "feature.node.kubernetes.io/storage-nonrotationaldisk": "true",
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID.major": "24",
    "nvidia.com/cuda.runtime-version.full": "13.0",
    "nvidia.com/cuda.runtime-version.major": "13",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.deploy.container-toolkit": "true",
    "nvidia.com/gpu.deploy.dcgm": "true",
    "nvidia.com/gpu.deploy.dcgm-exporter": "true",
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.driver": "pre-installed",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    "nvidia.com/gpu.mode": "compute",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/vgpu.present": "false",
    "beta.kubernetes.io/arch": "amd64",
    "beta.kubernetes.io/os": "linux",
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "nodepool.example.com/name": "gpu-pool-a",
}


def realistic_cluster(n_nodes: int, reservations: int) -> tuple[dict[str, Any], list[str], list[tuple[str, int]]]:
    """The synthetic cluster with real-world label counts and `reservations` held gangs, each with
    two replicas bound on H100 nodes; returns the List, the node names and the reservation keys."""
    cluster, nodes = synth_cluster(n_nodes)
    for n in nodes:
        labels = n["metadata"]["labels"]
        for k, v in _EXTRA_LABELS.items():
            labels.setdefault(k, v)
        labels["nvidia.com/gfd.timestamp"] = str(1_780_000_000 + len(labels))
    template = json.loads((FIXTURES / "args-want-8-names.json").read_text())["Pod"]
    h100 = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"].startswith("h100-r")]
    keys = []
    for r in range(reservations):
        job = f"train-{r}"
        keys.append((job, 1))
        for index in range(2):
            p = copy.deepcopy(template)
            p["metadata"].update(name=f"{job}-1-workers-{index}", uid=f"gang-{r}-{index}")
            p["metadata"]["labels"] = {
                "tandem.dev/job": job,
                "tandem.dev/attempt": "1",
                "tandem.dev/pod-set": "workers",
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
            p["spec"]["nodeName"] = h100[(2 * r + index) % len(h100)]
            p["status"] = {"phase": "Running"}
            cluster["items"].append(p)
    return cluster, [n["metadata"]["name"] for n in nodes], keys


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """fn's result, wall seconds and CPU seconds of this process."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def p50_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 3)


def bound_pod(k: int, node: str) -> dict[str, Any]:
    """A small running pod (CPU and memory only, so it fits every node shape) bound to `node`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"churn-{k}", "namespace": "team-a", "uid": f"churn-{k}", "labels": {}},
        "spec": {
            "nodeName": node,
            "schedulerName": "tandem-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/worker:1",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def measure(size: int, runs: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from extender.agent.encode import LabelFilter, ReportBuilder
    from extender.config import ExtenderConfig
    from extender.inventory import Inventory

    cluster, names, keys = realistic_cluster(size, reservations=max(size // 50, 1))
    config = ExtenderConfig()
    inv = Inventory(config)

    def load() -> None:
        inv.load_list(cluster)
        inv.snapshot()

    _, load_s, _ = timed(load)
    facts = inv.snapshot().facts
    allow = LabelFilter.build(config.topology.keys)
    every = LabelFilter.everything()
    labels_in = statistics.fmean(len(f.node.labels) for f in facts)
    labels_out = statistics.fmean(len(allow.apply(f.node.labels)) for f in facts)
    row: dict[str, Any] = {
        "nodes": size,
        "reservations": len(keys),
        "inventory_load_s": round(load_s, 2),
        "labels_per_node": round(labels_in, 1),
        "labels_reported_per_node": round(labels_out, 1),
    }

    for label, flt, n_runs in (("allow_list", allow, runs), ("all_labels", every, max(runs // 3, 3))):
        walls, cpus, size_b = [], [], 0
        for _ in range(n_runs):
            data, w, c = timed(lambda: ReportBuilder(flt).snapshot(facts, keys, 0.0).SerializeToString())
            walls.append(w)
            cpus.append(c)
            size_b = len(data)
        row[f"snapshot_{label}"] = {
            "bytes": size_b,
            "bytes_per_node": round(size_b / size),
            "runs": n_runs,
            "cold_wall_p50_ms": p50_ms(walls),
            "cold_cpu_p50_ms": p50_ms(cpus),
            "cold_us_per_node": round(statistics.median(cpus) / size * 1e6, 1),
        }
    builder = ReportBuilder(allow)
    builder.snapshot(facts, keys, 0.0)
    walls, cpus = [], []
    for _ in range(runs):
        _, w, c = timed(lambda: builder.snapshot(facts, keys, 0.0).SerializeToString())
        walls.append(w)
        cpus.append(c)
    row["snapshot_allow_list"].update(warm_wall_p50_ms=p50_ms(walls), warm_cpu_p50_ms=p50_ms(cpus))

    deltas = []
    k_pod = 0
    idle, w_idle, c_idle = timed(lambda: builder.delta(inv.snapshot().facts, keys, 0.0))
    assert idle is None
    for window in WINDOWS:
        walls, cpus, facts_s, sizes = [], [], [], []
        for r in range(runs):
            for j in range(window):
                k_pod += 1
                inv.apply("Pod", "ADDED", bound_pod(k_pod, names[(r * window + j) * 7 % size]))
            snap_facts, fw, _ = timed(lambda: inv.snapshot().facts)
            d, w, c = timed(lambda: builder.delta(snap_facts, keys, 0.0))
            assert d is not None and len(d.upserted_nodes) == window, (window, d and len(d.upserted_nodes))
            data, w2, c2 = timed(d.SerializeToString)
            walls.append(w + w2)
            cpus.append(c + c2)
            facts_s.append(fw)
            sizes.append(len(data))
        cpu = statistics.median(cpus)
        deltas.append(
            {
                "window_nodes": window,
                "runs": runs,
                "bytes_p50": int(statistics.median(sizes)),
                "encode_wall_p50_ms": p50_ms(walls),
                "encode_cpu_p50_ms": p50_ms(cpus),
                "facts_rebuild_wall_p50_ms": p50_ms(facts_s),
                "deltas_per_s": round(1 / cpu) if cpu > 0 else None,
                "node_updates_per_s": round(window / cpu) if cpu > 0 else None,
            }
        )
    row["idle_delta_wall_ms"] = round(w_idle * 1000, 3)
    row["deltas"] = deltas
    row["load_1m"] = round(os.getloadavg()[0], 2)
    return row


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Agent: inventory report size and encode cost",
        "",
        f"Python {meta['python']}, protobuf {meta['protobuf']} ({meta['protobuf_impl']}), {meta['cpus']} CPUs (shared).",
        "Load average at start "
        + ", ".join(f"{x:.2f}" for x in meta["load_avg_at_start"])
        + "; at end "
        + ", ".join(f"{x:.2f}" for x in meta["load_avg_at_end"])
        + ". CPU ms is this process's CPU time, which other",
        "load inflates far less than wall clock; p50 over the runs shown. Encode = report built by",
        "`ReportBuilder` + `SerializeToString()`. Nodes: the 12 fixture shapes replicated (1/12 MIG",
        "mixed-strategy, 1/12 DRA with 8 ResourceSlice devices), the fixture's bound pods per copy, one",
        "held reservation per 50 nodes with 2 gang replicas bound.",
        "",
        "## Snapshots",
        "",
        "| nodes | labels/node (reported) | labels | bytes | bytes/node | cold wall p50 ms | cold CPU p50 ms | µs/node | warm wall p50 ms | warm CPU p50 ms |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for label in ("allow_list", "all_labels"):
            s = r[f"snapshot_{label}"]
            warm = f"{s['warm_wall_p50_ms']} | {s['warm_cpu_p50_ms']}" if "warm_wall_p50_ms" in s else "— | —"
            lines.append(
                f"| {r['nodes']} | {r['labels_per_node']} ({r['labels_reported_per_node']}) | "
                f"{label.replace('_', '-')} | {s['bytes']:,} | {s['bytes_per_node']} | {s['cold_wall_p50_ms']} | "
                f"{s['cold_cpu_p50_ms']} | {s['cold_us_per_node']} | {warm} |"
            )
    lines += [
        "",
        "Cold: a new builder encodes every node (agent start, new stream). Warm: a resync on the same",
        "stream; unchanged nodes' bytes are reused and only the message is reassembled.",
        "",
        "## Deltas (K nodes changed in one coalescing window: a pod bound on each)",
        "",
        "| nodes | K | bytes p50 | encode wall p50 ms | encode CPU p50 ms | deltas/s (one core) | node updates/s | facts rebuild wall p50 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for d in r["deltas"]:
            lines.append(
                f"| {r['nodes']} | {d['window_nodes']} | {d['bytes_p50']:,} | {d['encode_wall_p50_ms']} | "
                f"{d['encode_cpu_p50_ms']} | {d['deltas_per_s']} | {d['node_updates_per_s']} | "
                f"{d['facts_rebuild_wall_p50_ms']} |"
            )
    lines += [
        "",
        "Rates are 1 / (encode CPU p50): what one core spends on encoding alone. The facts rebuild",
        "(`Inventory.snapshot()`) is the extender's own work on every inventory change and is shared",
        "with its filter; it is shown apart. A window in which nothing changed costs "
        + ", ".join(f"{r['idle_delta_wall_ms']} ms at {r['nodes']:,} nodes" for r in rows)
        + " (identity checks only).",
        "",
        "Inventory load (List -> Inventory -> first Snapshot), for context: "
        + ", ".join(f"{r['inventory_load_s']} s at {r['nodes']:,} nodes" for r in rows)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs (smoke run)")
    args = ap.parse_args(argv)
    from google.protobuf import __version__ as pb_version
    from google.protobuf.internal import api_implementation

    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "protobuf": pb_version,
        "protobuf_impl": api_implementation.Type(),
        "load_avg_at_start": os.getloadavg(),
    }
    rows = []
    for size in SIZES:
        runs = 5 if args.quick else (15 if size <= 1000 else 9)
        rows.append(measure(size, runs))
        print(json.dumps(rows[-1]), flush=True)
    meta["load_avg_at_end"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "agent.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / "agent.md").write_text(render(meta, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
