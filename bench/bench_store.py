"""Durable submissions/s into the file-backed store (WAL, synchronous=FULL): group commit vs one transaction each.

Run: ``python -m bench.bench_store`` (``--quick`` for a smoke run). Writes
bench/results/store.md and bench/results/store.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from broker.store.base import StoreOptions
from broker.store.sqlite import SqliteStore
from tests.broker.store_builders import throwaway_pg_server
from tests.broker.store_hammer import job_for_key, key_for

RESULTS = Path(__file__).resolve().parent / "results"


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def _one(path: str, submitters: int, total: int, max_batch: int) -> dict[str, object]:
    opts = StoreOptions(max_batch=max_batch)
    store: Any
    if path.startswith("postgresql://"):
        from broker.store.postgres import PostgresStore

        store = PostgresStore(path, options=opts)
    else:
        store = SqliteStore(path, options=opts)
    await store.open()
    per = max(1, total // submitters)
    lat: list[float] = []

    async def submitter(w: int) -> None:
        for i in range(per):
            t = time.perf_counter()
            await store.submit(job_for_key(key_for(w, i)))
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(submitter(w) for w in range(submitters)))
    elapsed = time.perf_counter() - t0
    stats = store.committer.stats if isinstance(store, SqliteStore) else store.stats
    await store.close()
    sizes = [s for s, n in stats.sizes.items() for _ in range(n)]
    n = per * submitters
    return {
        "mode": "group commit" if max_batch > 1 else "one txn per submission",
        "max_batch": max_batch,
        "submitters": submitters,
        "submissions": n,
        "seconds": round(elapsed, 3),
        "per_s": round(n / elapsed, 1),
        "transactions": stats.batches,
        "batch_mean": round(statistics.mean(sizes), 2),
        "batch_p50": _pct([float(s) for s in sizes], 50),
        "batch_p90": _pct([float(s) for s in sizes], 90),
        "batch_max": max(sizes),
        "ack_p50_ms": round(_pct(lat, 50) * 1000, 2),
        "ack_p99_ms": round(_pct(lat, 99) * 1000, 2),
    }


@contextmanager
def _postgres() -> Iterator[str | None]:
    """A throwaway PostgreSQL server with durable settings (fsync, synchronous_commit on); None if unavailable."""
    with throwaway_pg_server("fsync=on", "synchronous_commit=on", port=56000 + os.getpid() % 4000) as server:
        yield None if server is None else server.replace("/?", "/postgres?")


async def _pg_reset(dsn: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()
    return dsn


def _median(results: list[dict[str, object]]) -> dict[str, object]:
    """The run with the median rate, annotated with the min and max rate of all runs."""
    ordered = sorted(results, key=lambda r: float(r["per_s"]))  # type: ignore[arg-type]
    mid = dict(ordered[len(ordered) // 2])
    mid["per_s_min"], mid["per_s_max"], mid["runs"] = ordered[0]["per_s"], ordered[-1]["per_s"], len(ordered)
    return mid


def _raw_baseline(path: str, n: int) -> dict[str, object]:
    """Plain sqlite3, one INSERT per transaction, same pragmas: the floor the store is compared with."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT UNIQUE, body BLOB)")
    t0 = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (k, body) VALUES (?, ?)", (f"k{i}", b"x" * 200))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return {
        "mode": "raw sqlite3, 1 insert/txn",
        "submissions": n,
        "seconds": round(elapsed, 3),
        "per_s": round(n / elapsed, 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--total", type=int, default=4000, help="submissions per group-commit run")
    p.add_argument("--submitters", default="1,8,64,256")
    p.add_argument("--dir", default=None, help="directory for the database files (same disk as production!)")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration; the median run is reported")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    total = 600 if a.quick else a.total
    counts = [int(x) for x in a.submitters.split(",")]
    runs: list[dict[str, object]] = []
    repeat = 1 if a.quick else max(1, a.repeat)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        counter = iter(range(10**6))

        def fresh() -> str:
            return os.path.join(d, f"run{next(counter)}.db")

        runs.append(_median([_raw_baseline(fresh(), min(total, 1000)) for _ in range(repeat)]))
        for submitters in counts:
            for max_batch in (1, 512):
                # one transaction per submission (and one submitter) is fsync-bound: fewer samples suffice
                n = total if max_batch > 1 and submitters > 1 else min(total, 1000)
                runs.append(_median([asyncio.run(_one(fresh(), submitters, n, max_batch)) for _ in range(repeat)]))
                print(json.dumps(runs[-1]))
        with _postgres() as pg:
            if pg is not None:
                for submitters, max_batch in ((64, 1), (64, 512), (256, 512)):
                    n = total if max_batch > 1 else min(total, 1000)
                    res = _median(
                        [asyncio.run(_one(asyncio.run(_pg_reset(pg)), submitters, n, max_batch)) for _ in range(repeat)]
                    )
                    res["mode"] = f"PostgreSQL {res['mode']}"
                    runs.append(res)
                    print(json.dumps(res))
        # same work without a disk: what the writer thread's CPU alone allows
        ceiling = _median([asyncio.run(_one(":memory:", 64, total, 512)) for _ in range(repeat)])
        ceiling["mode"] = "group commit, :memory: (CPU ceiling, not durable)"
        runs.append(ceiling)
        print(json.dumps(ceiling))
    meta = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "store.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
    lines = [
        "# Store: durable submissions/s (SQLite WAL, synchronous=FULL)",
        "",
        f"Python {meta['python']}, SQLite {meta['sqlite']}, {meta['cpus']} CPUs, 1-min load average "
        f"{meta['load_avg_1m']} at the end (other work shares this machine). Each submission is acknowledged only "
        "after its COMMIT; every submission carries an idempotency key and writes a job row plus its watch event.",
        "",
        f"Median of {repeat} runs per row (min–max of the rate in brackets); batch sizes and ack latencies "
        "are from the median run.",
        "",
        "| mode | submitters | submissions | per s (min–max) | transactions | batch mean | p50 | p90 | max |"
        " ack p50 ms | ack p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        if "submitters" not in r:
            continue
        lines.append(
            f"| {r['mode']} | {r['submitters']} | {r['submissions']} | {r['per_s']} ({r['per_s_min']}–{r['per_s_max']})"
            f" | {r['transactions']} | "
            f"{r['batch_mean']} | {r['batch_p50']} | {r['batch_p90']} | {r['batch_max']} | {r['ack_p50_ms']} | "
            f"{r['ack_p99_ms']} |"
        )
    base = runs[0]
    lines += [
        "",
        f"Baseline: {base['mode']}: {base['per_s']}/s (min–max {base['per_s_min']}–{base['per_s_max']}) "
        f"over {base['submissions']} inserts, same pragmas, same disk.",
        "",
    ]
    (RESULTS / "store.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
