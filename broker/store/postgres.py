"""PostgreSQL implementation of ``Store`` (asyncpg) for HA: the Store operations on the leader's connections.

Same contract and test suite as the SQLite store. Leadership (one leader per
database by advisory lock), the group-committing writer and the readers are
``pg_leader.PgLeader``'s; the write-side statements are ``pg_sql``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.domain import job_events, lifecycle, records
from broker.domain.errors import StoreUnavailable
from broker.store import codec, pg_sql, writes
from broker.store.pg_leader import Conn, PgLeader
from broker.store.updates import Decide

__all__ = ["PostgresStore"]


class PostgresStore(PgLeader):
    """``dsn`` as asyncpg takes it, e.g. ``postgresql://tandem@/tandem?host=/run/postgresql``."""

    # -- submission ------------------------------------------------------------------------------

    async def submit(self, job: records.NewJob) -> records.SubmitResult:
        async def op(c: Conn) -> records.SubmitResult:
            return await pg_sql.submit_job(c, job, id_gen=self._id_gen, now=self._clock())

        result: records.SubmitResult = await self._write(op, savepoint=False)
        return result

    # -- reads -----------------------------------------------------------------------------------

    async def get_job(self, job_id: str, *, tenant: str | None = None) -> records.JobRecord:
        job: records.JobRecord = await self._read(lambda c: pg_sql.load_job(c, job_id, tenant))
        return job

    async def list_attempts(self, job_id: str) -> list[records.AttemptRecord]:
        async def op(c: Conn) -> list[records.AttemptRecord]:
            rows = await c.fetch("SELECT * FROM attempts WHERE job_id=$1 ORDER BY number", job_id)
            replicas = await c.fetch("SELECT * FROM replicas WHERE job_id=$1", job_id)
            return codec.with_replicas([codec.attempt_from_row(r) for r in rows], replicas)

        result: list[records.AttemptRecord] = await self._read(op)
        return result

    async def job_history(self, job_id: str) -> list[records.WatchEvent]:
        async def op(c: Conn) -> list[records.WatchEvent]:
            rows = await c.fetch("SELECT * FROM events WHERE job_id=$1 ORDER BY revision", job_id)
            return [codec.event_from_row(r) for r in rows]

        result: list[records.WatchEvent] = await self._read(op)
        return result

    async def _jobs_after(self, flt: records.JobFilter, after_seq: int, limit: int) -> list[records.JobRecord]:
        where: list[str] = ["seq > $1"]
        args: list[object] = [after_seq]

        def arg(v: object) -> str:
            args.append(v)
            return f"${len(args)}"

        if flt.tenant is not None:
            where.append(f"tenant = {arg(flt.tenant)}")
        if flt.states:
            where.append(f"state = ANY({arg(sorted(s.value for s in flt.states))}::text[])")
        if flt.queue is not None:
            where.append(f"queue = {arg(flt.queue)}")
        if flt.job_set is not None:
            where.append(f"job_set = {arg(flt.job_set)}")
        if flt.labels:
            where.append(f"labels @> {arg(codec.dumps(dict(flt.labels)))}::jsonb")
        if flt.cluster is not None:
            where.append(
                "EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.job_id AND a.number = jobs.attempt"
                f" AND a.cluster = {arg(flt.cluster)})"
            )
        if flt.gpu_model is not None:
            # gpu_models is JSON text (a list of strings): jsonb ? tests membership of a top-level string element
            model = arg(flt.gpu_model)
            where.append(
                "(EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.job_id AND a.number = jobs.attempt"
                f" AND a.gpu_model = {model}) OR jobs.gpu_models::jsonb ? {model})"
            )
        query = f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq LIMIT {arg(limit)}"

        async def op(c: Conn) -> list[records.JobRecord]:
            return [codec.job_from_row(r) for r in await c.fetch(query, *args)]

        jobs: list[records.JobRecord] = await self._read(op)
        return jobs

    async def active_jobs(self) -> list[records.JobRecord]:
        async def op(c: Conn) -> list[records.JobRecord]:
            rows = await c.fetch("SELECT * FROM jobs WHERE state = ANY($1::text[]) ORDER BY seq", pg_sql.ACTIVE_STATES)
            return [codec.job_from_row(r) for r in rows]

        result: list[records.JobRecord] = await self._read(op)
        return result

    _OPEN_ATTEMPTS = (
        "SELECT a.* FROM attempts a JOIN jobs j ON j.job_id = a.job_id AND j.attempt = a.number"
        " WHERE a.outcome IS NULL AND j.state = ANY($1::text[]) ORDER BY j.seq"
    )

    async def active_attempts(self) -> list[records.AttemptRecord]:
        async def op(c: Conn) -> list[records.AttemptRecord]:
            return [codec.attempt_from_row(r) for r in await c.fetch(self._OPEN_ATTEMPTS, pg_sql.ACTIVE_STATES)]

        result: list[records.AttemptRecord] = await self._read(op)
        return result

    # -- state changes ---------------------------------------------------------------------------

    async def transition(self, t: records.Transition) -> records.JobRecord:
        async def op(c: Conn) -> records.JobRecord:
            return await pg_sql.apply_transition(c, await pg_sql.load_job(c, t.job_id), t, self._clock())

        result: records.JobRecord = await self._write(op)
        return result

    async def apply_event(self, event: job_events.Event) -> tuple[records.JobRecord, lifecycle.Reaction]:
        async def op(c: Conn) -> tuple[records.JobRecord, lifecycle.Reaction]:
            return await self._react(c, await pg_sql.load_job(c, event.job_id), event)

        result: tuple[records.JobRecord, lifecycle.Reaction] = await self._write(op)
        return result

    async def _react(
        self, c: Conn, job: records.JobRecord, event: job_events.Event
    ) -> tuple[records.JobRecord, lifecycle.Reaction]:
        """React to the event and apply its transition, if any: the job as it now is, and the reaction."""
        now = self._clock()
        reaction = writes.react(job, await pg_sql.current_attempt(c, job), event, self._opts.retry, now)
        if reaction.transition is None:
            return job, reaction
        return await pg_sql.apply_transition(c, job, reaction.transition, now), reaction

    async def cancel_job(
        self, job_id: str, *, tenant: str | None, actor: str, message: str = "", grace_s: float = 30.0
    ) -> records.JobRecord:
        async def op(c: Conn) -> records.JobRecord:
            job = await pg_sql.load_job(c, job_id, tenant)
            return (await self._react(c, job, writes.cancel_request(job, actor, message, grace_s)))[0]

        result: records.JobRecord = await self._write(op)
        return result

    async def cancel_job_set(
        self, tenant: str, job_set: str, *, actor: str, message: str = "", grace_s: float = 30.0
    ) -> list[records.JobRecord]:
        async def op(c: Conn) -> list[records.JobRecord]:
            rows = await c.fetch(
                "SELECT * FROM jobs WHERE tenant=$1 AND job_set=$2 AND state = ANY($3::text[]) ORDER BY seq",
                tenant,
                job_set,
                pg_sql.ACTIVE_STATES,
            )
            changed = []
            for job in map(codec.job_from_row, rows):
                after, reaction = await self._react(c, job, writes.cancel_request(job, actor, message, grace_s))
                if reaction.transition is not None:
                    changed.append(after)
            return changed

        result: list[records.JobRecord] = await self._write(op)
        return result

    # -- scheduling settings ---------------------------------------------------------------------

    async def _update_job(
        self, job_id: str, tenant: str | None, actor: str, decide: Decide
    ) -> tuple[records.JobRecord, bool]:
        async def op(c: Conn) -> tuple[records.JobRecord, bool]:
            job = await pg_sql.load_job(c, job_id, tenant)
            u = decide(job)
            if u is None:
                return job, False
            return await pg_sql.write_update(c, job, u, actor, self._clock()), True

        result: tuple[records.JobRecord, bool] = await self._write(op)
        return result

    async def gpu_hours(
        self, *, since: float, until: float, now: float, tenant: str | None = None
    ) -> list[records.GpuHours]:
        rows: list[records.GpuHours] = await self._read(lambda c: pg_sql.gpu_hours(c, since, until, now, tenant))
        return sorted(rows, key=lambda r: (r.tenant, r.gpu_model, r.cluster))

    # -- outbox ----------------------------------------------------------------------------------

    async def pending_orders(self, cluster: str, *, after: int = 0, limit: int = 1000) -> list[records.DispatchOrder]:
        async def op(c: Conn) -> list[records.DispatchOrder]:
            rows = await c.fetch(
                "SELECT * FROM orders WHERE cluster=$1 AND delivered_at IS NULL AND order_id > $2"
                " ORDER BY order_id LIMIT $3",
                cluster,
                after,
                limit,
            )
            return [codec.order_from_row(r) for r in rows]

        result: list[records.DispatchOrder] = await self._read(op)
        return result

    async def ack_orders(self, cluster: str, order_ids: Sequence[int]) -> int:
        ids = list(order_ids)

        async def op(c: Conn) -> int:
            status = await c.execute(
                "UPDATE orders SET delivered_at=$1 WHERE order_id = ANY($2::bigint[]) AND cluster=$3"
                " AND delivered_at IS NULL",
                self._clock(),
                ids,
                cluster,
            )
            return int(status.split()[-1])

        result: int = await self._write(op)
        return result

    # -- observed status and cluster state -------------------------------------------------------

    async def record_workload(
        self, job_id: str, attempt: int, replicas: Sequence[records.ReplicaRecord], rendezvous: str = ""
    ) -> bool:
        async def op(c: Conn) -> bool:
            if await c.fetchval("SELECT 1 FROM attempts WHERE job_id=$1 AND number=$2", job_id, attempt) is None:
                return False
            await c.execute("DELETE FROM replicas WHERE job_id=$1 AND attempt=$2", job_id, attempt)
            if replicas:
                await c.executemany(
                    "INSERT INTO replicas (job_id, attempt, pod_set, idx, pod, node, phase, exit_code, reason,"
                    " message, update_time) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)",
                    writes.replica_values(job_id, attempt, replicas, self._clock()),
                )
            if rendezvous:
                await c.execute(
                    "UPDATE attempts SET rendezvous=$1 WHERE job_id=$2 AND number=$3", rendezvous, job_id, attempt
                )
            return True

        result: bool = await self._write(op)
        return result

    async def record_feedback(self, job_id: str, attempt: int, feedback: str, at: float) -> bool:
        async def op(c: Conn) -> bool:
            status = await c.execute(
                "UPDATE attempts SET feedback=$1, feedback_time=$2 WHERE job_id=$3 AND number=$4",
                feedback,
                at,
                job_id,
                attempt,
            )
            return int(status.split()[-1]) > 0

        result: bool = await self._write(op)
        return result

    async def set_cordon(self, cluster: str, reason: str | None, *, actor: str) -> None:
        async def op(c: Conn) -> None:
            if reason is None:
                await c.execute("DELETE FROM cordons WHERE cluster=$1", cluster)
            else:
                await c.execute(
                    "INSERT INTO cordons (cluster, reason, actor, time) VALUES ($1,$2,$3,$4)"
                    " ON CONFLICT (cluster) DO UPDATE SET reason=EXCLUDED.reason, actor=EXCLUDED.actor,"
                    " time=EXCLUDED.time",
                    cluster,
                    reason,
                    actor,
                    self._clock(),
                )

        await self._write(op)

    async def cordons(self) -> dict[str, str]:
        async def op(c: Conn) -> dict[str, str]:
            return {r["cluster"]: r["reason"] for r in await c.fetch("SELECT * FROM cordons")}

        result: dict[str, str] = await self._read(op)
        return result

    # -- watch & retention -----------------------------------------------------------------------

    async def current_revision(self) -> int:
        if self._task is None:
            raise StoreUnavailable("store is not open")
        return self._commits.revision

    async def compacted_revision(self) -> int:
        result: int = await self._read(lambda c: pg_sql.meta_int(c, "compacted_revision"))
        return result

    async def _events_after(
        self, from_revision: int, limit: int, tenant: str | None, job_set: str | None
    ) -> tuple[int, list[records.WatchEvent], int]:
        # only committed revisions: a reader never looks past what the writer has published
        upto = self._commits.revision
        query = (
            "SELECT * FROM events WHERE revision > $1 AND revision <= $2"
            " AND ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR job_set = $4)"
            " ORDER BY revision LIMIT $5"
        )

        async def op(c: Conn) -> tuple[int, list[records.WatchEvent], int]:
            events = [
                codec.event_from_row(r) for r in await c.fetch(query, from_revision, upto, tenant, job_set, limit)
            ]
            return await pg_sql.meta_int(c, "compacted_revision"), events, upto

        result: tuple[int, list[records.WatchEvent], int] = await self._read(op)
        return result

    async def compact(self, *, finished_before: float, limit: int = 10_000) -> records.CompactionResult:
        result: records.CompactionResult = await self._write(lambda c: pg_sql.compact_jobs(c, finished_before, limit))
        return result
