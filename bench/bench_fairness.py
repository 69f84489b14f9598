"""Fair share and preemption through the real broker: how fast and how close tenants converge to their shares,
and how long the owner of borrowed GPUs waits to get them back.

The broker runs in this process (the same servers the tests run) with one scripted cluster on loopback that runs
what it is sent (`tests.broker.hub_builders.AutoCluster`: it accepts every dispatch, runs each gang for a fixed
time once started, reports its nodes busy and then free, confirms cancels at once).

* convergence: alpha alone fills the 64 GPUs (8 nodes) for `ALONE_S`; then beta and gamma arrive, and the
  three tenants, weighted 1 : 1 : 2, each keep four 8-GPU jobs queued while jobs run `RUN_S` each. GPUs held
  per tenant are sampled every 50 ms against the water-filled fair share (16 / 16 / 32 once all three ask).
  Reported: time from the others' arrival to the first sample with all three tenants within one job (8 GPUs)
  of their share after which at least 80 % of samples stay so; the fraction of samples within one job after that; and the
  split of the GPUs in use over the second half of the run.
* reclaim: a preemptible tenant borrows all 64 GPUs (quota 32) with long jobs; the owner (quota 32) submits a
  4 x 8-GPU gang; measured: owner's submit → its Dispatch, with the victims' grace period set to `GRACE_S`
  (the agent would wait for the pods to leave; the scripted cluster confirms at once, so the figure is the
  broker's own preemption round + hold + placement, plus nothing of the grace).

Run: python -m bench.bench_fairness [--jobs N]   -> bench/results/fairness.{md,json}
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

from broker.config import FairnessConfig  # noqa: E402
from broker.launcher.client import SubmitItem  # noqa: E402
from tests.broker.hub_builders import AutoCluster, node, policy_doc, spec, start_broker  # noqa: E402

RESULTS = REPO / "bench" / "results"
RUN_S = 0.3
ALONE_S = 2.0
GRACE_S = 5.0
FAIR = {"alpha": 16.0, "beta": 16.0, "gamma": 32.0}


async def convergence(tmp: Path, jobs: int) -> dict[str, Any]:
    doc = policy_doc(names=("alpha", "beta", "gamma"), gamma={"weight": 2.0})
    b = await start_broker(tmp, policy=doc, fairness=FairnessConfig(interval_s=0.05, min_runtime_s=0.0))
    nodes = [f"n{i}" for i in range(8)]
    agent = b.agent("c1")
    await agent.connect([node(n) for n in nodes])
    cluster = AutoCluster(agent, nodes, run_s=RUN_S)
    cluster.start()
    clients = {t: b.client(t) for t in FAIR}
    submitted = {t: 0 for t in FAIR}
    samples: list[tuple[float, dict[str, float]]] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        while cluster.finished < jobs:
            alone = loop.time() - t0 < ALONE_S
            for t, c in clients.items():
                if alone and t != "alpha":
                    continue
                queued = sum(1 for j in b.hub.placer.book.queued.values() if j.tenant == t)
                for _ in range(max(0, 4 - queued)):
                    submitted[t] += 1
                    await c.submit("s", [SubmitItem(f"{t}-{submitted[t]}", spec(gpus=8))])
            _, shares = b.hub.placer.book.shares()
            if not alone:
                samples.append((loop.time() - t0 - ALONE_S, {t: shares.usage.get(t, 0.0) for t in FAIR}))
            await asyncio.sleep(0.05)
    finally:
        await cluster.stop()
        await agent.close()
        await b.close()
    within = [all(abs(u[t] - FAIR[t]) <= 8.0 for t in FAIR) for _, u in samples]
    # the first sample within one job of the shares after which at least 80 % of samples stay so
    start = next((i for i in range(len(within)) if within[i] and sum(within[i:]) >= 0.8 * len(within[i:])), None)
    late = samples[len(samples) // 2 :]
    mean = {t: sum(u[t] for _, u in late) / len(late) for t in FAIR}
    held = sum(mean.values()) or 1.0
    return {
        "jobs_finished": cluster.finished,
        "samples": len(samples),
        "run_s_per_job": RUN_S,
        "duration_s": round(samples[-1][0], 2),
        "converged_after_s": round(samples[start][0], 2) if start is not None else None,
        "within_one_job_after_pct": round(100.0 * sum(within[start:]) / len(within[start:]), 1)
        if start is not None
        else None,
        "split_second_half_pct": {t: round(100.0 * mean[t] / held, 1) for t in FAIR},
        "mean_held_second_half_gpus": {t: round(mean[t], 2) for t in FAIR},
    }


async def reclaim(tmp: Path, runs: int) -> dict[str, Any]:
    waits: list[float] = []
    for k in range(runs):
        d = tmp / f"reclaim-{k}"
        d.mkdir()
        doc = policy_doc(alpha={"quotas": {"*": 32}}, beta={"quotas": {"*": 32}})
        b = await start_broker(d, policy=doc, fairness=FairnessConfig(interval_s=0.5), grace_period_s=GRACE_S)
        nodes = [f"n{i}" for i in range(8)]
        agent = b.agent("c1")
        await agent.connect([node(n) for n in nodes])
        cluster = AutoCluster(agent, nodes, run_s=3600.0)
        cluster.start()
        try:
            beta = b.client("beta")
            for i in range(2):
                await beta.submit("s", [SubmitItem(f"b{i}", spec(gpus=8, replicas=4, preemptible=True))])
            while len(cluster.busy) < 8:
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            [own] = await b.client("alpha").submit("s", [SubmitItem("own", spec(gpus=8, replicas=4))])
            while not any(key[0] == own.job_id for key in cluster.placed):
                await asyncio.sleep(0.005)
            waits.append(time.perf_counter() - t0)
        finally:
            await cluster.stop()
            await agent.close()
            await b.close()
    return {
        "runs": runs,
        "interval_s": 0.5,
        "grace_s": GRACE_S,
        "submit_to_dispatch_s": {
            "p50": round(statistics.median(waits), 3),
            "max": round(max(waits), 3),
            "all": [round(w, 3) for w in waits],
        },
    }


def _markdown(res: dict[str, Any]) -> str:
    c, r = res["convergence"], res["reclaim"]
    split = ", ".join(f"{t} {v} %" for t, v in c["split_second_half_pct"].items())
    return "\n".join(
        [
            "# Fair share and preemption through the real broker",
            "",
            f"Machine: {res['machine']}. Written by `python -m bench.bench_fairness`.",
            "",
            "## Convergence: three tenants weighted 1 : 1 : 2 on 64 GPUs",
            "",
            (
                f"alpha alone holds every GPU for {ALONE_S:g} s; then all three keep four 8-GPU jobs queued "
                f"({c['run_s_per_job']} s each); {c['jobs_finished']} jobs, {c['samples']} samples over "
                f"{c['duration_s']} s after the others arrived. Fair share 16 / 16 / 32."
            ),
            "",
            "| figure | value |",
            "|---|---|",
            f"| converged (first sample with all three within one job of their share, ≥ 80 % of samples staying so), "
            f"after the others arrived | "
            f"{c['converged_after_s']} s |",
            f"| samples within one job (8 GPUs) of fair share after that | {c['within_one_job_after_pct']} % |",
            f"| split of the GPUs in use, second half (fair: 25 / 25 / 50 %) | {split} |",
            "",
            "## Reclaim: the owner takes borrowed GPUs back",
            "",
            (
                f"beta (quota 32) borrows all 64 GPUs with two preemptible 4 x 8-GPU gangs; alpha (quota 32) submits a "
                f"4 x 8-GPU gang. Preemption round every {r['interval_s']} s; the scripted cluster confirms the "
                f"victim's deletion at once (a real one waits for the pods' grace, here {r['grace_s']:g} s)."
            ),
            "",
            "| figure | value |",
            "|---|---|",
            f"| owner's submit → its Dispatch, p50 over {r['runs']} runs | {r['submit_to_dispatch_s']['p50']} s |",
            f"| max | {r['submit_to_dispatch_s']['max']} s |",
            "",
        ]
    )


async def main_async(jobs: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tandem-bench-fair-") as tmp:
        conv = await convergence(Path(tmp), jobs)
        rec = await reclaim(Path(tmp), runs)
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "convergence": conv,
        "reclaim": rec,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=400)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    res = asyncio.run(main_async(args.jobs, args.runs))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fairness.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "fairness.md").write_text(_markdown(res))
    print(_markdown(res))


if __name__ == "__main__":
    main()
