"""The scheduler stand-in's queue: kube-scheduler's activeQ / backoffQ / unschedulable pods, by pod key.

* active: highest ``spec.priority`` first, then the earliest (re)queue time (PrioritySort);
* backoff: a failed pod waits initial × 2^(attempts-1), capped, before it may run again;
* unschedulable: pods the cycle rejected wait there until a cluster event (node added or changed,
  a bound pod gone, the pod itself changed) moves them back, or until they have waited
  ``unschedulable_timeout_s`` (``podMaxInUnschedulablePodsDuration``). Errors skip this pool.

No I/O; the clock is injected.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable

__all__ = ["SchedulingQueue"]


class SchedulingQueue:
    def __init__(
        self,
        *,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        unschedulable_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.unschedulable_timeout_s = unschedulable_timeout_s
        self._clock = clock
        self._heap: list[tuple[int, float, int, str]] = []
        self._active: dict[str, int] = {}  # key -> the sequence number of its live heap entry
        self._backoff: dict[str, float] = {}  # key -> when it may run
        self._unschedulable: dict[str, float] = {}  # key -> since when
        self._attempts: dict[str, int] = {}
        self._last_attempt: dict[str, float] = {}
        self._priority: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}  # key -> the move epoch when its cycle began
        self._moves = 0
        self._seq = itertools.count()
        self._wake = asyncio.Event()

    def __contains__(self, key: str) -> bool:
        return key in self._active or key in self._backoff or key in self._unschedulable or key in self._in_flight

    def pending(self) -> dict[str, str]:
        """Where each waiting pod is (``active``, ``backoff``, ``unschedulable``, ``in-flight``): for tests and logs."""
        out = {k: "active" for k in self._active}
        out.update({k: "backoff" for k in self._backoff})
        out.update({k: "unschedulable" for k in self._unschedulable})
        out.update({k: "in-flight" for k in self._in_flight})
        return out

    def backoff_duration(self, key: str) -> float:
        n = self._attempts.get(key, 0)
        if n <= 0:
            return 0.0
        return min(self.max_backoff_s, self.initial_backoff_s * 2.0 ** (n - 1))

    def _push_active(self, key: str) -> None:
        seq = next(self._seq)
        self._active[key] = seq
        heapq.heappush(self._heap, (-self._priority.get(key, 0), self._clock(), seq, key))
        self._wake.set()

    def _release(self, key: str) -> None:
        """Active now if its back-off is over, else into the backoff queue."""
        ready_at = self._last_attempt.get(key, 0.0) + self.backoff_duration(key)
        if ready_at <= self._clock():
            self._push_active(key)
        else:
            self._backoff[key] = ready_at
            self._wake.set()

    def add(self, key: str, priority: int) -> None:
        """A new pod (or one whose gates were just lifted): active at once unless it is already waiting."""
        self._priority[key] = priority
        if key in self:
            return
        self._push_active(key)

    def update(self, key: str, priority: int) -> None:
        """The pod changed in a way that may make it schedulable: out of the unschedulable pool."""
        self._priority[key] = priority
        if key in self._unschedulable:
            del self._unschedulable[key]
            self._release(key)
        elif key in self._in_flight:
            self._in_flight[key] = -1  # changed during its cycle: a rejection must not park it
        elif key not in self:
            self._push_active(key)

    def remove(self, key: str) -> None:
        """The pod was bound, deleted or gated: forget it entirely."""
        self._active.pop(key, None)
        self._backoff.pop(key, None)
        self._unschedulable.pop(key, None)
        self._attempts.pop(key, None)
        self._last_attempt.pop(key, None)
        self._priority.pop(key, None)
        self._in_flight.pop(key, None)

    def done(self, key: str, *, rejected: bool | None) -> None:
        """The cycle for ``key`` ended: None = scheduled, True = unschedulable, False = error (back-off only).

        A rejected pod that changed, or saw a cluster event, during its cycle goes to back-off
        instead of the unschedulable pool (kube-scheduler's move request cycle).
        """
        epoch = self._in_flight.pop(key, self._moves)
        if rejected is None:
            self._attempts.pop(key, None)
            self._last_attempt.pop(key, None)
            return
        if key not in self._priority:
            return  # removed while in flight
        self._attempts[key] = self._attempts.get(key, 0) + 1
        self._last_attempt[key] = self._clock()
        if rejected and epoch == self._moves:
            self._unschedulable[key] = self._clock()
        else:
            self._backoff[key] = self._clock() + self.backoff_duration(key)
        self._wake.set()

    def move_all_to_active_or_backoff(self) -> None:
        """A cluster event: every unschedulable pod may fit now (and so may the pods in flight)."""
        self._moves += 1
        for key in list(self._unschedulable):
            del self._unschedulable[key]
            self._release(key)

    def _flush(self) -> float | None:
        """Promote what is due; the seconds until the next thing is due (None: nothing waits)."""
        now = self._clock()
        for key, ready_at in list(self._backoff.items()):
            if ready_at <= now:
                del self._backoff[key]
                self._push_active(key)
        for key, since in list(self._unschedulable.items()):
            if now - since >= self.unschedulable_timeout_s:
                del self._unschedulable[key]
                self._release(key)
        due = [t - now for t in self._backoff.values()]
        due += [since + self.unschedulable_timeout_s - now for since in self._unschedulable.values()]
        return max(0.0, min(due)) if due else None

    def pop_ready(self) -> str | None:
        """The best active key now (marked in flight), or None."""
        self._flush()
        while self._heap:
            _, _, seq, key = heapq.heappop(self._heap)
            if self._active.get(key) == seq:
                del self._active[key]
                self._in_flight[key] = self._moves
                return key
        return None

    async def pop(self) -> str:
        while True:
            key = self.pop_ready()
            if key is not None:
                return key
            wait = self._flush()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            except TimeoutError:
                pass
