"""SQLite implementation of ``Store``: WAL + synchronous=FULL, one writer thread with group commit, one reader thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from broker import lifecycle
from broker.errors import (
    AlreadyExists,
    IdempotencyConflict,
    InvalidTransition,
    JobFinished,
    JobNotFound,
    RevisionCompacted,
    StaleTransition,
    StoreUnavailable,
)
from broker.records import (
    AttemptRecord,
    CompactionResult,
    DispatchOrder,
    EventKind,
    JobFilter,
    JobPage,
    JobRecord,
    NewJob,
    Reservation,
    SubmitResult,
    Transition,
    WatchEvent,
)
from broker.states import ACTIVE, TERMINAL, JobState, is_allowed
from broker.store import codec
from broker.store.base import Clock, Decide, IdGen, Store, StoreOptions
from broker.store.commit import GroupCommitter
from broker.store.migrations import LATEST, MIGRATIONS

__all__ = ["SqliteStore", "connect", "migrate"]

T = TypeVar("T")
_ACTIVE_SQL = ",".join(f"'{s.value}'" for s in sorted(ACTIVE))
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


class SqliteStore(Store):
    """The embedded default store. ``path=":memory:"`` for tests (then reads also go through the writer)."""

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        clock: Clock = time.time,
        id_gen: IdGen | None = None,
        options: StoreOptions = StoreOptions(),
    ) -> None:
        self._path = str(path)
        self._clock = clock
        self._id_gen = id_gen or (lambda: codec.new_job_id(lambda: int(clock() * 1000)))
        self._opts = options
        self._writer: GroupCommitter | None = None
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._reader_conn: sqlite3.Connection | None = None
        self._tokens: codec.PageTokens | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commit_signal: asyncio.Future[None] | None = None
        self.schema_version = 0

    @property
    def commit_stats(self) -> Any:
        return self._writer.stats if self._writer else None

    @property
    def committer(self) -> GroupCommitter:
        if self._writer is None:
            raise StoreUnavailable("store is not open")
        return self._writer

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._commit_signal = self._loop.create_future()
        secret: list[bytes] = []

        def setup() -> sqlite3.Connection:
            conn = connect(self._path)
            self.schema_version = migrate(conn, self._clock())
            row = conn.execute("SELECT value FROM meta WHERE key='page_secret'").fetchone()
            if row is None:
                value = os.urandom(32)
                conn.execute("INSERT INTO meta (key, value) VALUES ('page_secret', ?)", (value,))
            else:
                value = bytes(row[0])
            secret.append(value)
            return conn

        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        writer = GroupCommitter(setup, max_batch=self._opts.max_batch, on_commit=self._notify)
        await asyncio.get_running_loop().run_in_executor(None, writer.start)
        self._writer = writer
        self._tokens = codec.PageTokens(secret[0])
        if self._path != ":memory:":
            self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tandem-store-reader")
            self._reader_conn = connect(self._path)

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.stop()
        if self._reader is not None:
            conn, pool = self._reader_conn, self._reader
            self._reader, self._reader_conn = None, None
            if conn is not None:
                pool.submit(conn.close).result()
            pool.shutdown(wait=True)

    def _notify(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._signal_commit)

    def _signal_commit(self) -> None:
        """Resolve the current commit signal and arm a fresh one (no wake-up is lost between the two)."""
        fut, loop = self._commit_signal, self._loop
        if loop is None:
            return
        self._commit_signal = loop.create_future()
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return await self.committer.call(op)

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._reader is None or self._reader_conn is None:
            return await self._write(op)
        conn = self._reader_conn

        def run() -> T:
            conn.execute("BEGIN")  # one snapshot for multi-statement reads
            try:
                return op(conn)
            finally:
                conn.execute("COMMIT")

        return await asyncio.get_running_loop().run_in_executor(self._reader, run)

    # -- submission ------------------------------------------------------------------------------

    async def submit(self, job: NewJob) -> SubmitResult:
        return await self._write(lambda c: self._submit(c, job))

    async def submit_all(self, jobs: Sequence[NewJob]) -> list[SubmitResult]:
        items = list(jobs)
        return await self._write(lambda c: [self._submit(c, j) for j in items])

    def _submit(self, c: sqlite3.Connection, new: NewJob) -> SubmitResult:
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
                    job_id=row["job_id"], idempotency_key=new.idempotency_key,
                )
        job_id = new.job_id or self._id_gen()
        if c.execute("SELECT 1 FROM jobs WHERE job_id=?", (job_id,)).fetchone():
            raise AlreadyExists(f"job {job_id} already exists", job_id=job_id)
        now = self._clock()
        rev = self._event(c, job_id, new.tenant, new.job_set, EventKind.SUBMITTED, None, JobState.QUEUED, 0,
                          lifecycle.Reason.SUBMITTED.value, "", "broker", now)
        cur = c.execute(
            "INSERT INTO jobs (job_id, tenant, queue, job_set, priority_band, priority, preemptible, labels,"
            " gpus, gpu_models, max_infra_retries, max_runtime_s, spec, idem_key, fingerprint, state, attempt,"
            " infra_retries, not_before, create_time, update_time, end_time, reason, message, revision)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,0,0,?,?,NULL,?,'',?)",
            (job_id, new.tenant, new.queue, new.job_set, new.priority_band, new.priority, int(new.preemptible),
             json.dumps(dict(new.labels), sort_keys=True), new.gpus, json.dumps(list(new.gpu_models)),
             new.max_infra_retries, new.max_runtime_s, new.spec, new.idempotency_key or None, fp,
             JobState.QUEUED.value, now, now, lifecycle.Reason.SUBMITTED.value, rev),
        )
        rec = JobRecord(
            job_id=job_id, seq=int(cur.lastrowid or 0), tenant=new.tenant, queue=new.queue, job_set=new.job_set,
            priority_band=new.priority_band, priority=new.priority, preemptible=new.preemptible,
            labels=tuple(sorted(new.labels)), gpus=new.gpus, gpu_models=new.gpu_models,
            max_infra_retries=new.max_infra_retries, max_runtime_s=new.max_runtime_s, spec=new.spec,
            idempotency_key=new.idempotency_key or None, fingerprint=fp, state=JobState.QUEUED, attempt=0,
            infra_retries=0, not_before=0.0, create_time=now, update_time=now, end_time=None,
            reason=lifecycle.Reason.SUBMITTED.value, message="", revision=rev,
        )
        return SubmitResult(rec, created=True)

    @staticmethod
    def _event(
        c: sqlite3.Connection, job_id: str, tenant: str, job_set: str, kind: EventKind,
        src: JobState | None, dst: JobState, attempt: int, reason: str, message: str, actor: str, now: float,
    ) -> int:
        cur = c.execute(
            "INSERT INTO events (job_id, tenant, job_set, kind, from_state, to_state, attempt, reason, message,"
            " actor, time) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (job_id, tenant, job_set, kind.value, None if src is None else src.value, dst.value, attempt,
             reason, message, actor, now),
        )
        return int(cur.lastrowid or 0)

    # -- reads -----------------------------------------------------------------------------------

    @staticmethod
    def _load(c: sqlite3.Connection, job_id: str, tenant: str | None = None) -> JobRecord:
        row = c.execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        if row is None or (tenant is not None and row["tenant"] != tenant):
            raise JobNotFound(f"job {job_id} not found", job_id=job_id)
        return codec.job_from_row(row)

    @staticmethod
    def _attempt(c: sqlite3.Connection, job: JobRecord) -> AttemptRecord | None:
        if job.attempt == 0:
            return None
        row = c.execute("SELECT * FROM attempts WHERE job_id=? AND number=?", (job.job_id, job.attempt)).fetchone()
        return None if row is None else codec.attempt_from_row(row)

    async def get_job(self, job_id: str, *, tenant: str | None = None) -> JobRecord:
        return await self._read(lambda c: self._load(c, job_id, tenant))

    async def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        def op(c: sqlite3.Connection) -> list[AttemptRecord]:
            rows = c.execute("SELECT * FROM attempts WHERE job_id=? ORDER BY number", (job_id,)).fetchall()
            return [codec.attempt_from_row(r) for r in rows]

        return await self._read(op)

    async def job_history(self, job_id: str) -> list[WatchEvent]:
        def op(c: sqlite3.Connection) -> list[WatchEvent]:
            rows = c.execute("SELECT * FROM events WHERE job_id=? ORDER BY revision", (job_id,)).fetchall()
            return [codec.event_from_row(r) for r in rows]

        return await self._read(op)

    async def list_jobs(self, flt: JobFilter, *, page_size: int = 0, page_token: str = "") -> JobPage:
        tokens = self._tokens
        assert tokens is not None, "store is not open"
        size = min(page_size if page_size > 0 else self._opts.default_page_size, self._opts.max_page_size)
        after = tokens.decode(page_token, flt) if page_token else 0
        where: list[str] = ["seq > ?"]
        args: list[object] = [after]
        if flt.tenant is not None:
            where.append("tenant = ?")
            args.append(flt.tenant)
        if flt.states:
            where.append(f"state IN ({','.join('?' * len(flt.states))})")
            args.extend(s.value for s in sorted(flt.states))
        if flt.queue is not None:
            where.append("queue = ?")
            args.append(flt.queue)
        if flt.job_set is not None:
            where.append("job_set = ?")
            args.append(flt.job_set)
        for k, v in flt.labels:
            where.append("EXISTS (SELECT 1 FROM json_each(jobs.labels) j WHERE j.key = ? AND j.value = ?)")
            args.extend((k, v))
        sql = f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        args.append(size + 1)

        def op(c: sqlite3.Connection) -> list[JobRecord]:
            return [codec.job_from_row(r) for r in c.execute(sql, args).fetchall()]

        jobs = await self._read(op)
        more = len(jobs) > size
        jobs = jobs[:size]
        token = tokens.encode(jobs[-1].seq, flt) if more and jobs else ""
        return JobPage(tuple(jobs), token)

    async def active_jobs(self) -> list[JobRecord]:
        def op(c: sqlite3.Connection) -> list[JobRecord]:
            rows = c.execute(f"SELECT * FROM jobs WHERE state IN ({_ACTIVE_SQL}) ORDER BY seq").fetchall()
            return [codec.job_from_row(r) for r in rows]

        return await self._read(op)

    async def active_attempts(self) -> list[AttemptRecord]:
        def op(c: sqlite3.Connection) -> list[AttemptRecord]:
            rows = c.execute(
                "SELECT a.* FROM attempts a JOIN jobs j ON j.job_id = a.job_id AND j.attempt = a.number"
                f" WHERE a.outcome IS NULL AND j.state IN ({_ACTIVE_SQL}) ORDER BY j.seq"
            ).fetchall()
            return [codec.attempt_from_row(r) for r in rows]

        return await self._read(op)

    async def active_reservations(self) -> list[Reservation]:
        def op(c: sqlite3.Connection) -> list[Reservation]:
            rows = c.execute(
                "SELECT a.*, j.tenant AS tenant FROM attempts a JOIN jobs j"
                " ON j.job_id = a.job_id AND j.attempt = a.number"
                f" WHERE a.outcome IS NULL AND j.state IN ({_ACTIVE_SQL}) ORDER BY j.seq"
            ).fetchall()
            return [codec.attempt_from_row(r).reservation(r["tenant"]) for r in rows]

        return await self._read(op)

    # -- state changes ---------------------------------------------------------------------------

    async def transition(self, t: Transition) -> JobRecord:
        return await self._write(lambda c: self._apply(c, self._load(c, t.job_id), t))

    async def mutate(self, job_id: str, decide: Decide) -> JobRecord:
        def op(c: sqlite3.Connection) -> JobRecord:
            job = self._load(c, job_id)
            t = decide(job, self._attempt(c, job))
            return job if t is None else self._apply(c, job, t)

        return await self._write(op)

    async def apply_event(self, event: lifecycle.Event) -> tuple[JobRecord, lifecycle.Reaction]:
        def op(c: sqlite3.Connection) -> tuple[JobRecord, lifecycle.Reaction]:
            job = self._load(c, event.job_id)
            reaction = lifecycle.react(job, self._attempt(c, job), event, self._opts.retry, self._clock())
            if reaction.transition is None:
                return job, reaction
            return self._apply(c, job, reaction.transition), reaction

        return await self._write(op)

    def _cancel(
        self, c: sqlite3.Connection, job: JobRecord, actor: str, message: str, grace_s: float
    ) -> JobRecord | None:
        ev = lifecycle.CancelRequested(job.job_id, actor=actor, message=message, grace_s=grace_s)
        reaction = lifecycle.react(job, self._attempt(c, job), ev, self._opts.retry, self._clock())
        return None if reaction.transition is None else self._apply(c, job, reaction.transition)

    async def cancel_job(
        self, job_id: str, *, tenant: str | None, actor: str, message: str = "", grace_s: float = 30.0
    ) -> JobRecord:
        def op(c: sqlite3.Connection) -> JobRecord:
            job = self._load(c, job_id, tenant)
            if job.state in (JobState.SUCCEEDED, JobState.FAILED):
                raise JobFinished(f"job {job_id} already {job.state.value}", job_id=job_id, state=job.state.value)
            return self._cancel(c, job, actor, message, grace_s) or job

        return await self._write(op)

    async def cancel_job_set(
        self, tenant: str, job_set: str, *, actor: str, message: str = "", grace_s: float = 30.0
    ) -> list[JobRecord]:
        def op(c: sqlite3.Connection) -> list[JobRecord]:
            rows = c.execute(
                f"SELECT * FROM jobs WHERE tenant=? AND job_set=? AND state IN ({_ACTIVE_SQL}) ORDER BY seq",
                (tenant, job_set),
            ).fetchall()
            changed = []
            for row in rows:
                done = self._cancel(c, codec.job_from_row(row), actor, message, grace_s)
                if done is not None:
                    changed.append(done)
            return changed

        return await self._write(op)

    def _apply(self, c: sqlite3.Connection, job: JobRecord, t: Transition) -> JobRecord:
        """The compare-and-set: validate, then write job, attempts, event and orders (caller's transaction)."""
        if job.state is not t.expect_state or job.attempt != t.expect_attempt:
            raise StaleTransition(
                f"job {job.job_id} is {job.state.value}/attempt {job.attempt}, "
                f"expected {t.expect_state.value}/attempt {t.expect_attempt}",
                job_id=job.job_id, state=job.state.value, attempt=job.attempt,
            )
        if not is_allowed(job.state, t.new_state):
            raise InvalidTransition(
                f"job {job.job_id}: no transition {job.state.value} -> {t.new_state.value}",
                job_id=job.job_id, from_state=job.state.value, to_state=t.new_state.value,
            )
        now = self._clock()
        attempt_no = job.attempt
        if t.close_attempt is not None and job.attempt > 0:
            a = t.close_attempt
            c.execute(
                "UPDATE attempts SET outcome=?, end_time=?, message=?, exit_code=?, spent_retry=?,"
                " rejection_reason=?, rejection_nodes=? WHERE job_id=? AND number=? AND outcome IS NULL",
                (a.outcome.value, a.end_time, a.message, a.exit_code, int(a.spent_retry), a.rejection_reason,
                 json.dumps(list(a.rejection_nodes)), job.job_id, job.attempt),
            )
        if t.stamp is not None and job.attempt > 0:
            s = t.stamp
            c.execute(
                "UPDATE attempts SET dispatch_time=COALESCE(?, dispatch_time), accept_time=COALESCE(?, accept_time),"
                " start_time=COALESCE(?, start_time), running_time=COALESCE(?, running_time),"
                " namespace=COALESCE(?, namespace), expires_at=CASE WHEN ? THEN NULL ELSE expires_at END"
                " WHERE job_id=? AND number=?",
                (s.dispatch_time, s.accept_time, s.start_time, s.running_time, s.namespace, int(s.clear_expiry),
                 job.job_id, job.attempt),
            )
        if t.new_attempt is not None:
            a2 = t.new_attempt
            if a2.number != job.attempt + 1 or a2.job_id != job.job_id:
                raise InvalidTransition(
                    f"job {job.job_id}: new attempt must be {job.attempt + 1}, got {a2.number}", job_id=job.job_id
                )
            c.execute(
                "UPDATE attempts SET outcome='LOST', end_time=?, message='superseded'"
                " WHERE job_id=? AND outcome IS NULL", (now, job.job_id),
            )  # defensive: a job has at most one open attempt
            c.execute(
                "INSERT INTO attempts (job_id, number, cluster, domain, assignments, gpu_model, gpus, reserve_time,"
                " expires_at, message, spent_retry, namespace, rejection_reason, rejection_nodes)"
                " VALUES (?,?,?,?,?,?,?,?,?,'',0,'','','[]')",
                (job.job_id, a2.number, a2.cluster, json.dumps(list(a2.domain)),
                 codec.assignments_json(a2.assignments), a2.gpu_model, a2.gpus, a2.reserve_time, a2.expires_at),
            )
            attempt_no = a2.number
        rev = self._event(c, job.job_id, job.tenant, job.job_set, EventKind.TRANSITION, job.state, t.new_state,
                          attempt_no, t.reason, t.message, t.actor, now)
        for o in t.orders:
            c.execute(
                "INSERT INTO orders (cluster, job_id, attempt, kind, grace_s, created_at) VALUES (?,?,?,?,?,?)",
                (o.cluster, job.job_id, o.attempt if o.attempt is not None else attempt_no, o.kind.value,
                 o.grace_s, now),
            )
        end_time = now if t.new_state in TERMINAL else None
        retries = job.infra_retries + (1 if t.spend_retry else 0)
        not_before = job.not_before if t.not_before is None else t.not_before
        c.execute(
            "UPDATE jobs SET state=?, attempt=?, infra_retries=?, not_before=?, update_time=?, end_time=?,"
            " reason=?, message=?, revision=? WHERE job_id=?",
            (t.new_state.value, attempt_no, retries, not_before, now, end_time, t.reason, t.message, rev,
             job.job_id),
        )
        return dataclasses.replace(
            job, state=t.new_state, attempt=attempt_no, infra_retries=retries, not_before=not_before,
            update_time=now, end_time=end_time, reason=t.reason, message=t.message, revision=rev,
        )

    # -- outbox ----------------------------------------------------------------------------------

    async def pending_orders(self, cluster: str, *, after: int = 0, limit: int = 1000) -> list[DispatchOrder]:
        def op(c: sqlite3.Connection) -> list[DispatchOrder]:
            rows = c.execute(
                "SELECT * FROM orders WHERE cluster=? AND delivered_at IS NULL AND order_id > ?"
                " ORDER BY order_id LIMIT ?", (cluster, after, limit),
            ).fetchall()
            return [codec.order_from_row(r) for r in rows]

        return await self._read(op)

    async def ack_orders(self, cluster: str, order_ids: Sequence[int]) -> int:
        ids = list(order_ids)

        def op(c: sqlite3.Connection) -> int:
            now = self._clock()
            n = 0
            for i in ids:
                n += c.execute(
                    "UPDATE orders SET delivered_at=? WHERE order_id=? AND cluster=? AND delivered_at IS NULL",
                    (now, i, cluster),
                ).rowcount
            return n

        return await self._write(op)

    # -- watch & retention -----------------------------------------------------------------------

    @staticmethod
    def _meta_int(c: sqlite3.Connection, key: str) -> int:
        row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def _revision(c: sqlite3.Connection) -> int:
        row = c.execute("SELECT seq FROM sqlite_sequence WHERE name='events'").fetchone()
        return 0 if row is None else int(row[0])

    async def current_revision(self) -> int:
        return await self._read(self._revision)

    async def compacted_revision(self) -> int:
        return await self._read(lambda c: self._meta_int(c, "compacted_revision"))

    async def watch_events(
        self, from_revision: int, *, limit: int = 0, tenant: str | None = None, job_set: str | None = None
    ) -> list[WatchEvent]:
        n = min(limit if limit > 0 else self._opts.max_watch_batch, self._opts.max_watch_batch)
        where: list[str] = ["revision > ?"]
        args: list[object] = [from_revision]
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        if job_set is not None:
            where.append("job_set = ?")
            args.append(job_set)
        sql = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY revision LIMIT ?"
        args.append(n)

        def op(c: sqlite3.Connection) -> list[WatchEvent]:
            compacted = self._meta_int(c, "compacted_revision")
            if from_revision < compacted:
                raise RevisionCompacted(
                    f"revision {from_revision} was compacted (compacted up to {compacted}); list again, then watch",
                    compacted_revision=compacted,
                )
            return [codec.event_from_row(r) for r in c.execute(sql, args).fetchall()]

        return await self._read(op)

    async def wait_for_revision(self, after: int, timeout_s: float) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            signal = self._commit_signal  # taken before reading, so a commit in between still wakes us
            rev = await self.current_revision()
            remaining = deadline - loop.time()
            if rev > after or remaining <= 0 or signal is None:
                return rev
            try:
                await asyncio.wait_for(asyncio.shield(signal), remaining)
            except TimeoutError:
                return await self.current_revision()

    async def compact(self, *, finished_before: float, limit: int = 10_000) -> CompactionResult:
        def op(c: sqlite3.Connection) -> CompactionResult:
            ids = [r[0] for r in c.execute(
                f"SELECT job_id FROM jobs WHERE state IN ({_TERMINAL_SQL}) AND end_time < ? ORDER BY end_time LIMIT ?",
                (finished_before, limit),
            ).fetchall()]
            compacted = self._meta_int(c, "compacted_revision")
            events = 0
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                marks = ",".join("?" * len(chunk))
                top = c.execute(f"SELECT MAX(revision) FROM events WHERE job_id IN ({marks})", chunk).fetchone()[0]
                compacted = max(compacted, int(top or 0))
                events += c.execute(f"DELETE FROM events WHERE job_id IN ({marks})", chunk).rowcount
                c.execute(f"DELETE FROM orders WHERE job_id IN ({marks})", chunk)
                c.execute(f"DELETE FROM attempts WHERE job_id IN ({marks})", chunk)
                c.execute(f"DELETE FROM jobs WHERE job_id IN ({marks})", chunk)
            c.execute(
                "INSERT INTO meta (key, value) VALUES ('compacted_revision', ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value", (compacted,),
            )
            return CompactionResult(deleted_jobs=len(ids), deleted_events=events, compacted_revision=compacted)

        return await self._write(op)
