"""Group commit: one writer thread owns the SQLite connection and commits all waiting requests in one transaction.

Each request is a function of the connection run inside its own SAVEPOINT,
so a request's logical error (``TandemError``) rolls back only that request.
Callers' futures resolve only after COMMIT returned; if BEGIN/COMMIT (or the
disk) fails, every request of the batch gets ``BatchFailed`` and nothing of
the batch is kept.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from broker.errors import BatchFailed, Internal, StoreUnavailable, TandemError

__all__ = ["GroupCommitter", "CommitStats"]

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Request(Generic[T]):
    op: Callable[[sqlite3.Connection], T]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]


class CommitStats:
    """Batch-size histogram and counters (read by metrics and the benchmark)."""

    def __init__(self) -> None:
        self.batches = 0
        self.requests = 0
        self.failed_batches = 0
        self.sizes: collections.Counter[int] = collections.Counter()

    def record(self, size: int) -> None:
        self.batches += 1
        self.requests += size
        self.sizes[size] += 1


_STOP = object()


class GroupCommitter:
    """Serialises every write through one thread; batches up to ``max_batch`` queued requests per transaction."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        max_batch: int = 512,
        on_commit: Callable[[], None] | None = None,
        name: str = "tandem-store-writer",
    ) -> None:
        self._connect = connect
        self._max_batch = max(1, max_batch)
        self._on_commit = on_commit
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._closed = False
        self.stats = CommitStats()
        self.fault: Callable[[int], BaseException | None] | None = None
        """Test hook: called with the batch size before COMMIT; an exception it returns fails the batch."""

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            raise StoreUnavailable("cannot open the store") from self._open_error

    async def call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` in the next batch; return its result after the batch committed."""
        if self._closed:
            raise StoreUnavailable("store is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        # mark the outcome retrieved even if the caller was cancelled and never looks at it
        fut.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        self._queue.put(_Request(op, loop, fut))
        # shield: a cancelled caller must not make the committed result vanish unnoticed by the writer
        return await asyncio.shield(fut)

    async def stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    # -- writer thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            conn = self._connect()
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self._open_error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            stopping = False
            while not stopping:
                first = self._queue.get()
                if first is _STOP:
                    break
                batch: list[_Request[Any]] = [first]
                while len(batch) < self._max_batch:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is _STOP:
                        stopping = True
                        break
                    batch.append(nxt)
                self._run_batch(conn, batch)
            # fail whatever raced in after stop
            while True:
                try:
                    req = self._queue.get_nowait()
                except queue.Empty:
                    break
                if req is not _STOP:
                    _deliver(req, None, StoreUnavailable("store is closed"))
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Request[Any]]) -> None:
        results: list[tuple[Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for req in batch:
                conn.execute("SAVEPOINT op")
                try:
                    value = req.op(conn)
                except TandemError as e:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((None, e))
                    continue
                except sqlite3.IntegrityError as e:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    err = Internal("store constraint violated")
                    err.__cause__ = e
                    results.append((None, err))
                    continue
                except (sqlite3.OperationalError, sqlite3.DatabaseError):
                    raise  # disk / lock / corruption: the whole batch fails
                except Exception as e:  # a bug in one request must not sink the batch
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    err = Internal(f"store request failed: {type(e).__name__}")
                    err.__cause__ = e
                    results.append((None, err))
                    continue
                conn.execute("RELEASE op")
                results.append((value, None))
            injected = self.fault(len(batch)) if self.fault is not None else None
            if injected is not None:
                raise injected
            conn.execute("COMMIT")
        except BaseException as e:  # noqa: BLE001 - every member learns of it
            self.stats.failed_batches += 1
            log.error("store batch failed", extra={"batch_size": len(batch), "error": repr(e)})
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            for req in batch:
                failed = BatchFailed("the store could not commit this request; retry it")
                failed.__cause__ = e
                _deliver(req, None, failed)
            return
        self.stats.record(len(batch))
        if self._on_commit is not None:
            self._on_commit()
        for req, (value, error) in zip(batch, results):
            _deliver(req, value, error)


def _deliver(req: _Request[Any], value: Any, error: BaseException | None) -> None:
    def settle() -> None:
        if req.future.done():
            return
        if error is not None:
            req.future.set_exception(error)
        else:
            req.future.set_result(value)

    try:
        req.loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the caller's loop is gone
