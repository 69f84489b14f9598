"""SQLite implementation of ``Store``: WAL + synchronous=FULL, the Store operations on one writer and one reader thread.

The threads (the writer's group commit, the reader's snapshots, the commit
signal) are ``sqlite_threads.SqliteThreads``'s; the write-side statements are
``sql``'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from broker.domain import job_events, lifecycle, records
from broker.domain.errors import StoreUnavailable
from broker.store import codec, sql, writes
from broker.store.base import Delivery
from broker.store.sqlite_threads import SqliteThreads
from broker.store.updates import Decide

__all__ = ["SqliteStore"]


class SqliteStore(SqliteThreads):
    """The embedded default store. ``path=":memory:"`` for tests (then reads also go through the writer)."""

    # -- submission ------------------------------------------------------------------------------

    async def submit(self, job: records.NewJob) -> records.SubmitResult:
        # submit_job raises its TandemErrors (key conflict, duplicate id) before it writes anything
        return await self._write(lambda c: self._submit(c, job), savepoint=False)

    def _submit(self, c: sqlite3.Connection, new: records.NewJob) -> records.SubmitResult:
        return sql.submit_job(c, new, id_gen=self._id_gen, now=self._clock())

    # -- reads -----------------------------------------------------------------------------------

    async def get_job(self, job_id: str, *, tenant: str | None = None) -> records.JobRecord:
        return await self._read(lambda c: sql.load_job(c, job_id, tenant))

    async def list_attempts(self, job_id: str) -> list[records.AttemptRecord]:
        def op(c: sqlite3.Connection) -> list[records.AttemptRecord]:
            rows = c.execute("SELECT * FROM attempts WHERE job_id=? ORDER BY number", (job_id,)).fetchall()
            replicas = c.execute("SELECT * FROM replicas WHERE job_id=?", (job_id,)).fetchall()
            return codec.with_replicas([codec.attempt_from_row(r) for r in rows], replicas)

        return await self._read(op)

    async def job_history(self, job_id: str) -> list[records.WatchEvent]:
        def op(c: sqlite3.Connection) -> list[records.WatchEvent]:
            rows = c.execute("SELECT * FROM events WHERE job_id=? ORDER BY revision", (job_id,)).fetchall()
            return [codec.event_from_row(r) for r in rows]

        return await self._read(op)

    async def _jobs_after(self, flt: records.JobFilter, after_seq: int, limit: int) -> list[records.JobRecord]:
        where: list[str] = ["seq > ?"]
        args: list[object] = [after_seq]
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
        if flt.cluster is not None:
            where.append(
                "EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.job_id AND a.number = jobs.attempt"
                " AND a.cluster = ?)"
            )
            args.append(flt.cluster)
        if flt.gpu_model is not None:
            where.append(
                "(EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.job_id AND a.number = jobs.attempt"
                " AND a.gpu_model = ?)"
                " OR EXISTS (SELECT 1 FROM json_each(jobs.gpu_models) m WHERE m.value = ?))"
            )
            args.extend((flt.gpu_model, flt.gpu_model))
        query = f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        args.append(limit)

        def op(c: sqlite3.Connection) -> list[records.JobRecord]:
            return [codec.job_from_row(r) for r in c.execute(query, args).fetchall()]

        return await self._read(op)

    async def active_jobs(self) -> list[records.JobRecord]:
        def op(c: sqlite3.Connection) -> list[records.JobRecord]:
            rows = c.execute(f"SELECT * FROM jobs WHERE state IN ({sql.ACTIVE_SQL}) ORDER BY seq").fetchall()
            return [codec.job_from_row(r) for r in rows]

        return await self._read(op)

    async def active_attempts(self) -> list[records.AttemptRecord]:
        def op(c: sqlite3.Connection) -> list[records.AttemptRecord]:
            rows = c.execute(
                "SELECT a.* FROM attempts a JOIN jobs j ON j.job_id = a.job_id AND j.attempt = a.number"
                f" WHERE a.outcome IS NULL AND j.state IN ({sql.ACTIVE_SQL}) ORDER BY j.seq"
            ).fetchall()
            return [codec.attempt_from_row(r) for r in rows]

        return await self._read(op)

    async def active_runs(self) -> list[tuple[records.JobRecord, records.AttemptRecord]]:
        def op(c: sqlite3.Connection) -> list[tuple[records.JobRecord, records.AttemptRecord]]:
            attempts = [
                codec.attempt_from_row(r)
                for r in c.execute(
                    "SELECT a.* FROM attempts a JOIN jobs j ON j.job_id = a.job_id AND j.attempt = a.number"
                    f" WHERE a.outcome IS NULL AND j.state IN ({sql.ACTIVE_SQL}) ORDER BY j.seq"
                )
            ]
            jobs: dict[str, records.JobRecord] = {}
            ids = [a.job_id for a in attempts]
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                for r in c.execute(f"SELECT * FROM jobs WHERE job_id IN ({','.join('?' * len(chunk))})", chunk):
                    jobs[r["job_id"]] = codec.job_from_row(r)
            return [(jobs[a.job_id], a) for a in attempts if a.job_id in jobs]

        return await self._read(op)

    # -- state changes ---------------------------------------------------------------------------

    async def transition(self, t: records.Transition) -> records.JobRecord:
        return await self._write(lambda c: sql.apply_transition(c, sql.load_job(c, t.job_id), t, self._clock()))

    async def apply_event(self, event: job_events.Event) -> tuple[records.JobRecord, lifecycle.Reaction]:
        return await self._write(lambda c: self._react(c, sql.load_job(c, event.job_id), event))

    def _react(
        self, c: sqlite3.Connection, job: records.JobRecord, event: job_events.Event
    ) -> tuple[records.JobRecord, lifecycle.Reaction]:
        """React to the event and apply its transition, if any: the job as it now is, and the reaction."""
        now = self._clock()
        reaction = writes.react(job, sql.current_attempt(c, job), event, self._opts.retry, now)
        if reaction.transition is None:
            return job, reaction
        return sql.apply_transition(c, job, reaction.transition, now), reaction

    async def cancel_job(
        self, job_id: str, *, tenant: str | None, actor: str, message: str = "", grace_s: float = 30.0
    ) -> records.JobRecord:
        def op(c: sqlite3.Connection) -> records.JobRecord:
            job = sql.load_job(c, job_id, tenant)
            return self._react(c, job, writes.cancel_request(job, actor, message, grace_s))[0]

        return await self._write(op)

    async def cancel_job_set(
        self, tenant: str, job_set: str, *, actor: str, message: str = "", grace_s: float = 30.0
    ) -> list[records.JobRecord]:
        def op(c: sqlite3.Connection) -> list[records.JobRecord]:
            rows = c.execute(
                f"SELECT * FROM jobs WHERE tenant=? AND job_set=? AND state IN ({sql.ACTIVE_SQL}) ORDER BY seq",
                (tenant, job_set),
            ).fetchall()
            changed = []
            for job in map(codec.job_from_row, rows):
                after, reaction = self._react(c, job, writes.cancel_request(job, actor, message, grace_s))
                if reaction.transition is not None:
                    changed.append(after)
            return changed

        return await self._write(op)

    async def _update_job(
        self, job_id: str, tenant: str | None, actor: str, decide: Decide
    ) -> tuple[records.JobRecord, bool]:
        def op(c: sqlite3.Connection) -> tuple[records.JobRecord, bool]:
            job = sql.load_job(c, job_id, tenant)
            u = decide(job)
            return (job, False) if u is None else (sql.write_update(c, job, u, actor, self._clock()), True)

        return await self._write(op)

    async def gpu_hours(
        self, *, since: float, until: float, now: float, tenant: str | None = None
    ) -> list[records.GpuHours]:
        rows = await self._read(lambda c: sql.gpu_hours(c, since, until, now, tenant))
        return sorted(rows, key=lambda r: (r.tenant, r.gpu_model, r.cluster))

    # -- outbox ----------------------------------------------------------------------------------

    async def pending_orders(self, cluster: str, *, after: int = 0, limit: int = 1000) -> list[records.DispatchOrder]:
        def op(c: sqlite3.Connection) -> list[records.DispatchOrder]:
            rows = c.execute(
                "SELECT * FROM orders WHERE cluster=? AND delivered_at IS NULL AND order_id > ?"
                " ORDER BY order_id LIMIT ?",
                (cluster, after, limit),
            ).fetchall()
            return [codec.order_from_row(r) for r in rows]

        return await self._read(op)

    async def pending_deliveries(self, cluster: str, *, limit: int = 1000) -> list[Delivery]:
        def op(c: sqlite3.Connection) -> list[Delivery]:
            orders = [
                codec.order_from_row(r)
                for r in c.execute(
                    "SELECT * FROM orders WHERE cluster=? AND delivered_at IS NULL ORDER BY order_id LIMIT ?",
                    (cluster, limit),
                ).fetchall()
            ]
            if not orders:
                return []
            ids = sorted({o.job_id for o in orders})
            jobs: dict[str, records.JobRecord] = {}
            attempts: dict[tuple[str, int], records.AttemptRecord] = {}
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for r in c.execute(f"SELECT * FROM jobs WHERE job_id IN ({marks})", chunk):
                    jobs[r["job_id"]] = codec.job_from_row(r)
                for r in c.execute(f"SELECT * FROM attempts WHERE job_id IN ({marks})", chunk):
                    attempts[(r["job_id"], r["number"])] = codec.attempt_from_row(r)
            return [Delivery(o, jobs.get(o.job_id), attempts.get((o.job_id, o.attempt))) for o in orders]

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

    # -- observed status and cluster state -------------------------------------------------------

    async def record_workload(
        self, job_id: str, attempt: int, replicas: Sequence[records.ReplicaRecord], rendezvous: str = ""
    ) -> bool:
        def op(c: sqlite3.Connection) -> bool:
            if c.execute("SELECT 1 FROM attempts WHERE job_id=? AND number=?", (job_id, attempt)).fetchone() is None:
                return False
            c.execute("DELETE FROM replicas WHERE job_id=? AND attempt=?", (job_id, attempt))
            c.executemany(
                "INSERT INTO replicas (job_id, attempt, pod_set, idx, pod, node, phase, exit_code, reason, message,"
                " update_time) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                writes.replica_values(job_id, attempt, replicas, self._clock()),
            )
            if rendezvous:
                c.execute("UPDATE attempts SET rendezvous=? WHERE job_id=? AND number=?", (rendezvous, job_id, attempt))
            return True

        return await self._write(op)

    async def record_feedback(self, job_id: str, attempt: int, feedback: str, at: float) -> bool:
        def op(c: sqlite3.Connection) -> bool:
            return (
                c.execute(
                    "UPDATE attempts SET feedback=?, feedback_time=? WHERE job_id=? AND number=?",
                    (feedback, at, job_id, attempt),
                ).rowcount
                > 0
            )

        return await self._write(op)

    async def set_cordon(self, cluster: str, reason: str | None, *, actor: str) -> None:
        def op(c: sqlite3.Connection) -> None:
            if reason is None:
                c.execute("DELETE FROM cordons WHERE cluster=?", (cluster,))
            else:
                c.execute(
                    "INSERT INTO cordons (cluster, reason, actor, time) VALUES (?,?,?,?) ON CONFLICT(cluster)"
                    " DO UPDATE SET reason=excluded.reason, actor=excluded.actor, time=excluded.time",
                    (cluster, reason, actor, self._clock()),
                )

        await self._write(op)

    async def cordons(self) -> dict[str, str]:
        return await self._read(lambda c: {r["cluster"]: r["reason"] for r in c.execute("SELECT * FROM cordons")})

    # -- watch & retention -----------------------------------------------------------------------

    async def current_revision(self) -> int:
        if self._writer is None:
            raise StoreUnavailable("store is not open")
        return self._commits.revision

    async def compacted_revision(self) -> int:
        return await self._read(lambda c: sql.meta_int(c, "compacted_revision"))

    async def _events_after(
        self, from_revision: int, limit: int, tenant: str | None, job_set: str | None
    ) -> tuple[int, list[records.WatchEvent], int]:
        where: list[str] = ["revision > ?"]
        args: list[object] = [from_revision]
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        if job_set is not None:
            where.append("job_set = ?")
            args.append(job_set)
        query = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY revision LIMIT ?"
        args.append(limit)

        def op(c: sqlite3.Connection) -> tuple[int, list[records.WatchEvent], int]:
            events = [codec.event_from_row(r) for r in c.execute(query, args).fetchall()]
            return sql.meta_int(c, "compacted_revision"), events, sql.revision(c)

        return await self._read(op)

    async def compact(self, *, finished_before: float, limit: int = 10_000) -> records.CompactionResult:
        return await self._write(lambda c: sql.compact_jobs(c, finished_before, limit))
