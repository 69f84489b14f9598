"""The PostgreSQL store's statements (asyncpg): migrations and the write-side operations on one connection.

Mirrors ``broker.store.sql`` statement for statement; every function runs in
a transaction its caller owns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from broker.domain.errors import JobNotFound, StoreUnavailable
from broker.domain.records import (
    AttemptRecord,
    CompactionResult,
    EventKind,
    GpuHours,
    JobRecord,
    NewJob,
    SubmitResult,
    Transition,
)
from broker.domain.states import ACTIVE, TERMINAL
from broker.store import codec, writes
from broker.store.migrations import PG_LATEST, PG_MIGRATIONS
from broker.store.updates import Update

Conn = Any  # asyncpg.Connection (asyncpg ships no type hints)
ACTIVE_STATES = sorted(s.value for s in ACTIVE)
_TERMINAL = sorted(s.value for s in TERMINAL)


async def migrate(conn: Conn, now: float) -> int:
    """Apply pending migrations, each in its own transaction; returns the schema version."""
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
    )
    current = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version")
    if current > PG_LATEST:
        raise StoreUnavailable(f"store schema version {current} is newer than this broker's {PG_LATEST}")
    for version, statements in PG_MIGRATIONS:
        if version <= current:
            continue
        async with conn.transaction():
            for stmt in statements:
                await conn.execute(stmt)
            await conn.execute("INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)", version, now)
        current = version
    return int(current)


_INSERT_EVENT = (
    f"INSERT INTO events ({writes.EVENT_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11) RETURNING revision"
)


async def _insert_event(c: Conn, event: writes.Values) -> int:
    """Append a watch event; the sequence's next value is its revision."""
    return int(await c.fetchval(_INSERT_EVENT, *event))


async def submit_job(c: Conn, new: NewJob, *, id_gen: Callable[[], str], now: float) -> SubmitResult:
    """Insert a QUEUED job and its SUBMITTED event, or return the job an equal earlier request created."""
    fp = writes.submit_fingerprint(new)
    if new.idempotency_key:
        row = await c.fetchrow("SELECT * FROM jobs WHERE tenant=$1 AND idem_key=$2", new.tenant, new.idempotency_key)
        if row is not None:
            return writes.replay(new, fp, codec.job_from_row(row))
    job_id = new.job_id or id_gen()
    if new.job_id and await c.fetchval("SELECT 1 FROM jobs WHERE job_id=$1", job_id):
        raise writes.id_taken(job_id)
    job = writes.queued_job(new, job_id, fp, now)
    # one round trip: the SUBMITTED event (its revision) and the job row together; the event reuses the job's
    # values ($1 job_id, $2 tenant, $4 job_set, $16 state, $17 time, $18 reason) and adds $19 kind, $20 actor
    row = await c.fetchrow(
        f"WITH ev AS (INSERT INTO events ({writes.EVENT_COLUMNS})"
        " VALUES ($1,$2,$4,$19,NULL,$16,0,$18,'',$20,$17) RETURNING revision)"
        " INSERT INTO jobs (job_id, tenant, queue, job_set, priority_band, priority, preemptible, labels, gpus,"
        " gpu_models, max_infra_retries, max_runtime_s, spec, idem_key, fingerprint, state, attempt, infra_retries,"
        " not_before, create_time, update_time, end_time, reason, message, revision) SELECT $1,$2,$3,$4,$5,$6,$7,"
        "$8::jsonb,$9,$10,$11,$12,$13,$14,$15,$16,0,0,0,$17,$17,NULL,$18,'',ev.revision FROM ev"
        " RETURNING seq, revision",
        *writes.queued_job_values(job),
        EventKind.SUBMITTED.value,
        new.actor,
    )
    stored = dataclasses.replace(job, seq=int(row["seq"]), revision=int(row["revision"]))
    return SubmitResult(stored, created=True)


async def load_job(c: Conn, job_id: str, tenant: str | None = None) -> JobRecord:
    """The job; JobNotFound if unknown or another tenant's (when ``tenant`` is given)."""
    row = await c.fetchrow("SELECT * FROM jobs WHERE job_id=$1", job_id)
    if row is None or (tenant is not None and row["tenant"] != tenant):
        raise JobNotFound(f"job {job_id} not found", job_id=job_id)
    return codec.job_from_row(row)


async def current_attempt(c: Conn, job: JobRecord) -> AttemptRecord | None:
    if job.attempt == 0:
        return None
    row = await c.fetchrow("SELECT * FROM attempts WHERE job_id=$1 AND number=$2", job.job_id, job.attempt)
    return None if row is None else codec.attempt_from_row(row)


