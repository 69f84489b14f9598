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

from broker.domain.errors import BatchFailed, Internal, StoreUnavailable, TandemError

__all__ = ["GroupCommitter", "CommitStats"]

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Request(Generic[T]):
    op: Callable[[sqlite3.Connection], T]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]
    savepoint: bool


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
        on_commit: Callable[[sqlite3.Connection], None] | None = None,
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

    async def call(self, op: Callable[[sqlite3.Connection], T], *, savepoint: bool = True) -> T:
        """Run ``op`` in the next batch; return its result after the batch committed.

        ``savepoint=False`` is a promise that ``op`` raises ``TandemError`` only before its first write:
        it then runs without its own SAVEPOINT (two statements fewer), and any other exception
        fails the whole batch instead of rolling back only this request.
        """
        if self._closed:
            raise StoreUnavailable("store is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Request(op, loop, fut, savepoint))
        # A cancelled caller cancels only its future: the request still runs (and may commit) in its batch.
        return await fut

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
        except BaseException as e:
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
                    _deliver([(req, None, StoreUnavailable("store is closed"))])
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Request[Any]]) -> None:
        results: list[tuple[Any, BaseException | None]] = []
        changes = conn.total_changes
        try:
            conn.execute("BEGIN IMMEDIATE")
            for req in batch:
                if not req.savepoint:
                    try:
                        results.append((req.op(conn), None))
                    except TandemError as e:
                        results.append((None, e))  # raised before any write, by the caller's promise
                    continue
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
        except BaseException as e:
            self.stats.failed_batches += 1
            log.error("store batch failed", extra={"batch_size": len(batch), "error": repr(e)})
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            outcomes: list[tuple[_Request[Any], Any, BaseException | None]] = []
            for req in batch:
                failed = BatchFailed("the store could not commit this request; retry it")
                failed.__cause__ = e
                outcomes.append((req, None, failed))
            _deliver(outcomes)
            return
        self.stats.record(len(batch))
        if self._on_commit is not None and conn.total_changes != changes:
            self._on_commit(conn)  # only batches that wrote something wake watchers; before any future settles
        _deliver([(req, value, error) for req, (value, error) in zip(batch, results)])


def _deliver(outcomes: list[tuple[_Request[Any], Any, BaseException | None]]) -> None:
    """Settle futures with one wake-up per event loop (not one per request)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Request[Any], Any, BaseException | None]]] = {}
    for item in outcomes:
        by_loop.setdefault(item[0].loop, []).append(item)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, items)
        except RuntimeError:
            pass  # the caller's loop is gone


def _settle(items: list[tuple[_Request[Any], Any, BaseException | None]]) -> None:
    for req, value, error in items:
        if req.future.done():
            continue  # the caller was cancelled
        if error is not None:
            req.future.set_exception(error)
        else:
            req.future.set_result(value)
