"""Extender hot path: latency of sequential filter + prioritize pairs over real HTTP on loopback.

kube-scheduler calls the extender's verbs one after another in each scheduling cycle, so the
pair latency bounds its throughput. The server runs in a separate process (`tandem-extender serve
--inventory-file`) on a cluster synthesised by replicating the fixture cluster's node shapes
(distinct names, racks and blocks, the same bound pods, ResourceSlices and claims per copy).

Scenarios, at 500 and 5,000 candidate nodes:
* names / nodelist: nodeCacheCapable true (NodeNames) / false (full NodeList) bodies;
* cached: the same pod shape every time (replicas of one job; verdicts cached per shape);
* uncached: a new shape each request (CPU request varies), so every node is checked anew.
The pod is the fixture's want-4-h100; filter gets every candidate, prioritize the ones that passed.

Run: python -m bench.bench_extender [--quick]   -> bench/results/extender.{md,json}
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import http.client
import itertools
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]  # the bench also runs as a plain script

from fleetsim.processes import free_port, http_ok, spawn, wait_for  # noqa: E402

RESULTS = REPO / "bench" / "results"
FIXTURES = REPO / "tests" / "fixtures"
"""The tests' real-format fixtures (a path, not an import: the bench also runs as a plain script)."""


PREFILTERED = ("h100-r1-n2", "h100-r2-n1", "h100-r2-n2")
"""The fixture nodes kube-scheduler itself passes for want-4-h100 (NodeResourcesFit + node selector)."""