async def apply_transition(c: Conn, job: JobRecord, t: Transition, now: float) -> JobRecord:
    """The compare-and-set (``writes.plan_transition``), then its writes: attempts, event, orders, job."""
    w = writes.plan_transition(job, t, now)
    if w.close_attempt is not None:
        await c.execute(
            "UPDATE attempts SET outcome=$1, end_time=$2, message=$3, exit_code=$4, spent_retry=$5,"
            " rejection_reason=$6, rejection_nodes=$7 WHERE job_id=$8 AND number=$9 AND outcome IS NULL",
            *w.close_attempt,
        )
    if w.stamp_attempt is not None:
        await c.execute(
            "UPDATE attempts SET dispatch_time=COALESCE($1, dispatch_time), accept_time=COALESCE($2, accept_time),"
            " start_time=COALESCE($3, start_time), running_time=COALESCE($4, running_time),"
            " namespace=COALESCE($5, namespace), expires_at=CASE WHEN $6 THEN NULL ELSE expires_at END"
            " WHERE job_id=$7 AND number=$8",
            *w.stamp_attempt,
        )
    if w.new_attempt is not None:
        await c.execute(
            "UPDATE attempts SET outcome='LOST', end_time=$1, message='superseded' WHERE job_id=$2 AND outcome IS NULL",
            now,
            job.job_id,
        )  # defensive: a job has at most one open attempt
        await c.execute(
            f"INSERT INTO attempts ({writes.ATTEMPT_COLUMNS}, message, spent_retry, namespace, rejection_reason,"
            " rejection_nodes) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,'',FALSE,'','','[]')",
            *w.new_attempt,
        )
    rev = await _insert_event(c, w.event)
    if w.orders:
        await c.executemany(
            "INSERT INTO orders (cluster, job_id, attempt, kind, grace_s, created_at) VALUES ($1,$2,$3,$4,$5,$6)",
            w.orders,
        )
    await c.execute(
        "UPDATE jobs SET state=$1, attempt=$2, infra_retries=$3, not_before=$4, update_time=$5, end_time=$6,"
        " reason=$7, message=$8, revision=$9 WHERE job_id=$10",
        *w.job_values(rev),
    )
    return w.written(rev)


async def write_update(c: Conn, job: JobRecord, u: Update, actor: str, now: float) -> JobRecord:
    """A settings change with its UPDATED event (see ``broker.store.sql.write_update``)."""
    rev = await _insert_event(c, writes.update_event(job, u, actor, now))
    await c.execute(
        "UPDATE jobs SET priority=$1, priority_band=$2, spec=$3, held_by=$4, revision=$5 WHERE job_id=$6",
        *writes.update_values(u, rev),
    )
    return dataclasses.replace(u.job, revision=rev)


_GPU_HOURS = (
    "SELECT j.tenant AS tenant, a.gpu_model AS gpu_model, a.cluster AS cluster,"
    " SUM((LEAST(COALESCE(a.end_time, $3), $2) - GREATEST(COALESCE(a.running_time, a.start_time), $1))"
    " * a.gpus) / 3600.0 AS gpu_hours"
    " FROM attempts a JOIN jobs j ON j.job_id = a.job_id"
    " WHERE a.gpus > 0 AND COALESCE(a.running_time, a.start_time) IS NOT NULL"
    " AND LEAST(COALESCE(a.end_time, $3), $2) > GREATEST(COALESCE(a.running_time, a.start_time), $1)"
    " AND ($4::text IS NULL OR j.tenant = $4)"
    " GROUP BY j.tenant, a.gpu_model, a.cluster ORDER BY j.tenant, a.gpu_model, a.cluster"
)
"""See ``broker.store.sql``: the overlap with the window, x GPUs, summed by the database."""


async def gpu_hours(c: Conn, since: float, until: float, now: float, tenant: str | None) -> list[GpuHours]:
    rows = await c.fetch(_GPU_HOURS, since, until, now, tenant)
    return [GpuHours(r["tenant"], r["gpu_model"], r["cluster"], float(r["gpu_hours"])) for r in rows]


async def meta_int(c: Conn, key: str) -> int:
    v = await c.fetchval("SELECT value FROM meta WHERE key=$1", key)
    return 0 if v is None else int(bytes(v).decode())


async def revision(c: Conn) -> int:
    """Latest revision assigned (single writer: every lower one is committed or was rolled back)."""
    row = await c.fetchrow("SELECT last_value, is_called FROM events_revision_seq")
    return int(row["last_value"]) if row["is_called"] else 0


async def compact_jobs(c: Conn, finished_before: float, limit: int) -> CompactionResult:
    ids = [
        r["job_id"]
        for r in await c.fetch(
            "SELECT job_id FROM jobs WHERE state = ANY($1::text[]) AND end_time < $2 ORDER BY end_time LIMIT $3",
            _TERMINAL,
            finished_before,
            limit,
        )
    ]
    compacted = await meta_int(c, "compacted_revision")
    events = 0
    if ids:
        top = await c.fetchval("SELECT MAX(revision) FROM events WHERE job_id = ANY($1::text[])", ids)
        compacted = max(compacted, int(top or 0))
        status = await c.execute("DELETE FROM events WHERE job_id = ANY($1::text[])", ids)
        events = int(status.split()[-1])
        for table in writes.COMPACTED_TABLES:
            await c.execute(f"DELETE FROM {table} WHERE job_id = ANY($1::text[])", ids)
    await c.execute(
        "INSERT INTO meta (key, value) VALUES ('compacted_revision', $1)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        str(compacted).encode(),
    )
    return CompactionResult(deleted_jobs=len(ids), deleted_events=events, compacted_revision=compacted)
