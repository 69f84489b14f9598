"""The fleet view at fleet scale: 100 clusters x 1,000 nodes and 10,000 jobs, through the real broker and a
real browser (Debian's headless Chromium, driven by Playwright).

The broker runs in this process (the servers the tests run) with one scripted stream per cluster on
loopback (`tests.broker.hub_builders.ScriptedAgent`). Each cluster: 1,000 8-GPU nodes in racks of 8, two
zones, one GPU model per cluster (four models over the fleet); every node is 0, 4 or 8 GPUs busy outside
Tandem, at random, with at least one busy GPU in each rack. Five tenants submit 10,000 jobs: 80 % are
8 x 8-GPU gangs that need one rack (none fits now: they wait), 20 % single 4-GPU jobs, which the placer
dispatches (the scripted clusters never answer and the acknowledgement timeout is an hour, so they stay
reserved: the picture shows reserved GPUs). The broker keeps placing while it is measured.

Measured, for the admin (who sees everything, so the largest documents):
* server: each API document's time to the last byte (aiohttp client, sequential) and size;
* browser: first render of each page — navigation start to the moment the page shows its data (every
  domain cell of the 100 clusters; the first 100 job rows; a waiting job's 100 per-cluster verdicts; the
  tenants' rows), read from the page's own clock (`performance.now()`), each in a new browser context;
* live update: a queued job on the open jobs page (every state, first page) is cancelled through gRPC;
  time until its row says CANCELLED, without a reload.

Run: python -m bench.bench_fleetview [--clusters N --nodes N --jobs N --runs N]
     -> bench/results/fleetview.{md,json}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "protos")]

import aiohttp  # noqa: E402

from broker.config import WebConfig  # noqa: E402
from broker.launcher.client import SubmitItem  # noqa: E402
from tests.broker.hub_builders import TOKENS, Broker, eventually, node, policy_doc, spec, start_broker  # noqa: E402
from tests.browser.test_fleet_view import CHROMIUM_ARGS  # noqa: E402

RESULTS = REPO / "bench" / "results"
MODELS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H200", "NVIDIA-L40S")
TENANTS = ("alpha", "beta", "gamma", "delta", "epsilon")
RACK = 8


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _summary(xs: list[float], digits: int = 1) -> dict[str, float]:
    return {
        "p50": round(statistics.median(xs), digits),
        "p95": round(_pct(xs, 0.95), digits),
        "max": round(max(xs), digits),
        "n": len(xs),
    }


async def build_fleet(tmp: Path, clusters: int, nodes: int, jobs: int, seed: int) -> tuple[Broker, list[str]]:
    rng = random.Random(seed)
    for name in ("delta", "epsilon"):
        TOKENS.setdefault(name, f"token-{name}")
    broker = await start_broker(
        tmp,
        policy=policy_doc(names=TENANTS),
        web=WebConfig(address="127.0.0.1:0"),
        cluster_stale_after_s=3600.0,
        lost_after_s=7200.0,
        dispatch_ack_timeout_s=3600.0,
    )
    for c in range(clusters):
        model = MODELS[c % len(MODELS)]
        inventory = []
        for rack in range(nodes // RACK):
            busy = [rng.choice((0, 0, 4, 8)) for _ in range(RACK)]
            if not any(busy):
                busy[rng.randrange(RACK)] = 4
            for k, b in enumerate(busy):
                i = rack * RACK + k
                inventory.append(
                    node(
                        f"c{c}-n{i}",
                        model=model,
                        free=8 - b,
                        rack=f"r{rack:03d}",
                        zone=f"z{rack * 2 // (nodes // RACK)}",
                    )
                )
        agent = broker.agent(f"c{c:03d}")
        await agent.connect(inventory, region=("eu", "us", "ap")[c % 3])
    await eventually(lambda: sum(1 for e in broker.hub.catalog.clusters.values() if e.arrays) == clusters, timeout=600)
    ids: list[str] = []
    per_call = 500
    for tenant in TENANTS:
        client = broker.client(tenant)
        share = jobs // len(TENANTS)
        for start in range(0, share, per_call):
            items = []
            for k in range(start, min(start + per_call, share)):
                gang = rng.random() < 0.8
                job = spec(gpus=8, replicas=8, level="rack") if gang else spec(gpus=4)
                items.append(SubmitItem(f"{tenant}-{k}", job))
            done = await client.submit(f"{tenant}-set-{start // per_call}", items)
            bad = [d for d in done if not d.job_id]
            assert not bad, bad[:1]
            ids.extend(d.job_id for d in done)
    return broker, ids


async def loop_lag(seconds: float) -> dict[str, float]:
    """How late the broker's event loop wakes a 5 ms sleep: what every request waits for besides its own work."""
    lags = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await asyncio.sleep(0.005)
        lags.append((time.perf_counter() - t0 - 0.005) * 1000)
    return _summary(lags)


