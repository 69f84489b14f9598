"""Crash durability at the store level: SIGKILL a child hammering the store, reopen, retry, count."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from broker.domain.records import JobFilter, OrderKind
from broker.domain.states import JobState
from broker.store.sqlite import SqliteStore
from tests.broker.store_hammer import job_for_key, key_for

REPO = Path(__file__).resolve().parents[2]
WRITERS, JOBS = 8, 250


def _hammer_until_killed(db: Path, kill_after_acks: int, *extra: str) -> dict[str, dict[str, str]]:
    """Run the hammer in a child; SIGKILL it once ``kill_after_acks`` keys were acknowledged.

    Returns {"ACK": {key: job_id}, "RES": {key: job_id}} of what the child reported as committed.
    """
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.broker.store_hammer",
            str(db),
            "--writers",
            str(WRITERS),
            "--jobs",
            str(JOBS),
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: dict[str, dict[str, str]] = {"ACK": {}, "RES": {}}
    assert child.stdout is not None
    for line in child.stdout:
        parts = line.split()
        if len(parts) == 3 and parts[0] in seen:
            seen[parts[0]][parts[1]] = parts[2]
        if len(seen["ACK"]) >= kill_after_acks:
            child.send_signal(signal.SIGKILL)
            break
    # anything already in the pipe was acknowledged before the kill
    for line in child.stdout:
        parts = line.split()
        if len(parts) == 3 and parts[0] in seen:
            seen[parts[0]][parts[1]] = parts[2]
    child.wait(60)
    assert child.returncode == -signal.SIGKILL, "the child finished before it was killed"
    return seen


async def test_every_acknowledged_job_survives_sigkill_and_retries_dedupe(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    acked = _hammer_until_killed(db, kill_after_acks=WRITERS * JOBS // 3)["ACK"]
    assert len(acked) >= WRITERS * JOBS // 3

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()

    all_keys = [key_for(w, i) for w in range(WRITERS) for i in range(JOBS)]
    async with SqliteStore(str(db)) as store:
        before = {j.idempotency_key: j.job_id for j in await _all_jobs(store)}
        # every acknowledged job is there, under the id the client was given
        missing = [k for k, jid in acked.items() if before.get(k) != jid]
        assert missing == []
        # the client retries everything it did not see acknowledged, with the same key and body
        for key in all_keys:
            if key in acked:
                continue
            r = await store.submit(job_for_key(key))
            assert r.created == (key not in before)
        # retrying an acknowledged one returns the original job
        for key in list(acked)[:50]:
            r = await store.submit(job_for_key(key))
            assert (r.created, r.job.job_id) == (False, acked[key])
        after = await _all_jobs(store)
    keys = [j.idempotency_key for j in after]
    assert len(keys) == len(set(keys)) == len(all_keys)  # exactly one job per key
    assert set(keys) == set(all_keys)


async def _all_jobs(store: SqliteStore) -> list:  # type: ignore[type-arg]
    out, token = [], ""
    while True:
        page = await store.list_jobs(JobFilter(tenant="hammer"), page_size=1000, page_token=token)
        out.extend(page.jobs)
        token = page.next_page_token
        if not token:
            return out


async def test_acknowledged_reservations_and_their_dispatch_orders_survive_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    seen = _hammer_until_killed(db, WRITERS * JOBS // 4, "--reserve")
    reserved = seen["RES"]
    assert reserved, "the child reserved nothing before the kill"
    async with SqliteStore(str(db)) as store:
        by_job = {r.job_id: r for r in await store.active_attempts()}
        orders = {o.job_id: o for c in ("c0", "c1", "c2", "c3") for o in await store.pending_orders(c, limit=100_000)}
        for key, job_id in reserved.items():
            job = await store.get_job(job_id)
            assert (job.state, job.attempt, job.idempotency_key) == (JobState.RESERVED, 1, key)
            res = by_job[job_id]
            w = int(key[1:4])
            assert (res.cluster, res.number, res.gpu_model) == (f"c{w % 4}", 1, "H100")
            assert (orders[job_id].kind, orders[job_id].attempt) == (OrderKind.DISPATCH, 1)
        # nothing half-done: every reservation has its order and every order its reservation
        assert set(by_job) == set(orders)
