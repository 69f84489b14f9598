"""Store load generator: concurrent idempotent submissions, each key printed only after its commit.

Used by the durability test (SIGKILL mid-way, reopen, retry); a test tool, not part of the shipped
package. ``python -m tests.broker.store_hammer DB --writers N --jobs M``
prints ``ACK <key> <job_id>`` per acknowledged submission, ``DONE`` at the end;
with ``--reserve`` each job is then reserved (attempt 1 on cluster ``c<writer % 4>``)
and ``RES <key> <job_id>`` printed once that commit returned.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from broker.domain import job_events
from broker.domain.records import NewJob
from broker.store.base import StoreOptions
from broker.store.sqlite import SqliteStore
from fleetplan.catalog import ReplicaPlacement

__all__ = ["job_for_key", "key_for", "reserve_for", "run", "main"]


def key_for(writer: int, i: int) -> str:
    return f"w{writer:03d}-{i:06d}"


def job_for_key(key: str, tenant: str = "hammer") -> NewJob:
    """The one request body for a key: deterministic, so retries fingerprint the same."""
    w = int(key[1:4])
    return NewJob(
        tenant=tenant,
        queue=f"q{w % 4}",
        spec=f"spec:{key}".encode() * 8,
        job_set=f"set{w}",
        priority=w % 7,
        labels=(("writer", str(w)),),
        gpus=float(1 + w % 8),
        gpu_models=("H100",),
        idempotency_key=key,
    )


def reserve_for(job_id: str, key: str) -> job_events.Reserve:
    w = int(key[1:4])
    return job_events.Reserve(
        job_id, 0, f"c{w % 4}", ("z1", f"r{w % 3}"), (ReplicaPlacement("w", 0, f"n{w}"),), "H100", float(1 + w % 8)
    )


async def run(
    path: str, writers: int, jobs: int, *, max_batch: int = 512, out: bool = True, reserve: bool = False
) -> float:
    """Submit ``writers × jobs`` jobs from ``writers`` concurrent tasks; returns elapsed seconds."""
    store = SqliteStore(path, options=StoreOptions(max_batch=max_batch))
    await store.open()
    write = sys.stdout.write

    async def writer(w: int) -> None:
        for i in range(jobs):
            key = key_for(w, i)
            r = await store.submit(job_for_key(key))
            if out:
                write(f"ACK {key} {r.job.job_id}\n")
                sys.stdout.flush()
            if reserve:
                await store.apply_event(reserve_for(r.job.job_id, key))
                if out:
                    write(f"RES {key} {r.job.job_id}\n")
                    sys.stdout.flush()

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - t0
    await store.close()
    if out:
        write("DONE\n")
        sys.stdout.flush()
    return elapsed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("db")
    p.add_argument("--writers", type=int, default=16)
    p.add_argument("--jobs", type=int, default=1000, help="submissions per writer")
    p.add_argument("--max-batch", type=int, default=512)
    p.add_argument("--reserve", action="store_true", help="also reserve every job after its submission")
    a = p.parse_args(argv)
    asyncio.run(run(a.db, a.writers, a.jobs, max_batch=a.max_batch, reserve=a.reserve))


if __name__ == "__main__":
    main()