async def server_documents(broker: Broker, runs: int, waiting: str) -> dict[str, Any]:
    base = f"http://127.0.0.1:{broker.servers.web_port}"
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(f"{base}/api/login", json={"token": TOKENS["admin"]}) as r:
            assert r.status == 200
        for name, path in (
            ("fleet", "/api/fleet"),
            ("queues", "/api/queues"),
            ("jobs page (100)", "/api/jobs?page_size=100"),
            ("waiting job (full view)", f"/api/jobs/{waiting}"),
        ):
            times, size = [], 0
            for _ in range(runs):
                t0 = time.perf_counter()
                async with http.get(base + path) as r:
                    body = await r.read()
                    assert r.status == 200, body[:200]
                times.append((time.perf_counter() - t0) * 1000)
                size = len(body)
            out[name] = {"ms": _summary(times), "bytes": size}
    return out


async def _logged_in(context: Any, base: str) -> Any:
    """A tab logged in as the admin through the login form (the cookie is HttpOnly: only a login sets it)."""
    page = await context.new_page()
    await page.goto(f"{base}/#/login")
    await page.fill("#login-token", TOKENS["admin"])
    await page.click("#login-submit")
    await page.wait_for_selector('[data-testid="whoami"]:has-text("admin")')
    return page


async def browser_pages(
    broker: Broker, runs: int, clusters: int, waiting: str, cancellable: list[str], chromium: str
) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    base = f"http://127.0.0.1:{broker.servers.web_port}"
    web = broker.servers.web
    assert web is not None
    domains = 0
    for entry in broker.hub.catalog.clusters.values():
        occ = web.picture.occupancy(entry)
        domains += len(occ.domains) if occ is not None else 0
    pages = {
        "fleet": ("#/fleet", f"document.querySelectorAll('[data-testid=\"domain\"]').length >= {domains}"),
        "jobs": ("#/jobs", "document.querySelectorAll('[data-testid^=\"job-row-\"]').length >= 100"),
        "waiting job": (
            f"#/jobs/{waiting}",
            f"document.querySelectorAll('[data-testid^=\"verdict-\"]').length >= {clusters + 0}",
        ),
        "queues": ("#/queues", f"document.querySelectorAll('[data-testid^=\"tenant-\"]').length >= {len(TENANTS)}"),
    }
    out: dict[str, Any] = {"first_render_ms": {}, "domain_cells": domains}
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        for name, (route, ready) in pages.items():
            times = []
            for _ in range(runs):
                context = await browser.new_context(viewport={"width": 1600, "height": 1000})
                page = await _logged_in(context, base)
                await page.goto("about:blank")  # a new document: its clock starts at this navigation
                await page.goto(f"{base}/{route}")
                try:
                    handle = await page.wait_for_function(
                        f"() => ({ready}) ? performance.now() : false", timeout=120_000
                    )
                except Exception:
                    await page.screenshot(path=f"/tmp/fv-timeout-{name}.png", full_page=True)
                    raise RuntimeError(f"page {name} never showed its data ({ready})") from None
                times.append(float(await handle.json_value()))
                await context.close()
            out["first_render_ms"][name] = _summary(times)
        # live: cancel queued jobs shown on the open jobs page
        context = await browser.new_context(viewport={"width": 1600, "height": 1000})
        page = await _logged_in(context, base)
        await page.goto(f"{base}/#/jobs")  # every state: a cancelled job stays on the page (a QUEUED filter drops it)
        await page.wait_for_selector('[data-testid="live"]:text-is("live")', timeout=60_000)
        admin = broker.client("admin")
        latencies = []
        for job_id in cancellable[:runs]:
            row = f'[data-testid="job-row-{job_id}"] [data-testid="job-state"]'
            await page.wait_for_selector(row, timeout=60_000)
            t0 = time.perf_counter()
            await admin.cancel(job_id, "bench")
            await page.wait_for_selector(f'{row}:text-is("CANCELLED")', timeout=60_000)
            latencies.append((time.perf_counter() - t0) * 1000)
        out["live_update_ms"] = _summary(latencies)
        await browser.close()
    return out


