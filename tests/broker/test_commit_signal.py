"""The store's commit signal: watchers wake on a newer revision, time out, and stop when cancelled."""

from __future__ import annotations

import asyncio

import pytest

from broker.store.revisions import CommitSignal


class _Revision:
    """The store's current revision as the signal reads it."""

    def __init__(self, value: int) -> None:
        self.value = value

    async def __call__(self) -> int:
        return self.value


async def _waiting(signal: CommitSignal, after: int, current: _Revision, timeout_s: float) -> asyncio.Task[int]:
    task = asyncio.create_task(signal.wait(after, timeout_s, current))
    for _ in range(3):  # let it read the revision and start waiting on the signal
        await asyncio.sleep(0)
    assert not task.done()
    return task


async def test_a_newer_revision_wakes_the_watcher() -> None:
    signal, current = CommitSignal(), _Revision(5)
    signal.arm(asyncio.get_running_loop(), 5)
    task = await _waiting(signal, 5, current, 60.0)
    current.value = 6
    signal.publish(6)
    assert await asyncio.wait_for(task, 5.0) == 6


async def test_without_a_commit_the_watcher_returns_at_its_timeout() -> None:
    signal, current = CommitSignal(), _Revision(5)
    signal.arm(asyncio.get_running_loop(), 5)
    assert await asyncio.wait_for(signal.wait(5, 0.05, current), 5.0) == 5


async def test_a_watcher_cancelled_as_a_commit_lands_is_cancelled() -> None:
    """The broker's shutdown cancels its event-log follower while commits still land: the cancellation must win,
    or the follower goes on to wait out a whole bookmark interval and shutdown waits with it."""
    signal, current = CommitSignal(), _Revision(5)
    signal.arm(asyncio.get_running_loop(), 5)
    task = await _waiting(signal, 5, current, 60.0)
    current.value = 6
    signal.publish(6)  # the commit and the cancellation reach the watcher in the same loop turn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5.0)
