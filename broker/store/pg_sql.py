"""The PostgreSQL store's statements (asyncpg): migrations and the write-side operations on one connection.

Mirrors ``broker.store.sql`` statement for statement; every function runs in
a transaction its caller owns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.domain.errors import (
    AlreadyExists,
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    StaleTransition,
    StoreUnavailable,
)
from broker.domain.lifecycle import Reason
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
from broker.domain.states import ACTIVE, TERMINAL, JobState, is_allowed
from broker.store import codec
from broker.store.migrations import PG_LATEST, PG_MIGRATIONS
from broker.store.updates import Update

__all__ = [
    "ACTIVE_STATES",
    "migrate",
    "submit_job",
    "load_job",
    "current_attempt",
    "apply_transition",
    "write_update",
    "gpu_hours",
    "compact_jobs",
    "meta_int",
    "revision",
]

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


async def insert_event(
    c: Conn,
    job_id: str,
    tenant: str,
    job_set: str,
    kind: EventKind,
    src: JobState | None,
    dst: JobState,
    attempt: int,
    reason: str,
    message: str,
    actor: str,
    now: float,
) -> int:
    rev = await c.fetchval(
        "INSERT INTO events (job_id, tenant, job_set, kind, from_state, to_state, attempt, reason, message, actor,"
        " time) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11) RETURNING revision",
        job_id,
        tenant,
        job_set,
        kind.value,
        None if src is None else src.value,
        dst.value,
        attempt,
        reason,
        message,
        actor,
        now,
    )
    return int(rev)


async def submit_job(c: Conn, new: NewJob, *, id_gen: Any, now: float) -> SubmitResult:
    fp = new.fingerprint or codec.fingerprint(new)
    if new.idempotency_key:
        row = await c.fetchrow("SELECT * FROM jobs WHERE tenant=$1 AND idem_key=$2", new.tenant, new.idempotency_key)
        if row is not None:
            if bytes(row["fingerprint"]) == fp:
                return SubmitResult(codec.job_from_row(row), created=False)
            raise IdempotencyConflict(
                "idempotency key was already used for a different request",
                job_id=row["job_id"],
                idempotency_key=new.idempotency_key,
            )
    job_id = new.job_id or id_gen()
    if new.job_id and await c.fetchval("SELECT 1 FROM jobs WHERE job_id=$1", job_id):
        raise AlreadyExists(f"job {job_id} already exists", job_id=job_id)
    submitted = Reason.SUBMITTED.value
    # one round trip: the SUBMITTED event (its revision) and the job row together
    row = await c.fetchrow(
        "WITH ev AS (INSERT INTO events (job_id, tenant, job_set, kind, from_state, to_state, attempt, reason,"
        " message, actor, time) VALUES ($1,$2,$4,$19,NULL,$16,0,$18,'',$20,$17) RETURNING revision)"
        " INSERT INTO jobs (job_id, tenant, queue, job_set, priority_band, priority, preemptible, labels, gpus,"
        " gpu_models, max_infra_retries, max_runtime_s, spec, idem_key, fingerprint, state, attempt, infra_retries,"
        " not_before, create_time, update_time, end_time, reason, message, revision) SELECT $1,$2,$3,$4,$5,$6,$7,"
        "$8::jsonb,$9,$10,$11,$12,$13,$14,$15,$16,0,0,0,$17,$17,NULL,$18,'',ev.revision FROM ev"
        " RETURNING seq, revision",
        job_id,
        new.tenant,
        new.queue,
        new.job_set,
        new.priority_band,
        new.priority,
        new.preemptible,
        codec.dumps(dict(sorted(new.labels))),
        new.gpus,
        codec.dumps(list(new.gpu_models)),
        new.max_infra_retries,
        new.max_runtime_s,
        new.spec,
        new.idempotency_key or None,
        fp,
        JobState.QUEUED.value,
        now,
        submitted,
        EventKind.SUBMITTED.value,
        new.actor,
    )
    seq, rev = int(row["seq"]), int(row["revision"])
    rec = JobRecord(
        job_id=job_id,
        seq=seq,
        tenant=new.tenant,
        queue=new.queue,
        job_set=new.job_set,
        priority_band=new.priority_band,
        priority=new.priority,
        preemptible=new.preemptible,
        labels=tuple(sorted(new.labels)),
        gpus=new.gpus,
        gpu_models=new.gpu_models,
        max_infra_retries=new.max_infra_retries,
        max_runtime_s=new.max_runtime_s,
        spec=new.spec,
        idempotency_key=new.idempotency_key or None,
        fingerprint=fp,
        state=JobState.QUEUED,
        attempt=0,
        infra_retries=0,
        not_before=0.0,
        create_time=now,
        update_time=now,
        end_time=None,
        reason=submitted,
        message="",
        revision=rev,
    )
    return SubmitResult(rec, created=True)


async def load_job(c: Conn, job_id: str, tenant: str | None = None) -> JobRecord:
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
    """The compare-and-set (see ``broker.store.sql.apply_transition``)."""
    if job.state is not t.expect_state or job.attempt != t.expect_attempt:
        raise StaleTransition(
            f"job {job.job_id} is {job.state.value}/attempt {job.attempt}, "
            f"expected {t.expect_state.value}/attempt {t.expect_attempt}",
            job_id=job.job_id,
            state=job.state.value,
            attempt=job.attempt,
        )
    if not is_allowed(job.state, t.new_state):
        raise InvalidTransition(
            f"job {job.job_id}: no transition {job.state.value} -> {t.new_state.value}",
            job_id=job.job_id,
            from_state=job.state.value,
            to_state=t.new_state.value,
        )
    attempt_no = job.attempt
    if t.close_attempt is not None and job.attempt > 0:
        a = t.close_attempt
        await c.execute(
            "UPDATE attempts SET outcome=$1, end_time=$2, message=$3, exit_code=$4, spent_retry=$5,"
            " rejection_reason=$6, rejection_nodes=$7 WHERE job_id=$8 AND number=$9 AND outcome IS NULL",
            a.outcome.value,
            a.end_time,
            a.message,
            a.exit_code,
            a.spent_retry,
            a.rejection_reason,
            codec.dumps(list(a.rejection_nodes)),
            job.job_id,
            job.attempt,
        )
    if t.stamp is not None and job.attempt > 0:
        s = t.stamp
        await c.execute(
            "UPDATE attempts SET dispatch_time=COALESCE($1, dispatch_time), accept_time=COALESCE($2, accept_time),"
            " start_time=COALESCE($3, start_time), running_time=COALESCE($4, running_time),"
            " namespace=COALESCE($5, namespace), expires_at=CASE WHEN $6 THEN NULL ELSE expires_at END"
            " WHERE job_id=$7 AND number=$8",
            s.dispatch_time,
            s.accept_time,
            s.start_time,
            s.running_time,
            s.namespace,
            s.clear_expiry,
            job.job_id,
            job.attempt,
        )
    if t.new_attempt is not None:
        a2 = t.new_attempt
        if a2.number != job.attempt + 1 or a2.job_id != job.job_id:
            raise InvalidTransition(
                f"job {job.job_id}: new attempt must be {job.attempt + 1}, got {a2.number}", job_id=job.job_id
            )
        await c.execute(
            "UPDATE attempts SET outcome='LOST', end_time=$1, message='superseded' WHERE job_id=$2 AND outcome IS NULL",
            now,
            job.job_id,
        )
        await c.execute(
            "INSERT INTO attempts (job_id, number, cluster, domain, assignments, gpu_model, gpus, reserve_time,"
            " expires_at, message, spent_retry, namespace, rejection_reason, rejection_nodes)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,'',FALSE,'','','[]')",
            job.job_id,
            a2.number,
            a2.cluster,
            codec.dumps(list(a2.domain)),
            codec.assignments_json(a2.assignments),
            a2.gpu_model,
            a2.gpus,
            a2.reserve_time,
            a2.expires_at,
        )
        attempt_no = a2.number
    rev = await insert_event(
        c,
        job.job_id,
        job.tenant,
        job.job_set,
        EventKind.TRANSITION,
        job.state,
        t.new_state,
        attempt_no,
        t.reason,
        t.message,
        t.actor,
        now,
    )
    if t.orders:
        await c.executemany(
            "INSERT INTO orders (cluster, job_id, attempt, kind, grace_s, created_at) VALUES ($1,$2,$3,$4,$5,$6)",
            [
                (
                    o.cluster,
                    job.job_id,
                    o.attempt if o.attempt is not None else attempt_no,
                    o.kind.value,
                    o.grace_s,
                    now,
                )
                for o in t.orders
            ],
        )
    end_time = now if t.new_state in TERMINAL else None
    retries = job.infra_retries + (1 if t.spend_retry else 0)
    not_before = job.not_before if t.not_before is None else t.not_before
    await c.execute(
        "UPDATE jobs SET state=$1, attempt=$2, infra_retries=$3, not_before=$4, update_time=$5, end_time=$6,"
        " reason=$7, message=$8, revision=$9 WHERE job_id=$10",
        t.new_state.value,
        attempt_no,
        retries,
        not_before,
        now,
        end_time,
        t.reason,
        t.message,
        rev,
        job.job_id,
    )
    return dataclasses.replace(
        job,
        state=t.new_state,
        attempt=attempt_no,
        infra_retries=retries,
        not_before=not_before,
        update_time=now,
        end_time=end_time,
        reason=t.reason,
        message=t.message,
        revision=rev,
    )


async def write_update(c: Conn, job: JobRecord, u: Update, actor: str, now: float) -> JobRecord:
    """A settings change with its UPDATED event (see ``broker.store.sql.write_update``)."""
    rev = await insert_event(
        c,
        job.job_id,
        job.tenant,
        job.job_set,
        EventKind.UPDATED,
        job.state,
        job.state,
        job.attempt,
        u.reason.value,
        u.message,
        actor,
        now,
    )
    new = u.job
    await c.execute(
        "UPDATE jobs SET priority=$1, priority_band=$2, spec=$3, held_by=$4, revision=$5 WHERE job_id=$6",
        new.priority,
        new.priority_band,
        new.spec,
        new.held_by if new.held else None,
        rev,
        job.job_id,
    )
    return dataclasses.replace(new, revision=rev)


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
        for table in ("orders", "replicas", "attempts", "jobs"):
            await c.execute(f"DELETE FROM {table} WHERE job_id = ANY($1::text[])", ids)
    await c.execute(
        "INSERT INTO meta (key, value) VALUES ('compacted_revision', $1)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        str(compacted).encode(),
    )
    return CompactionResult(deleted_jobs=len(ids), deleted_events=events, compacted_revision=compacted)
