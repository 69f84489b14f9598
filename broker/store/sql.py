"""The SQLite store's statements: connection setup, migrations and the write-side operations on one connection.

Every function here runs on the store's writer (or reader) thread inside a
transaction the caller owns; none commits.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable

from broker.domain.errors import JobNotFound, StoreUnavailable
from broker.domain.records import AttemptRecord, CompactionResult, GpuHours, JobRecord, NewJob, SubmitResult, Transition
from broker.domain.states import ACTIVE, TERMINAL
from broker.store import codec, writes
from broker.store.migrations import LATEST, MIGRATIONS
from broker.store.updates import Update

ACTIVE_SQL = ",".join(f"'{s.value}'" for s in sorted(ACTIVE))
_TERMINAL_SQL = ",".join(f"'{s.value}'" for s in sorted(TERMINAL))


def connect(path: str) -> sqlite3.Connection:
    """A connection with the store's pragmas (autocommit mode: transactions are explicit)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.row_factory = sqlite3.Row
    if path != ":memory:":
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def migrate(conn: sqlite3.Connection, now: float) -> int:
    """Apply pending migrations, each in its own transaction; returns the schema version."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
    if current > LATEST:
        raise StoreUnavailable(f"store schema version {current} is newer than this broker's {LATEST}")
    for version, statements in MIGRATIONS:
        if version <= current:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in statements:
                conn.execute(stmt)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, now))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        current = version
    return int(current)


_INSERT_EVENT = f"INSERT INTO events ({writes.EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)"


def _insert_event(c: sqlite3.Connection, event: writes.Values) -> int:
    """Append a watch event; its rowid is the new store revision (AUTOINCREMENT: never reused)."""
    return int(c.execute(_INSERT_EVENT, event).lastrowid or 0)


def submit_job(c: sqlite3.Connection, new: NewJob, *, id_gen: Callable[[], str], now: float) -> SubmitResult:
    """Insert a QUEUED job and its SUBMITTED event, or return the job an equal earlier request created."""
    fp = writes.submit_fingerprint(new)
    if new.idempotency_key:
        row = c.execute(
            "SELECT * FROM jobs WHERE tenant=? AND idem_key=?", (new.tenant, new.idempotency_key)
        ).fetchone()
        if row is not None:
            return writes.replay(new, fp, codec.job_from_row(row))
    job_id = new.job_id or id_gen()
    if new.job_id and c.execute("SELECT 1 FROM jobs WHERE job_id=?", (job_id,)).fetchone():
        raise writes.id_taken(job_id)
    job = writes.queued_job(new, job_id, fp, now)
    rev = _insert_event(c, writes.submitted_event(job, new.actor))
    cur = c.execute(
        "INSERT INTO jobs (job_id, tenant, queue, job_set, priority_band, priority, preemptible, labels,"
        " gpus, gpu_models, max_infra_retries, max_runtime_s, spec, idem_key, fingerprint, state, attempt,"
        " infra_retries, not_before, create_time, update_time, end_time, reason, message, revision)"
        " VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,0,0,0,?17,?17,NULL,?18,'',?19)",
        (*writes.queued_job_values(job), rev),
    )
    return SubmitResult(dataclasses.replace(job, seq=int(cur.lastrowid or 0), revision=rev), created=True)


def load_job(c: sqlite3.Connection, job_id: str, tenant: str | None = None) -> JobRecord:
    """The job; JobNotFound if unknown or another tenant's (when ``tenant`` is given)."""
    row = c.execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
    if row is None or (tenant is not None and row["tenant"] != tenant):
        raise JobNotFound(f"job {job_id} not found", job_id=job_id)
    return codec.job_from_row(row)


def current_attempt(c: sqlite3.Connection, job: JobRecord) -> AttemptRecord | None:
    if job.attempt == 0:
        return None
    row = c.execute("SELECT * FROM attempts WHERE job_id=? AND number=?", (job.job_id, job.attempt)).fetchone()
    return None if row is None else codec.attempt_from_row(row)


