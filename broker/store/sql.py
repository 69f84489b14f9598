"""The SQLite store's statements: connection setup, migrations and the write-side operations on one connection.

Every function here runs on the store's writer (or reader) thread inside a
transaction the caller owns; none commits.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable

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
from broker.store.migrations import LATEST, MIGRATIONS
from broker.store.updates import Update

__all__ = [
    "ACTIVE_SQL",
    "connect",
    "migrate",
    "insert_event",
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


def insert_event(
    c: sqlite3.Connection,
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
    """Append a watch event; its rowid is the new store revision (AUTOINCREMENT: never reused)."""
    cur = c.execute(
        "INSERT INTO events (job_id, tenant, job_set, kind, from_state, to_state, attempt, reason, message,"
        " actor, time) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (
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
        ),
    )
    return int(cur.lastrowid or 0)


def submit_job(c: sqlite3.Connection, new: NewJob, *, id_gen: Callable[[], str], now: float) -> SubmitResult:
    """Insert a QUEUED job and its SUBMITTED event, or return the job an equal earlier request created."""
    fp = new.fingerprint or codec.fingerprint(new)
    if new.idempotency_key:
        row = c.execute(
            "SELECT * FROM jobs WHERE tenant=? AND idem_key=?", (new.tenant, new.idempotency_key)
        ).fetchone()
        if row is not None:
            if bytes(row["fingerprint"]) == fp:
                return SubmitResult(codec.job_from_row(row), created=False)
            raise IdempotencyConflict(
                "idempotency key was already used for a different request",
                job_id=row["job_id"],
                idempotency_key=new.idempotency_key,
            )
    job_id = new.job_id or id_gen()
    if new.job_id and c.execute("SELECT 1 FROM jobs WHERE job_id=?", (job_id,)).fetchone():
        raise AlreadyExists(f"job {job_id} already exists", job_id=job_id)
    submitted = Reason.SUBMITTED.value
    rev = insert_event(
        c, job_id, new.tenant, new.job_set, EventKind.SUBMITTED, None, JobState.QUEUED, 0, submitted, "", new.actor, now
    )
    cur = c.execute(
        "INSERT INTO jobs (job_id, tenant, queue, job_set, priority_band, priority, preemptible, labels,"
        " gpus, gpu_models, max_infra_retries, max_runtime_s, spec, idem_key, fingerprint, state, attempt,"
        " infra_retries, not_before, create_time, update_time, end_time, reason, message, revision)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,0,0,?,?,NULL,?,'',?)",
        (
            job_id,
            new.tenant,
            new.queue,
            new.job_set,
            new.priority_band,
            new.priority,
            int(new.preemptible),
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
            now,
            submitted,
            rev,
        ),
    )
    rec = JobRecord(
        job_id=job_id,
        seq=int(cur.lastrowid or 0),
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
    """The compare-and-set: validate, then write job, attempts, event and orders (caller's transaction)."""
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
        c.execute(
            "UPDATE attempts SET outcome=?, end_time=?, message=?, exit_code=?, spent_retry=?,"
            " rejection_reason=?, rejection_nodes=? WHERE job_id=? AND number=? AND outcome IS NULL",
            (
                a.outcome.value,
                a.end_time,
                a.message,
                a.exit_code,
                int(a.spent_retry),
                a.rejection_reason,
                codec.dumps(list(a.rejection_nodes)),
                job.job_id,
                job.attempt,
            ),
        )
    if t.stamp is not None and job.attempt > 0:
        s = t.stamp
        c.execute(
            "UPDATE attempts SET dispatch_time=COALESCE(?, dispatch_time), accept_time=COALESCE(?, accept_time),"
            " start_time=COALESCE(?, start_time), running_time=COALESCE(?, running_time),"
            " namespace=COALESCE(?, namespace), expires_at=CASE WHEN ? THEN NULL ELSE expires_at END"
            " WHERE job_id=? AND number=?",
            (
                s.dispatch_time,
                s.accept_time,
                s.start_time,
                s.running_time,
                s.namespace,
                int(s.clear_expiry),
                job.job_id,
                job.attempt,
            ),
        )
    if t.new_attempt is not None:
        a2 = t.new_attempt
        if a2.number != job.attempt + 1 or a2.job_id != job.job_id:
            raise InvalidTransition(
                f"job {job.job_id}: new attempt must be {job.attempt + 1}, got {a2.number}", job_id=job.job_id
            )
        c.execute(
            "UPDATE attempts SET outcome='LOST', end_time=?, message='superseded' WHERE job_id=? AND outcome IS NULL",
            (now, job.job_id),
        )  # defensive: a job has at most one open attempt
        c.execute(
            "INSERT INTO attempts (job_id, number, cluster, domain, assignments, gpu_model, gpus, reserve_time,"
            " expires_at, message, spent_retry, namespace, rejection_reason, rejection_nodes)"
            " VALUES (?,?,?,?,?,?,?,?,?,'',0,'','','[]')",
            (
                job.job_id,
                a2.number,
                a2.cluster,
                codec.dumps(list(a2.domain)),
                codec.assignments_json(a2.assignments),
                a2.gpu_model,
                a2.gpus,
                a2.reserve_time,
                a2.expires_at,
            ),
        )
        attempt_no = a2.number
    rev = insert_event(
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
    for o in t.orders:
        c.execute(
            "INSERT INTO orders (cluster, job_id, attempt, kind, grace_s, created_at) VALUES (?,?,?,?,?,?)",
            (o.cluster, job.job_id, o.attempt if o.attempt is not None else attempt_no, o.kind.value, o.grace_s, now),
        )
    end_time = now if t.new_state in TERMINAL else None
    retries = job.infra_retries + (1 if t.spend_retry else 0)
    not_before = job.not_before if t.not_before is None else t.not_before
    c.execute(
        "UPDATE jobs SET state=?, attempt=?, infra_retries=?, not_before=?, update_time=?, end_time=?,"
        " reason=?, message=?, revision=? WHERE job_id=?",
        (t.new_state.value, attempt_no, retries, not_before, now, end_time, t.reason, t.message, rev, job.job_id),
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


def write_update(c: sqlite3.Connection, job: JobRecord, u: Update, actor: str, now: float) -> JobRecord:
    """Persist a settings change (priority, band, spec bytes, hold) with its UPDATED event (caller's transaction).
    State, attempt, reason, message and update_time (the last state change) stay as they are."""
    rev = insert_event(
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
    c.execute(
        "UPDATE jobs SET priority=?, priority_band=?, spec=?, held_by=?, revision=? WHERE job_id=?",
        (new.priority, new.priority_band, new.spec, new.held_by if new.held else None, rev, job.job_id),
    )
    return dataclasses.replace(new, revision=rev)


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
        c.execute(f"DELETE FROM orders WHERE job_id IN ({marks})", chunk)
        c.execute(f"DELETE FROM attempts WHERE job_id IN ({marks})", chunk)
        c.execute(f"DELETE FROM replicas WHERE job_id IN ({marks})", chunk)
        c.execute(f"DELETE FROM jobs WHERE job_id IN ({marks})", chunk)
    c.execute(
        "INSERT INTO meta (key, value) VALUES ('compacted_revision', ?)"
        " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
        (compacted,),
    )
    return CompactionResult(deleted_jobs=len(ids), deleted_events=events, compacted_revision=compacted)