def synth_cluster(n_nodes: int, only: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A List with n_nodes nodes (fixture node shapes replicated, or only those named) and the
    Node objects in order."""
    items = json.loads((FIXTURES / "cluster.json").read_text())["items"]
    nodes = [o for o in items if o["kind"] == "Node" and (not only or o["metadata"]["name"] in only)]
    others = [o for o in items if o["kind"] != "Node"]
    out: list[dict[str, Any]] = []
    node_objs: list[dict[str, Any]] = []
    copies = -(-n_nodes // len(nodes))
    for c in range(copies):
        rename = {n["metadata"]["name"]: f"{n['metadata']['name']}-c{c}" for n in nodes}
        for n in nodes:
            if len(node_objs) >= n_nodes:
                break
            m = copy.deepcopy(n)
            name = rename[n["metadata"]["name"]]
            labels = m["metadata"]["labels"]
            m["metadata"]["name"] = name
            m["metadata"]["uid"] = f"{m['metadata']['uid'][:-6]}{c:06d}"
            labels["kubernetes.io/hostname"] = name
            labels["network.example.com/rack"] = f"{labels.get('network.example.com/rack', 'r0')}-c{c}"
            labels["network.example.com/block"] = f"b{c // 8}"
            out.append(m)
            node_objs.append(m)
        for o in others:
            if o["kind"] == "ResourceClaim" and "allocation" not in (o.get("status") or {}):
                if c == 0:
                    out.append(copy.deepcopy(o))
                continue
            m = copy.deepcopy(o)
            m["metadata"]["name"] = f"{m['metadata']['name']}-c{c}"
            if "uid" in m["metadata"]:
                m["metadata"]["uid"] = f"{m['metadata']['uid'][:-6]}{c:06d}"
            spec = m.get("spec") or {}
            if o["kind"] == "Pod":
                if spec.get("nodeName") not in rename:
                    continue
                spec["nodeName"] = rename[spec["nodeName"]]
                for rc in spec.get("resourceClaims") or []:
                    if rc.get("resourceClaimName"):
                        rc["resourceClaimName"] = f"{rc['resourceClaimName']}-c{c}"
            elif o["kind"] == "ResourceSlice":
                if spec.get("nodeName") not in rename:
                    continue
                spec["nodeName"] = rename[spec["nodeName"]]
                spec["pool"]["name"] = rename[spec["pool"]["name"]]
            elif o["kind"] == "ResourceClaim":
                alloc = m["status"]["allocation"]
                for r in alloc["devices"]["results"]:
                    r["pool"] = rename.get(r["pool"], r["pool"])
                for t in alloc.get("nodeSelector", {}).get("nodeSelectorTerms", []):
                    for f in t.get("matchFields", []):
                        f["values"] = [rename.get(v, v) for v in f["values"]]
                for r in m["status"].get("reservedFor", []):
                    r["name"] = f"{r['name']}-c{c}"
                    r["uid"] = f"{r['uid'][:-6]}{c:06d}"
            out.append(m)
    return {"apiVersion": "v1", "kind": "List", "items": out}, node_objs


def go_json(obj: Any) -> bytes:
    """JSON as kube-scheduler's Go encoder writes it: compact, no spaces."""
    return json.dumps(obj, separators=(",", ":")).encode()


def start_server(inventory_file: Path, port: int) -> subprocess.Popen[bytes]:
    """`tandem-extender serve` on the inventory file, once it answers /readyz; its log lands beside the file."""
    address = f"127.0.0.1:{port}"
    serve = ["serve", "--inventory-file", str(inventory_file), "--listen", address, "--log-level", "WARNING"]
    proc = spawn("extender", serve, inventory_file.with_suffix(".log"))
    try:
        asyncio.run(wait_for(lambda: http_ok(f"http://{address}/readyz"), 120, "the extender ready", [proc]))
    except BaseException:
        proc.popen.kill()
        raise
    return proc.popen


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}")
    return data


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), so per-pair server CPU can be reported even when
    the machine is shared and wall-clock latency is inflated by other load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_pairs(
    port: int,
    pod: dict[str, Any],
    nodes: list[dict[str, Any]],
    mode: str,
    cached: bool,
    pairs: int,
    warmup: int,
    server_pid: int,
) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle / delayed-ACK stalls
    names = [n["metadata"]["name"] for n in nodes]
    rng = random.Random(7)
    by_name = {n["metadata"]["name"]: n for n in nodes}
    lat: list[float] = []
    f_lat: list[float] = []
    passed = 0
    for k in range(warmup + pairs):
        p = pod
        if not cached:  # a new pod and shape every request: no verdict can be reused
            p = copy.deepcopy(pod)
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{8000 + k}m"
            p["metadata"]["uid"] = f"bench-{k}"
        rng.shuffle(names)  # kube-scheduler's candidate order changes from cycle to cycle
        if mode == "names":
            fbody = go_json({"Pod": p, "Nodes": None, "NodeNames": names})
        else:
            items = [by_name[x] for x in names]
            fbody = go_json({"Pod": p, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})
        t0 = time.perf_counter()
        fraw = post(conn, "/filter", fbody)
        t1 = time.perf_counter()
        fres = json.loads(fraw)
        if mode == "names":
            ok = fres["NodeNames"]
            pbody = go_json({"Pod": p, "Nodes": None, "NodeNames": ok})
        else:
            ok = [n["metadata"]["name"] for n in fres["Nodes"]["items"]]
            pbody = go_json({"Pod": p, "Nodes": {"metadata": {}, "items": [by_name[x] for x in ok]}, "NodeNames": None})
        t2 = time.perf_counter()
        praw = post(conn, "/prioritize", pbody)
        t3 = time.perf_counter()
        pres = json.loads(praw)
        assert len(pres) == len(ok)
        if k == warmup - 1:
            cpu0 = cpu_seconds(server_pid)
        if k >= warmup:
            lat.append((t1 - t0) + (t3 - t2))  # body encoding on the client side is not counted
            f_lat.append(t1 - t0)
            passed = len(ok)
    cpu = cpu_seconds(server_pid) - cpu0
    conn.close()
    lat.sort()
    f_lat.sort()

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

    total = sum(lat)
    return {
        "mode": mode,
        "cached": cached,
        "candidates": len(names),
        "passed": passed,
        "pairs": len(lat),
        "pair_p50_ms": round(pct(lat, 0.50), 3),
        "pair_p99_ms": round(pct(lat, 0.99), 3),
        "pair_mean_ms": round(statistics.fmean(lat) * 1000, 3),
        "filter_p50_ms": round(pct(f_lat, 0.50), 3),
        "pairs_per_s": round(len(lat) / total, 1),
        "server_cpu_ms_per_pair": round(cpu / len(lat) * 1000, 3),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def pairs_in_process(size: int, only: tuple[str, ...], pod: dict[str, Any], rounds: int) -> dict[str, Any]:
    """The decision work alone (parse + decide + encode, no HTTP, no event loop) for names mode."""
    from extender.config import ExtenderConfig
    from extender.decide import decide_filter, decide_prioritize
    from extender.inventory import Inventory
    from extender.protocol import parse_extender_args

    cluster, nodes = synth_cluster(size, only)
    inv = Inventory(ExtenderConfig())
    inv.load_list(cluster)
    names = [n["metadata"]["name"] for n in nodes]
    rng = random.Random(5)
    lat: list[float] = []
    for k in range(rounds + 10):
        rng.shuffle(names)
        fbody = go_json({"Pod": pod, "Nodes": None, "NodeNames": names})
        t0 = time.perf_counter()
        fres = decide_filter(inv, parse_extender_args(fbody)).body
        t1 = time.perf_counter()
        ok = json.loads(fres)["NodeNames"]
        pbody = go_json({"Pod": pod, "Nodes": None, "NodeNames": ok})
        t2 = time.perf_counter()
        decide_prioritize(inv, parse_extender_args(pbody))
        t3 = time.perf_counter()
        if k >= 10:
            lat.append((t1 - t0) + (t3 - t2))
    lat.sort()
    return {
        "nodes": size,
        "cluster": "prefiltered" if only else "mixed",
        "rounds": rounds,
        "pair_p50_ms": round(lat[len(lat) // 2] * 1000, 3),
        "pair_p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
    }


def churn_in_process(size: int, pod: dict[str, Any], rounds: int) -> dict[str, Any]:
    """In-process (no HTTP): a pod binds before every pair, so each pair sees a new inventory
    version, as in a busy cluster; shows what carrying verdicts over between versions costs."""
    from extender.config import ExtenderConfig
    from extender.decide import decide_filter, decide_prioritize
    from extender.inventory import Inventory
    from extender.protocol import parse_extender_args

    cluster, nodes = synth_cluster(size)
    inv = Inventory(ExtenderConfig())
    inv.load_list(cluster)
    t0 = time.perf_counter()
    inv.snapshot()
    build_s = time.perf_counter() - t0
    names = [n["metadata"]["name"] for n in nodes]
    rng = random.Random(3)
    template = json.loads((FIXTURES / "args-want-8-names.json").read_text())["Pod"]
    lat: list[float] = []
    for k in range(rounds + 5):
        bound = copy.deepcopy(template)
        bound["metadata"].update(name=f"churn-{k}", uid=f"churn-{k}")
        bound["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
        bound["spec"]["nodeName"] = rng.choice(names)
        bound["status"] = {"phase": "Running"}
        rng.shuffle(names)
        fbody = go_json({"Pod": pod, "Nodes": None, "NodeNames": names})
        t1 = time.perf_counter()
        inv.apply("Pod", "ADDED", bound)
        fres = decide_filter(inv, parse_extender_args(fbody)).body
        t2 = time.perf_counter()
        pbody = go_json({"Pod": pod, "Nodes": None, "NodeNames": json.loads(fres)["NodeNames"]})
        t3 = time.perf_counter()
        decide_prioritize(inv, parse_extender_args(pbody))
        t4 = time.perf_counter()
        if k >= 5:  # the client's decoding and encoding between the two calls is not counted
            lat.append((t2 - t1) + (t4 - t3))
    lat.sort()
    return {
        "nodes": size,
        "rounds": rounds,
        "snapshot_build_ms": round(build_s * 1000, 1),
        "pair_after_bind_p50_ms": round(lat[len(lat) // 2] * 1000, 3),
        "pair_after_bind_p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer pairs (smoke run)")
    args = ap.parse_args(argv)
    pod = json.loads((FIXTURES / "args-want-4-h100-names.json").read_text())["Pod"]
    rows: list[dict[str, Any]] = []
    plans = (
        ("mixed", (), (("names", True), ("names", False), ("nodelist", True))),
        ("prefiltered", PREFILTERED, (("names", True), ("nodelist", True))),
    )
    for size, (cluster_kind, only, scenarios) in itertools.product((500, 5000), plans):
        cluster, nodes = synth_cluster(size, only)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cluster.json"
            path.write_text(json.dumps(cluster))
            port = free_port()
            proc = start_server(path, port)
            try:
                for mode, cached in scenarios:
                    n = 1000 if size == 500 else 500
                    if mode == "nodelist":
                        n = 200 if size == 500 else 30
                    if not cached:
                        n = n // 2
                    if args.quick:
                        n = max(n // 10, 5)
                    rows.append(
                        {
                            "nodes": size,
                            "cluster": cluster_kind,
                            **run_pairs(port, pod, nodes, mode, cached, n, warmup=max(n // 10, 3), server_pid=proc.pid),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    decide_only = [pairs_in_process(5000, only, pod, 30 if args.quick else 300) for only in ((), PREFILTERED)]
    for d in decide_only:
        print(json.dumps(d), flush=True)
    churn = [churn_in_process(size, pod, 20 if args.quick else 100) for size in (500, 5000)]
    for c in churn:
        print(json.dumps(c), flush=True)
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "pod": "want-4-h100 (4 x H100, nodeSelector on gpu.product)",
        "note": "latency = filter + prioritize round trips measured by a sequential http.client on loopback;"
        " request encoding and reply decoding on the client side are excluded; candidate order is"
        " shuffled per request",
        "load_avg_at_end": os.getloadavg(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "extender.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "decide_in_process": decide_only, "churn_in_process": churn}, indent=1)
        + "\n"
    )
    lines = [
        "# Extender: sequential filter + prioritize pairs over HTTP (loopback, server in its own process)",
        "",
        f"Python {meta['python']}, {meta['cpus']} CPUs. Pod: {meta['pod']}. Filter gets every candidate,",
        "prioritize the ones that passed. `mixed`: the 12 fixture node shapes replicated and every node",
        "sent (what the extender sees with ignoredByScheduler: true; ~1/4 fit, the rest come back with",
        "reasons). `prefiltered`: only the node shapes kube-scheduler's own filters pass for this pod",
        "(names mode as it really runs with ignoredByScheduler: false; every candidate fits).",
        "`cached` = same pod shape each time (verdicts reused within the inventory version);",
        "`uncached` = a new pod shape per request (every candidate re-checked by the core's fit).",
        "Goal: pair p99 <= 5 ms at 5,000 nodes in names mode. `server CPU ms/pair` is the extender",
        "process's CPU time per pair (from /proc), which other load on a shared machine inflates far less",
        f"than wall-clock latency; load average at the end of the run: {meta['load_avg_at_end']}.",
        "",
        "| nodes | cluster | mode | shape | passed | pair p50 ms | pair p99 ms | filter p50 ms | pairs/s | server CPU ms/pair | load 1m |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']} | {r['cluster']} | {r['mode']} | {'cached' if r['cached'] else 'uncached'} | {r['passed']} | "
            f"{r['pair_p50_ms']} | {r['pair_p99_ms']} | {r['filter_p50_ms']} | {r['pairs_per_s']} | "
            f"{r['server_cpu_ms_per_pair']} | {r['load_1m']} |"
        )
    lines += [
        "",
        "In process, no HTTP and no event loop: the decision work alone (parse, decide, encode) of a",
        "names-mode pair at 5,000 candidates, same pod shape:",
        "",
        "| nodes | cluster | pair p50 ms | pair p99 ms |",
        "|---:|---|---:|---:|",
    ]
    for d in decide_only:
        lines.append(f"| {d['nodes']} | {d['cluster']} | {d['pair_p50_ms']} | {d['pair_p99_ms']} |")
    lines += [
        "",
        "In process, no HTTP: one pod binds before every pair (a new inventory version each time,",
        "as in a busy cluster); the bind's event handling and the snapshot update are included, the",
        "client's decoding of the filter reply and encoding of the prioritize body are not.",
        "",
        "| nodes | first snapshot build ms | pair after a bind p50 ms | p99 ms |",
        "|---:|---:|---:|---:|",
    ]
    for c in churn:
        lines.append(
            f"| {c['nodes']} | {c['snapshot_build_ms']} | {c['pair_after_bind_p50_ms']} | "
            f"{c['pair_after_bind_p99_ms']} |"
        )
    (RESULTS / "extender.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
