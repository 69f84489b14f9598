"""The PostgreSQL store's leadership and connections: the advisory lock, the group-committing writer, the readers.

The leader's single writer connection assigns every revision, so sequence order
is commit order. Standby brokers fail ``open()`` with StoreUnavailable until the
leader's lock is free (call it again to take over). ``postgres.PostgresStore``
adds the Store operations on top of these connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from broker.domain.errors import BatchFailed, Internal, StoreUnavailable, TandemError
from broker.store import codec, pg_sql
from broker.store.base import Clock, IdGen, StoreOptions
from broker.store.commit import CommitStats
from broker.store.sql_store import SqlStore

__all__ = ["LEADER_LOCK", "Conn", "PgLeader"]

Conn = Any
Op = Callable[[Conn], Awaitable[Any]]
log = logging.getLogger(__name__)

LEADER_LOCK = 0x74616E64656D  # "tandem": the advisory lock the leader holds on its writer connection


@dataclass(slots=True)
class _Request:
    op: Op
    future: asyncio.Future[Any]
    savepoint: bool


class PgLeader(SqlStore):
    """The connections a ``PostgresStore`` runs on: ``_write`` (group commit on the leader's connection) and
    ``_read`` (a read-only snapshot from the pool); the Store operations are the subclass's."""

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock = time.time,
        id_gen: IdGen | None = None,
        options: StoreOptions = StoreOptions(),
        readers: int = 4,
    ) -> None:
        super().__init__(clock=clock, id_gen=id_gen, options=options)
        self._dsn = dsn
        self._readers = readers
        self._conn: Conn = None
        self._pool: Any = None
        self._queue: asyncio.Queue[_Request | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._broken: BaseException | None = None
        self.stats = CommitStats()
        self.fault: Callable[[int], BaseException | None] | None = None
        """Test hook: called with the batch size before COMMIT; an exception it returns fails the batch."""

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._task is not None:
            return
        import asyncpg  # type: ignore[import-untyped]  # the optional driver only this backend needs

        conn = await asyncpg.connect(self._dsn)
        try:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK):
                raise StoreUnavailable("another broker is the leader of this database")
            self.schema_version = await pg_sql.migrate(conn, self._clock())
            secret = await conn.fetchval("SELECT value FROM meta WHERE key='page_secret'")
            if secret is None:
                secret = os.urandom(32)
                await conn.execute("INSERT INTO meta (key, value) VALUES ('page_secret', $1)", secret)
            revision = await pg_sql.revision(conn)
            self._pool = await asyncpg.create_pool(self._dsn, min_size=1, max_size=self._readers)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._tokens = codec.PageTokens(bytes(secret))
        self.store_id = codec.store_id(bytes(secret))
        self._queue = asyncio.Queue()
        self._commits.arm(asyncio.get_running_loop(), revision)
        self._task = asyncio.create_task(self._writer(), name="tandem-store-writer")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        await self._queue.put(None)
        await task
        await self._pool.close()
        await self._conn.close()  # releases the leader lock

    # -- group commit ----------------------------------------------------------------------------

    async def _write(self, op: Op, *, savepoint: bool = True) -> Any:
        if self._task is None:
            raise StoreUnavailable("store is not open")
        if self._broken is not None:
            # the writer connection (and with it the leader lock) is gone: another broker may lead now
            raise StoreUnavailable("lost the database connection and leadership; restart the broker") from self._broken
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Request(op, fut, savepoint))
        return await fut

    async def _writer(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                break
            batch = [first]
            stop = False
            while len(batch) < self._opts.max_batch and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            await self._run_batch(batch)
            if stop:
                break
        while not self._queue.empty():
            req = self._queue.get_nowait()
            if req is not None and not req.future.done():
                req.future.set_exception(StoreUnavailable("store is closed"))

    async def _run_batch(self, batch: list[_Request]) -> None:
        c = self._conn
        results: list[tuple[Any, BaseException | None]] = []
        try:
            tx = c.transaction()
            await tx.start()
            try:
                for req in batch:
                    results.append(await self._run_one(c, req))
                injected = self.fault(len(batch)) if self.fault is not None else None
                if injected is not None:
                    raise injected
            except BaseException:
                await tx.rollback()
                raise
            await tx.commit()
        except Exception as e:  # every member learns of it
            self.stats.failed_batches += 1
            log.error("store batch failed", extra={"batch_size": len(batch), "error": repr(e)})
            if c.is_closed():
                self._broken = e
            for req in batch:
                if not req.future.done():
                    failed = BatchFailed("the store could not commit this request; retry it")
                    failed.__cause__ = e
                    req.future.set_exception(failed)
            return
        self.stats.record(len(batch))
        self._commits.publish(await pg_sql.revision(c))
        for req, (value, error) in zip(batch, results):
            if req.future.done():
                continue
            if error is not None:
                req.future.set_exception(error)
            else:
                req.future.set_result(value)

    async def _run_one(self, c: Conn, req: _Request) -> tuple[Any, BaseException | None]:
        import asyncpg

        if not req.savepoint:
            try:
                return await req.op(c), None
            except TandemError as e:
                return None, e  # raised before any write, by the caller's promise
        sp = c.transaction()  # nested: a SAVEPOINT
        await sp.start()
        try:
            value = await req.op(c)
        except TandemError as e:
            await sp.rollback()
            return None, e
        except asyncpg.IntegrityConstraintViolationError as e:
            await sp.rollback()
            err = Internal("store constraint violated")
            err.__cause__ = e
            return None, err
        except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError):
            raise
        except Exception as e:
            await sp.rollback()
            err = Internal(f"store request failed: {type(e).__name__}")
            err.__cause__ = e
            return None, err
        await sp.commit()
        return value, None

    async def _read(self, op: Op) -> Any:
        if self._pool is None or self._task is None:
            raise StoreUnavailable("store is not open")
        async with self._pool.acquire() as c:
            async with c.transaction(isolation="repeatable_read", readonly=True):
                return await op(c)