def _markdown(res: dict[str, Any]) -> str:
    s = res["setup"]
    lines = [
        "# Fleet view at fleet scale",
        "",
        f"Machine: {res['machine']}. Chromium {res['chromium']}. Generated by `python -m bench.bench_fleetview`.",
        "",
        (
            f"{s['clusters']} clusters x {s['nodes']} nodes ({s['clusters'] * s['nodes']:,} nodes, "
            f"{res['browser']['domain_cells']:,} rack cells), {s['jobs']:,} jobs from {len(TENANTS)} tenants "
            f"({s['queued']:,} queued, {s['reserved']:,} dispatched and reserved when measured). "
            f"Setup took {s['setup_s']} s. The broker keeps placing while it is measured; the admin's view "
            f"(everything) is measured."
        ),
        "",
        (
            f"The broker's event loop, busy placing, wakes a 5 ms sleep late by p50 {res['loop_lag_ms']['p50']} ms, "
            f"p95 {res['loop_lag_ms']['p95']} ms, max {res['loop_lag_ms']['max']} ms (10 s sampled before the "
            f"measurements): every request below waits for that too."
        ),
        "",
        "## API documents (time to the last byte, sequential requests)",
        "",
        "| document | p50 | p95 | max | size |",
        "|---|---|---|---|---|",
    ]
    for name, d in res["server"].items():
        ms = d["ms"]
        lines.append(f"| {name} | {ms['p50']} ms | {ms['p95']} ms | {ms['max']} ms | {d['bytes'] / 1024:.0f} KiB |")
    lines += [
        "",
        "## Browser: first render (navigation start → the page shows its data)",
        "",
        "| page | shows | p50 | p95 | max | runs |",
        "|---|---|---|---|---|---|",
    ]
    shows = {
        "fleet": f"all {res['browser']['domain_cells']:,} domain cells of {s['clusters']} clusters",
        "jobs": "the first 100 job rows",
        "waiting job": f"its {s['clusters']} per-cluster verdicts",
        "queues": f"the {len(TENANTS)} tenants' rows",
    }
    for name, d in res["browser"]["first_render_ms"].items():
        lines.append(
            f"| {name} | {shows[name]} | {d['p50']:.0f} ms | {d['p95']:.0f} ms | {d['max']:.0f} ms | {d['n']} |"
        )
    lv = res["browser"]["live_update_ms"]
    lines += [
        "",
        "## Live update",
        "",
        f"A queued job on the open jobs page is cancelled through gRPC: its row says CANCELLED "
        f"p50 {lv['p50']:.0f} ms, p95 {lv['p95']:.0f} ms, max {lv['max']:.0f} ms after the call "
        f"returned ({lv['n']} jobs; no reload).",
        "",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    chromium = os.environ.get("TANDEM_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        raise SystemExit("the fleet view benchmark needs Chromium (Debian package chromium)")
    with tempfile.TemporaryDirectory(prefix="tandem-bench-fleetview-") as tmp:
        t0 = time.perf_counter()
        broker, ids = await build_fleet(Path(tmp), args.clusters, args.nodes, args.jobs, args.seed)
        try:
            setup_s = time.perf_counter() - t0
            await asyncio.sleep(2.0)  # let the placer's first passes over the queue settle
            queued = [j for j, e in broker.hub.placer.book.snapshot().entries.items() if e.state.value == "QUEUED"]
            entries = broker.hub.placer.book.snapshot().entries
            waiting = next(j for j in ids if j in set(queued) and entries[j].gpus == 64)
            # queued gangs among the first page's jobs (the list is in submission order)
            cancellable = [j for j in ids[:100] if j in set(queued) and j != waiting][: args.runs]
            lag = await loop_lag(10.0)
            server = await server_documents(broker, args.runs * 2, waiting)
            browser = await browser_pages(broker, args.runs, args.clusters, waiting, cancellable, chromium)
            reserved = sum(broker.hub.catalog.reservation_count(c) for c in broker.hub.catalog.clusters)
            from playwright.async_api import async_playwright

            async with async_playwright() as pw:
                b = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
                version = b.version
                await b.close()
        finally:
            await broker.close()
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "chromium": version,
        "setup": {
            "clusters": args.clusters,
            "nodes": args.nodes,
            "jobs": args.jobs,
            "queued": len(queued),
            "reserved": reserved,
            "setup_s": round(setup_s, 1),
        },
        "loop_lag_ms": lag,
        "server": server,
        "browser": browser,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    res = asyncio.run(main_async(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fleetview.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "fleetview.md").write_text(_markdown(res))
    print(_markdown(res))


if __name__ == "__main__":
    main()
