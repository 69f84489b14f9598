"""The fleet end to end: time from SubmitJobs to every pod of a gang bound, and to RUNNING.

Two simulated clusters on this machine (each its own local API server with the Job controller,
kube-scheduler stand-in and kubelet stand-in), the real extender and agent of each as separate
processes, and one real broker (in this process: the same servers the tests run). Cluster a has the
most free GPUs but no rack with room for the gang; cluster b has one rack that fits it. Each run
submits one gang that requires a rack, waits until kube-scheduler (the stand-in, calling the real
extender) has bound every pod on exactly its assigned node, marks the pods Running, waits for RUNNING,
completes them and waits for SUCCEEDED and for the agent's clean-up before the next run.

What the figure includes: placement, the Dispatch over gRPC, the agent's fit check, admission dry run
and quota check, creating the reservation, Service and Job, the Job controller creating the pods (at the
controller-manager's default 20 qps / burst 30), pinning each pod, the GATED report, Start, lifting the
gates and kube-scheduler binding every pod through the extender. It excludes image pulls and container
start (the kubelet stand-in is told when pods run).

Run: python -m bench.bench_fleet [--runs N]   -> bench/results/fleet.{md,json}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "protos")]

from broker.launcher.client import SubmitItem  # noqa: E402
from sim import kuberesources as kr  # noqa: E402
from tandem.v1 import job_pb2  # noqa: E402
from tests.broker.hub_builders import policy_doc, start_broker  # noqa: E402
from tests.e2e.fleet import TENANT_NAMESPACE, gang, gpu_node, start_cluster, wait_for  # noqa: E402

RESULTS = REPO / "bench" / "results"
GANGS = (8, 32)
"""Replicas (8 GPUs each) of the gangs measured; cluster b's rack has exactly that many nodes."""


async def _bound(cluster: Any, job_id: str, n: int) -> list[dict[str, Any]] | None:
    pods = (await cluster.sim.client().list(kr.PODS, TENANT_NAMESPACE, label_selector=f"tandem.dev/job={job_id}")).items
    done = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
    return done if len(done) == n else None


async def _state(client: Any, job_id: str, state: int) -> bool:
    return (await client.get(job_id)).status.state == state


async def measure(replicas: int, runs: int, tmp: Path) -> dict[str, Any]:
    broker = await start_broker(tmp, policy=policy_doc(), heartbeat_interval_s=1.0)
    a_nodes = [gpu_node(f"node-a-{r}{i:02d}", rack=f"r{r}") for r in range(1, 4) for i in range(replicas - 2)]
    b_nodes = [gpu_node(f"node-b-{i:04d}", rack="r7") for i in range(replicas)]
    a = await start_cluster("a", a_nodes, broker, tmp)
    b = await start_cluster("b", b_nodes, broker, tmp)
    client = broker.client("alpha")
    bound_s: list[float] = []
    running_s: list[float] = []
    try:
        for run in range(runs):
            t0 = time.monotonic()
            [j] = await client.submit(f"bench-{replicas}-{run}", [SubmitItem(f"k{run}", gang(replicas, 8))])
            pods = await wait_for(lambda: _bound(b, j.job_id, replicas), 120, "all pods bound", a.procs + b.procs)
            bound_s.append(time.monotonic() - t0)
            for p in pods:
                await b.sim.kubelet.start(TENANT_NAMESPACE, p["metadata"]["name"])  # type: ignore[union-attr]
            await wait_for(lambda: _state(client, j.job_id, job_pb2.JOB_STATE_RUNNING), 60, "RUNNING", b.procs)
            running_s.append(time.monotonic() - t0)
            for p in pods:
                await b.sim.kubelet.complete(TENANT_NAMESPACE, p["metadata"]["name"], 0)  # type: ignore[union-attr]
            await wait_for(lambda: _state(client, j.job_id, job_pb2.JOB_STATE_SUCCEEDED), 60, "SUCCEEDED", b.procs)
            await wait_for(lambda: _gone(b, j.job_id), 60, "the attempt cleaned up", b.procs)
    finally:
        await a.stop()
        await b.stop()
        await broker.close()
    return {
        "replicas": replicas,
        "gpus_per_replica": 8,
        "runs": runs,
        "cluster_a_nodes": len(a_nodes),
        "cluster_b_nodes": len(b_nodes),
        "submit_to_all_bound_s": bound_s,
        "submit_to_running_s": running_s,
        "bound_p50_s": statistics.median(bound_s),
        "bound_max_s": max(bound_s),
        "running_p50_s": statistics.median(running_s),
        "running_max_s": max(running_s),
    }


async def _gone(cluster: Any, job_id: str) -> bool:
    pods = (await cluster.sim.client().list(kr.PODS, TENANT_NAMESPACE, label_selector=f"tandem.dev/job={job_id}")).items
    return not pods


def report(results: list[dict[str, Any]], load: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    lines = [
        "# Fleet: time from submission to every pod bound",
        "",
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs (shared). Load average at start "
        f"{', '.join(f'{x:.2f}' for x in load[0])}; at end {', '.join(f'{x:.2f}' for x in load[1])}.",
        "Two simulated clusters (local API server, Job controller at 20 qps / burst 30, kube-scheduler and kubelet",
        "stand-ins), the real extender and agent per cluster as processes, the real broker; see the module docstring",
        "for what the figures include. Wall clock, so other load on the machine inflates them.",
        "",
        "| gang | cluster a / b nodes | runs | submit -> all bound p50 (max) | submit -> RUNNING p50 (max) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['replicas']} x {r['gpus_per_replica']} GPUs, one rack | {r['cluster_a_nodes']} / "
            f"{r['cluster_b_nodes']} | {r['runs']} | {r['bound_p50_s']:.2f} s ({r['bound_max_s']:.2f} s) | "
            f"{r['running_p50_s']:.2f} s ({r['running_max_s']:.2f} s) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    start = os.getloadavg()
    results = []
    for replicas in GANGS:
        with tempfile.TemporaryDirectory(prefix="tandem-bench-fleet-") as d:
            results.append(asyncio.run(measure(replicas, args.runs, Path(d))))
    load = (start, os.getloadavg())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fleet.md").write_text(report(results, load))
    (RESULTS / "fleet.json").write_text(json.dumps({"load": load, "results": results}, indent=2) + "\n")
    print(report(results, load))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
