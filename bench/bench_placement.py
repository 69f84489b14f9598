"""Placement core speed: per-node fit, gang fit and the reservations overlay on a synthetic 5,000-node cluster.

The cluster: HGX-style nodes (8 x H100, a varying number already in use), 32 nodes a rack,
16 racks a block; every 10th node an A100 in MIG mode with detailed instances; every 25th an
H200 node published through DRA (8 devices, 2 allocated).

Run: python -m bench.bench_placement [--quick]   -> bench/results/placement.{md,json}
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from placement.dra import DraEvaluator
from placement.fit import capacity
from placement.model import DraDevice, DraRequest, Gpu, JobRequest, MigInstance, Node, PodSet, PodShape
from placement.overlay import ReportedNodes, Reservation, ReservedPart, effective_nodes
from placement.topology import GangPlacement, fit_gang
from tests.placement.builders import GIB, GPU_TAINT, GPU_TOLERATION, LEVELS

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOL = (GPU_TOLERATION,)


def make_node(i: int) -> Node:
    labels = {
        "topology.kubernetes.io/zone": "z1",
        "network.example.com/block": f"b{i // 512}",
        "network.example.com/rack": f"r{i // 32}",
        "kubernetes.io/hostname": f"n{i}",
    }
    gpus: tuple[Gpu, ...] = ()
    dra: tuple[DraDevice, ...] = ()
    if i % 25 == 0:
        dra = tuple(
            DraDevice(
                "gpu.nvidia.com",
                f"n{i}",
                f"gpu-{k}",
                {"type": "gpu", "uuid": f"U{i}-{k}", "productName": "NVIDIA H200"},
                {"memory": 141 * GIB},
                k < 2,
            )
            for k in range(8)
        )
    elif i % 10 == 0:
        gpus = tuple(
            Gpu(
                k,
                "NVIDIA-A100-SXM4-80GB",
                81920,
                mig=(
                    MigInstance("3g.40gb", 9, 0, 4, k % 2 == 0),
                    MigInstance("2g.20gb", 14, 4, 2),
                    MigInstance("1g.10gb", 19, 6, 1),
                ),
            )
            for k in range(4)
        )
    else:
        used = i % 9
        gpus = tuple(
            Gpu(k, "NVIDIA-H100-80GB-HBM3", 81559, 1000 if k < used else (250 if k == used == 4 else 0))
            for k in range(8)
        )
    labels["nvidia.com/gpu.product"] = gpus[0].model if gpus else "none"
    return Node(
        name=f"n{i}",
        labels=labels,
        taints=(GPU_TAINT,),
        cpu_milli_allocatable=192_000,
        cpu_milli_free=192_000 - (i % 9) * 8000,
        memory_allocatable=2048 * GIB,
        memory_free=(2048 - (i % 9) * 64) * GIB,
        pods_free=100,
        gpus=gpus,
        dra_devices=dra,
        topology=LEVELS.path(labels),
    )


SHAPES = {
    "whole 4 x H100": PodShape(
        gpus=4, gpu_models=frozenset({"NVIDIA-H100-80GB-HBM3"}), cpu_milli=8000, memory=64 * GIB, tolerations=TOL
    ),
    "share 250/1000": PodShape(gpus=1, gpu_milli=250, cpu_milli=1000, memory=8 * GIB, tolerations=TOL),
    "MIG 1 x 2g.20gb": PodShape(mig_profile="2g.20gb", mig_count=1, cpu_milli=1000, tolerations=TOL),
    "DRA 4 x H200 (CEL)": PodShape(
        dra=(DraRequest("gpu.nvidia.com", ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'",), 4),),
        cpu_milli=1000,
        tolerations=TOL,
    ),
}


def timed(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return {"min_ms": min(samples) * 1e3, "p50_ms": statistics.median(samples) * 1e3, "max_ms": max(samples) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args()
    repeat = 3 if args.quick else 9
    n_nodes = 5000
    nodes = [make_node(i) for i in range(n_nodes)]
    rows: list[dict[str, Any]] = []

    ev = DraEvaluator()
    for name, shape in SHAPES.items():
        fits = sum(1 for n in nodes if capacity(n, shape, dra=ev).count > 0)  # also warms the CEL caches
        t = timed(lambda: [capacity(n, shape, dra=ev) for n in nodes], repeat)
        rows.append(
            {
                "case": f"capacity() x {n_nodes} nodes: {name}",
                "nodes_fitting": fits,
                **t,
                "us_per_node": t["p50_ms"] * 1e3 / n_nodes,
            }
        )

    worker8 = PodShape(gpus=8, cpu_milli=8000, memory=64 * GIB, tolerations=TOL)
    worker4 = PodShape(gpus=4, cpu_milli=8000, memory=64 * GIB, tolerations=TOL)
    head = PodShape(cpu_milli=4000, memory=16 * GIB, tolerations=TOL)
    jobs = {
        "8 x 8 GPUs, required rack": JobRequest(
            "g1", (PodSet("w", 8, worker8),), required_level="network.example.com/rack"
        ),
        "head + 40 x 4 GPUs, required block, preferred rack": JobRequest(
            "g2",
            (PodSet("head", 1, head), PodSet("w", 40, worker4)),
            required_level="network.example.com/block",
            preferred_level="network.example.com/rack",
        ),
        "64 x 8 GPUs, required rack (refused)": JobRequest(
            "g3", (PodSet("w", 64, worker8),), required_level="network.example.com/rack"
        ),
        "64 x 8 GPUs elastic >= 4, required rack": JobRequest(
            "g4", (PodSet("w", 64, worker8),), required_level="network.example.com/rack", min_available=4
        ),
    }
    for name, job in jobs.items():
        result = fit_gang(nodes, job, LEVELS)
        outcome = f"placed {result.total}" if isinstance(result, GangPlacement) else f"refused: {result.detail}"
        t = timed(lambda: fit_gang(nodes, job, LEVELS), max(3, repeat // 3))
        rows.append({"case": f"fit_gang() over {n_nodes} nodes: {name}", "outcome": outcome, **t})

    report = ReportedNodes("c1", 1, tuple(nodes))
    small = PodShape(gpus=1, cpu_milli=1000, tolerations=TOL)
    reservations = [Reservation(f"j{k}", 1, (ReservedPart("w", f"n{k * 7 + 1}", 1, small),)) for k in range(200)]
    t = timed(lambda: effective_nodes(report, reservations), repeat)
    rows.append({"case": f"effective_nodes(): {n_nodes} nodes, 200 reservations", **t})

    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "placement.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        "# Placement core benchmark",
        "",
        f"Python {meta['python']} on {meta['machine']}; synthetic cluster of {n_nodes} nodes (see bench/bench_placement.py).",
        "Times are wall-clock per call over all nodes (min / p50 / max of the repeats).",
        "",
        "| case | min ms | p50 ms | max ms | notes |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        note = r.get("outcome") or (
            f"{r['nodes_fitting']} nodes fit; {r['us_per_node']:.2f} us/node" if "us_per_node" in r else ""
        )
        lines.append(f"| {r['case']} | {r['min_ms']:.1f} | {r['p50_ms']:.1f} | {r['max_ms']:.1f} | {note} |")
    (RESULTS / "placement.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
