"""The SQLite store's threads: the group-committing writer, the snapshot reader and the commit signal to the loop.

``sqlite.SqliteStore`` adds the Store operations on top of them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from broker.domain.errors import StoreUnavailable
from broker.store import codec, sql
from broker.store.base import Clock, IdGen, StoreOptions
from broker.store.commit import GroupCommitter
from broker.store.sql_store import SqlStore

__all__ = ["SqliteThreads"]

T = TypeVar("T")


class SqliteThreads(SqlStore):
    """The threads a ``SqliteStore`` runs on: ``_write`` (the writer's group commit, ``commit.GroupCommitter``)
    and ``_read`` (one snapshot on the reader thread); the Store operations are the subclass's."""

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        clock: Clock = time.time,
        id_gen: IdGen | None = None,
        options: StoreOptions = StoreOptions(),
    ) -> None:
        super().__init__(clock=clock, id_gen=id_gen, options=options)
        self._path = str(path)
        self._writer: GroupCommitter | None = None
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self._reader_conn: sqlite3.Connection | None = None

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
        secret: list[bytes] = []
        revision: list[int] = []

        def setup() -> sqlite3.Connection:
            conn = sql.connect(self._path)
            self.schema_version = sql.migrate(conn, self._clock())
            row = conn.execute("SELECT value FROM meta WHERE key='page_secret'").fetchone()
            if row is None:
                value = os.urandom(32)
                conn.execute("INSERT INTO meta (key, value) VALUES ('page_secret', ?)", (value,))
            else:
                value = bytes(row[0])
            secret.append(value)
            revision.append(sql.revision(conn))
            return conn

        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        writer = GroupCommitter(setup, max_batch=self._opts.max_batch, on_commit=self._notify)
        await asyncio.get_running_loop().run_in_executor(None, writer.start)
        self._writer = writer
        self._commits.arm(asyncio.get_running_loop(), revision[0])
        self._tokens = codec.PageTokens(secret[0])
        self.store_id = codec.store_id(secret[0])
        if self._path != ":memory:":
            self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tandem-store-reader")
            self._reader_conn = sql.connect(self._path)

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

    def _notify(self, conn: sqlite3.Connection) -> None:
        """Writer thread, right after a COMMIT that wrote: publish the revision on the event loop."""
        self._commits.publish_threadsafe(sql.revision(conn))

    async def _write(self, op: Callable[[sqlite3.Connection], T], *, savepoint: bool = True) -> T:
        return await self.committer.call(op, savepoint=savepoint)

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
