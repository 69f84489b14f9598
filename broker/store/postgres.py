"""PostgreSQL implementation of ``Store`` (asyncpg) for HA: the Store operations on the leader's connections.

Same contract and test suite as the SQLite store. Leadership (one leader per
database by advisory lock), the group-committing writer and the readers are
``pg_leader.PgLeader``'s; the write-side statements are ``pg_sql``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from broker.domain import job_events, lifecycle
from broker.domain.errors import JobFinished, RevisionCompacted, StoreUnavailable
from broker.domain.records import (
    AttemptRecord,
    CompactionResult,
    DispatchOrder,
    GpuHours,
    JobFilter,
    JobPage,
    JobRecord,
    NewJob,
    ReplicaRecord,
    SubmitResult,
    Transition,
    WatchEvent,
    WatchPage,
)
from broker.domain.states import JobState
from broker.store import codec, pg_sql, updates
from broker.store.pg_leader import Conn, PgLeader

__all__ = ["PostgresStore"]


class PostgresStore(PgLeader):
    """``dsn`` as asyncpg takes it, e.g. ``postgresql://tandem@/tandem?host=/run/postgresql``."""

    # -- submission ------------------------------------------------------------------------------

    async def submit(self, job: NewJob) -> SubmitResult:
        async def op(c: Conn) -> SubmitResult:
            return await pg_sql.submit_job(c, job, id_gen=self._id_gen, now=self._clock())

        result: SubmitResult = await self._write(op, savepoint=False)
        return result

    # -- reads -----------------------------------------------------------------------------------

    async def get_job(self, job_id: str, *, tenant: str | None = None) -> JobRecord:
        job: JobRecord = await self._read(lambda c: pg_sql.load_job(c, job_id, tenant))
        return job

    async def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        async def op(c: Conn) -> list[AttemptRecord]:
            rows = await c.fetch("SELECT * FROM attempts WHERE job_id=$1 ORDER BY number", job_id)
            replicas = await c.fetch("SELECT * FROM replicas WHERE job_id=$1", job_id)
            return codec.with_replicas([codec.attempt_from_row(r) for r in rows], replicas)

        result: list[AttemptRecord] = await self._read(op)
        return result

    async def job_history(self, job_id: str) -> list[WatchEvent]:
        async def op(c: Conn) -> list[WatchEvent]:
            rows = await c.fetch("SELECT * FROM events WHERE job_id=$1 ORDER BY revision", job_id)
            return [codec.event_from_row(r) for r in rows]

        result: list[WatchEvent] = await self._read(op)
        return result

    async def list_jobs(self, flt: JobFilter, *, page_size: int = 0, page_token: str = "") -> JobPage:
        if self._tokens is None:
            raise StoreUnavailable("store is not open")
        size = min(page_size if page_size > 0 else self._opts.default_page_size, self._opts.max_page_size)
        after = self._tokens.decode(page_token, flt) if page_token else 0
        where: list[str] = ["seq > $1"]
        args: list[object] = [after]

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
        query = f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq LIMIT {arg(size + 1)}"

        async def op(c: Conn) -> list[JobRecord]:
            return [codec.job_from_row(r) for r in await c.fetch(query, *args)]

        jobs: list[JobRecord] = await self._read(op)
        more = len(jobs) > size
        jobs = jobs[:size]
        token = self._tokens.encode(jobs[-1].seq, flt) if more and jobs else ""
        return JobPage(tuple(jobs), token)

    async def active_jobs(self) -> list[JobRecord]:
        async def op(c: Conn) -> list[JobRecord]:
            rows = await c.fetch("SELECT * FROM jobs WHERE state = ANY($1::text[]) ORDER BY seq", pg_sql.ACTIVE_STATES)
            return [codec.job_from_row(r) for r in rows]

        result: list[JobRecord] = await self._read(op)
        return result

    _OPEN_ATTEMPTS = (
        "SELECT a.* FROM attempts a JOIN jobs j ON j.job_id = a.job_id AND j.attempt = a.number"
        " WHERE a.outcome IS NULL AND j.state = ANY($1::text[]) ORDER BY j.seq"
    )

    async def active_attempts(self) -> list[AttemptRecord]:
        async def op(c: Conn) -> list[AttemptRecord]:
            return [codec.attempt_from_row(r) for r in await c.fetch(self._OPEN_ATTEMPTS, pg_sql.ACTIVE_STATES)]

        result: list[AttemptRecord] = await self._read(op)
        return result

    # -- state changes ---------------------------------------------------------------------------

    async def transition(self, t: Transition) -> JobRecord:
        async def op(c: Conn) -> JobRecord:
            return await pg_sql.apply_transition(c, await pg_sql.load_job(c, t.job_id), t, self._clock())

        result: JobRecord = await self._write(op)
        return result

    async def apply_event(self, event: job_events.Event) -> tuple[JobRecord, lifecycle.Reaction]:
        async def op(c: Conn) -> tuple[JobRecord, lifecycle.Reaction]:
            job = await pg_sql.load_job(c, event.job_id)
            refused = updates.refuse_held_reserve(job, event)
            if refused is not None:
                return job, refused
            now = self._clock()
            reaction = lifecycle.react(job, await pg_sql.current_attempt(c, job), event, self._opts.retry, now)
            if reaction.transition is None:
                return job, reaction
            return await pg_sql.apply_transition(c, job, reaction.transition, now), reaction

        result: tuple[JobRecord, lifecycle.Reaction] = await self._write(op)
        return result

    async def _cancel(self, c: Conn, job: JobRecord, actor: str, message: str, grace_s: float) -> JobRecord | None:
        ev = job_events.CancelRequested(job.job_id, actor=actor, message=message, grace_s=grace_s)
        now = self._clock()
        reaction = lifecycle.react(job, await pg_sql.current_attempt(c, job), ev, self._opts.retry, now)
        if reaction.transition is None:
            return None
        return await pg_sql.apply_transition(c, job, reaction.transition, now)

    async def cancel_job(
        self, job_id: str, *, tenant: str | None, actor: str, message: str = "", grace_s: float = 30.0
    ) -> JobRecord:
        async def op(c: Conn) -> JobRecord:
            job = await pg_sql.load_job(c, job_id, tenant)
            if job.state in (JobState.SUCCEEDED, JobState.FAILED):
                raise JobFinished(f"job {job_id} already {job.state.value}", job_id=job_id, state=job.state.value)
            return await self._cancel(c, job, actor, message, grace_s) or job

        result: JobRecord = await self._write(op)
        return result

    async def cancel_job_set(
        self, tenant: str, job_set: str, *, actor: str, message: str = "", grace_s: float = 30.0
    ) -> list[JobRecord]:
        async def op(c: Conn) -> list[JobRecord]:
            rows = await c.fetch(
                "SELECT * FROM jobs WHERE tenant=$1 AND job_set=$2 AND state = ANY($3::text[]) ORDER BY seq",
                tenant,
                job_set,
                pg_sql.ACTIVE_STATES,
            )
            changed = []
            for row in rows:
                done = await self._cancel(c, codec.job_from_row(row), actor, message, grace_s)
                if done is not None:
                    changed.append(done)
            return changed

        result: list[JobRecord] = await self._write(op)
        return result

    # -- scheduling settings ---------------------------------------------------------------------

    async def set_priority(
        self,
        job_id: str,
        *,
        tenant: str | None,
        actor: str,
        priority: int | None = None,
        band: str | None = None,
        message: str = "",
        respec: updates.Respec | None = None,
    ) -> JobRecord:
        async def op(c: Conn) -> JobRecord:
            job = await pg_sql.load_job(c, job_id, tenant)
            u = updates.decide_priority(job, priority, band, message, respec)
            return job if u is None else await pg_sql.write_update(c, job, u, actor, self._clock())

        result: JobRecord = await self._write(op)
        return result

    async def set_hold(
        self, job_id: str, *, held: bool, tenant: str | None, actor: str, message: str = ""
    ) -> tuple[JobRecord, bool]:
        async def op(c: Conn) -> tuple[JobRecord, bool]:
            job = await pg_sql.load_job(c, job_id, tenant)
            u = updates.decide_hold(job, held, tenant=tenant, actor=actor, message=message)
            if u is None:
                return job, False
            return await pg_sql.write_update(c, job, u, actor, self._clock()), True

        result: tuple[JobRecord, bool] = await self._write(op)
        return result

    async def gpu_hours(self, *, since: float, until: float, now: float, tenant: str | None = None) -> list[GpuHours]:
        rows: list[GpuHours] = await self._read(lambda c: pg_sql.gpu_hours(c, since, until, now, tenant))
        return sorted(rows, key=lambda r: (r.tenant, r.gpu_model, r.cluster))

    # -- outbox ----------------------------------------------------------------------------------

    async def pending_orders(self, cluster: str, *, after: int = 0, limit: int = 1000) -> list[DispatchOrder]:
        async def op(c: Conn) -> list[DispatchOrder]:
            rows = await c.fetch(
                "SELECT * FROM orders WHERE cluster=$1 AND delivered_at IS NULL AND order_id > $2"
                " ORDER BY order_id LIMIT $3",
                cluster,
                after,
                limit,
            )
            return [codec.order_from_row(r) for r in rows]

        result: list[DispatchOrder] = await self._read(op)
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
        self, job_id: str, attempt: int, replicas: Sequence[ReplicaRecord], rendezvous: str = ""
    ) -> bool:
        rows = [
            (job_id, attempt, r.pod_set, r.index, r.pod, r.node, r.phase, r.exit_code, r.reason, r.message)
            for r in replicas
        ]

        async def op(c: Conn) -> bool:
            if await c.fetchval("SELECT 1 FROM attempts WHERE job_id=$1 AND number=$2", job_id, attempt) is None:
                return False
            now = self._clock()
            await c.execute("DELETE FROM replicas WHERE job_id=$1 AND attempt=$2", job_id, attempt)
            if rows:
                await c.executemany(
                    "INSERT INTO replicas (job_id, attempt, pod_set, idx, pod, node, phase, exit_code, reason,"
                    " message, update_time) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)",
                    [r + (now,) for r in rows],
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
        return self._revision

    async def compacted_revision(self) -> int:
        result: int = await self._read(lambda c: pg_sql.meta_int(c, "compacted_revision"))
        return result

    async def watch_page(
        self, from_revision: int, *, limit: int = 0, tenant: str | None = None, job_set: str | None = None
    ) -> WatchPage:
        n = min(limit if limit > 0 else self._opts.max_watch_batch, self._opts.max_watch_batch)
        # only committed revisions: a reader never looks past what the writer has published
        upto = self._revision
        query = (
            "SELECT * FROM events WHERE revision > $1 AND revision <= $2"
            " AND ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR job_set = $4)"
            " ORDER BY revision LIMIT $5"
        )

        async def op(c: Conn) -> WatchPage:
            compacted = await pg_sql.meta_int(c, "compacted_revision")
            if from_revision < compacted:
                raise RevisionCompacted(
                    f"revision {from_revision} was compacted (compacted up to {compacted}); list again, then watch",
                    compacted_revision=compacted,
                )
            rows = await c.fetch(query, from_revision, upto, tenant, job_set, n)
            events = tuple(codec.event_from_row(r) for r in rows)
            covered = events[-1].revision if len(events) >= n else max(from_revision, upto)
            return WatchPage(events, covered)

        result: WatchPage = await self._read(op)
        return result

    async def wait_for_revision(self, after: int, timeout_s: float) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            signal = self._signal
            rev = await self.current_revision()
            remaining = deadline - loop.time()
            if rev > after or remaining <= 0 or signal is None:
                return rev
            try:
                await asyncio.wait_for(asyncio.shield(signal), remaining)
            except TimeoutError:
                return await self.current_revision()

    async def compact(self, *, finished_before: float, limit: int = 10_000) -> CompactionResult:
        result: CompactionResult = await self._write(lambda c: pg_sql.compact_jobs(c, finished_before, limit))
        return result
