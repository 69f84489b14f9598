"""The latest committed revision and the wake-up of watchers waiting for a newer one (both backends' writers publish)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["CommitSignal"]


class CommitSignal:
    """Kept on the event loop: the writer publishes each commit's revision, watchers wait for one above theirs."""

    def __init__(self) -> None:
        self.revision = 0
        """Latest committed revision (read without I/O)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next: asyncio.Future[None] | None = None

    def arm(self, loop: asyncio.AbstractEventLoop, revision: int) -> None:
        """Start on ``loop`` at the revision the database has (the store's open)."""
        self._loop, self.revision = loop, revision
        self._next = loop.create_future()

    def publish(self, revision: int) -> None:
        """Record a committed revision; a newer one wakes every waiter (on the loop's thread)."""
        loop = self._loop
        if loop is None or revision <= self.revision:
            return
        self.revision = revision
        fut, self._next = self._next, loop.create_future()  # armed afresh before waking: no wake-up is lost
        if fut is not None and not fut.done():
            fut.set_result(None)

    def publish_threadsafe(self, revision: int) -> None:
        """``publish`` from another thread (the SQLite writer's): run on the loop, dropped once the loop is closed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.publish, revision)

    async def wait(self, after: int, timeout_s: float, current: Callable[[], Awaitable[int]]) -> int:
        """Wait until ``current()`` (the store's revision) is above ``after`` or the timeout passes; return it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            signal = self._next  # taken before reading, so a commit in between still wakes us
            rev = await current()
            remaining = deadline - loop.time()
            if rev > after or remaining <= 0 or signal is None:
                return rev
            # asyncio.wait, not wait_for: on Python 3.11 wait_for returns instead of raising when it is cancelled
            # just as the signal fires, and a cancelled watcher would then wait out its whole timeout
            done, _ = await asyncio.wait((signal,), timeout=remaining)
            if not done:
                return await current()