def apply_transition(c: sqlite3.Connection, job: JobRecord, t: Transition, now: float) -> JobRecord:
    """The compare-and-set (``writes.plan_transition``), then its writes: attempts, event, orders, job."""
    w = writes.plan_transition(job, t, now)
    if w.close_attempt is not None:
        c.execute(
            "UPDATE attempts SET outcome=?, end_time=?, message=?, exit_code=?, spent_retry=?,"
            " rejection_reason=?, rejection_nodes=? WHERE job_id=? AND number=? AND outcome IS NULL",
            w.close_attempt,
        )
    if w.stamp_attempt is not None:
        c.execute(
            "UPDATE attempts SET dispatch_time=COALESCE(?, dispatch_time), accept_time=COALESCE(?, accept_time),"
            " start_time=COALESCE(?, start_time), running_time=COALESCE(?, running_time),"
            " namespace=COALESCE(?, namespace), expires_at=CASE WHEN ? THEN NULL ELSE expires_at END"
            " WHERE job_id=? AND number=?",
            w.stamp_attempt,
        )
    if w.new_attempt is not None:
        c.execute(
            "UPDATE attempts SET outcome='LOST', end_time=?, message='superseded' WHERE job_id=? AND outcome IS NULL",
            (now, job.job_id),
        )  # defensive: a job has at most one open attempt
        c.execute(
            f"INSERT INTO attempts ({writes.ATTEMPT_COLUMNS}, message, spent_retry, namespace, rejection_reason,"
            " rejection_nodes) VALUES (?,?,?,?,?,?,?,?,?,'',0,'','','[]')",
            w.new_attempt,
        )
    rev = _insert_event(c, w.event)
    c.executemany(
        "INSERT INTO orders (cluster, job_id, attempt, kind, grace_s, created_at) VALUES (?,?,?,?,?,?)", w.orders
    )
    c.execute(
        "UPDATE jobs SET state=?, attempt=?, infra_retries=?, not_before=?, update_time=?, end_time=?,"
        " reason=?, message=?, revision=? WHERE job_id=?",
        w.job_values(rev),
    )
    return w.written(rev)


def write_update(c: sqlite3.Connection, job: JobRecord, u: Update, actor: str, now: float) -> JobRecord:
    """Persist a settings change (priority, band, spec bytes, hold) with its UPDATED event (caller's transaction).
    State, attempt, reason, message and update_time (the last state change) stay as they are."""
    rev = _insert_event(c, writes.update_event(job, u, actor, now))
    c.execute(
        "UPDATE jobs SET priority=?, priority_band=?, spec=?, held_by=?, revision=? WHERE job_id=?",
        writes.update_values(u, rev),
    )
    return dataclasses.replace(u.job, revision=rev)


# Overlap of [running (or start) time, end or now] with [since, until], x GPUs, summed in the database:
# nothing but the attempts' time columns is read (no spec), one row per (tenant, model, cluster).
_GPU_HOURS = (
    "SELECT j.tenant AS tenant, a.gpu_model AS gpu_model, a.cluster AS cluster,"
    " SUM((MIN(COALESCE(a.end_time, :now), :until) - MAX(COALESCE(a.running_time, a.start_time), :since))"
    " * a.gpus) / 3600.0 AS gpu_hours"
    " FROM attempts a JOIN jobs j ON j.job_id = a.job_id"
    " WHERE a.gpus > 0 AND COALESCE(a.running_time, a.start_time) IS NOT NULL"
    " AND MIN(COALESCE(a.end_time, :now), :until) > MAX(COALESCE(a.running_time, a.start_time), :since)"
    " AND (:tenant IS NULL OR j.tenant = :tenant)"
    " GROUP BY j.tenant, a.gpu_model, a.cluster ORDER BY j.tenant, a.gpu_model, a.cluster"
)


def gpu_hours(c: sqlite3.Connection, since: float, until: float, now: float, tenant: str | None) -> list[GpuHours]:
    rows = c.execute(_GPU_HOURS, {"since": since, "until": until, "now": now, "tenant": tenant})
    return [GpuHours(r["tenant"], r["gpu_model"], r["cluster"], float(r["gpu_hours"])) for r in rows]


def meta_int(c: sqlite3.Connection, key: str) -> int:
    row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return 0 if row is None else int(row[0])


def revision(c: sqlite3.Connection) -> int:
    """Latest revision ever assigned (committed, when read outside the writer's transaction)."""
    row = c.execute("SELECT seq FROM sqlite_sequence WHERE name='events'").fetchone()
    return 0 if row is None else int(row[0])


def compact_jobs(c: sqlite3.Connection, finished_before: float, limit: int) -> CompactionResult:
    """Delete old terminal jobs with everything that hangs off them; raise the compaction revision."""
    ids = [
        r[0]
        for r in c.execute(
            f"SELECT job_id FROM jobs WHERE state IN ({_TERMINAL_SQL}) AND end_time < ? ORDER BY end_time LIMIT ?",
            (finished_before, limit),
        ).fetchall()
    ]
    compacted = meta_int(c, "compacted_revision")
    events = 0
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        top = c.execute(f"SELECT MAX(revision) FROM events WHERE job_id IN ({marks})", chunk).fetchone()[0]
        compacted = max(compacted, int(top or 0))
        events += c.execute(f"DELETE FROM events WHERE job_id IN ({marks})", chunk).rowcount
        for table in writes.COMPACTED_TABLES:
            c.execute(f"DELETE FROM {table} WHERE job_id IN ({marks})", chunk)
    c.execute(
        "INSERT INTO meta (key, value) VALUES ('compacted_revision', ?)"
        " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
        (compacted,),
    )
    return CompactionResult(deleted_jobs=len(ids), deleted_events=events, compacted_revision=compacted)
