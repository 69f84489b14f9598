"""Watch streams: newline-delimited JSON events from a resourceVersion, with selectors, bookmarks and delay.

From RV unset or "0" the stream first sends synthetic ADDED events for what exists; from RV X
it replays the logged events after X (an ERROR event with a 410 Status if X was compacted).
With a selector, an object that starts matching arrives as ADDED and one that stops matching
as DELETED, as the real watch cache does. Each stream delays delivery by one random amount in
[0, watch_delay_max_s]: order holds within a stream, never across streams.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from sim.kubeapi import errors
from sim.kubeapi.objects import Call, Obj
from sim.kubeapi.reads import parse_rv
from sim.kubeapi.resources import ResourceType
from sim.kubeapi.selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector
from sim.kubeapi.state import ApiState
from sim.kubeapi.store import Event

__all__ = ["WatchStream"]

Write = Callable[[bytes], Awaitable[None]]
_TOO_LARGE_WAIT_S = 3.0


@dataclasses.dataclass
class _Filter:
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        if self.namespace is not None and (meta.get("namespace") or "") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)


class WatchStream:
    """One watch request: prepared (validated, subscribed) synchronously, then served by `run`."""

    def __init__(
        self, state: ApiState, call: Call, rt: ResourceType, *, delay_max_s: float, bookmark_interval_s: float
    ) -> None:
        self.state = state
        self.rt = rt
        q = call.query
        self.filter = _Filter(
            call.namespace if rt.namespaced and call.namespace else None,
            parse_label_selector(q.get("labelSelector")),
            parse_field_selector(q.get("fieldSelector"), rt),
        )
        self.bookmarks = call.flag("allowWatchBookmarks")
        self.bookmark_interval_s = bookmark_interval_s
        timeout = q.get("timeoutSeconds")
        try:
            self.timeout_s = float(int(timeout)) if timeout else state.rng.uniform(1800, 3600)
        except ValueError as e:
            raise errors.bad_request(f'timeoutSeconds: invalid value "{timeout}"') from e
        self.delay_s = state.rng.uniform(0.0, max(0.0, delay_max_s))
        self.token = call.user.token
        self.rv_text = q.get("resourceVersion", "")
        self.initial_events = q.get("sendInitialEvents", "").lower() == "true"
        if self.initial_events and q.get("resourceVersionMatch") != "NotOlderThan":
            raise errors.ApiError(
                422,
                "Invalid",
                'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                details={"group": "meta.k8s.io", "kind": "ListOptions"},
            )
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self.last_rv = 0

    def _subscriber(self, event: Event) -> None:
        self.queue.put_nowait(event)

    async def _start(self) -> tuple[list[bytes], bool]:
        """Subscribe and compute what to send first: (lines, whether the stream may continue)."""
        store = self.state.store
        synthetic = self.rv_text in ("", "0") or self.initial_events
        if not synthetic:
            rv = parse_rv(self.rv_text)
            deadline = time.monotonic() + _TOO_LARGE_WAIT_S
            while rv > store.rv and time.monotonic() < deadline and not self.state.stopping.is_set():
                await asyncio.sleep(0.05)
            if rv > store.rv:
                err = errors.ApiError(
                    504,
                    "Timeout",
                    f"Timeout: Too large resource version: {rv}, current: {store.rv}",
                    details={
                        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                        "retryAfterSeconds": 1,
                    },
                )
                return [self._error_line(err)], False
        store.subscribe(self.rt.key, self._subscriber)
        lines: list[bytes] = []
        if synthetic:
            self.last_rv = store.rv
            for obj in store.items(self.rt.key, self.filter.namespace):
                if self.filter.matches(obj):
                    lines.append(orjson.dumps({"type": "ADDED", "object": obj}) + b"\n")
            if self.initial_events:
                lines.append(self._bookmark_line(store.rv, initial_end=True))
            return lines, True
        try:
            backlog = store.events_after(self.rt.key, rv)
        except errors.ApiError as e:
            return [self._error_line(e)], False
        self.last_rv = rv
        for event in backlog:
            line = self._translate(event)
            if line is not None:
                lines.append(line)
            self.last_rv = event.rv
        return lines, True

    def _translate(self, event: Event) -> bytes | None:
        was = self.filter.matches(event.prev) if event.type != "ADDED" else False
        now = self.filter.matches(event.obj) if event.type != "DELETED" else False
        if event.type == "DELETED":
            was = self.filter.matches(event.obj)
        if was and now:
            return event.line()
        if now:
            return (
                event.line() if event.type == "ADDED" else orjson.dumps({"type": "ADDED", "object": event.obj}) + b"\n"
            )
        if was:
            return (
                event.line()
                if event.type == "DELETED"
                else orjson.dumps({"type": "DELETED", "object": event.obj}) + b"\n"
            )
        return None

    def _bookmark_line(self, rv: int, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (
            orjson.dumps(
                {
                    "type": "BOOKMARK",
                    "object": {"kind": self.rt.kind, "apiVersion": self.rt.api_version, "metadata": meta},
                }
            )
            + b"\n"
        )

    @staticmethod
    def _error_line(err: errors.ApiError) -> bytes:
        return orjson.dumps({"type": "ERROR", "object": err.status()}) + b"\n"

    async def _send(self, write: Write, line: bytes, due: float) -> None:
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        await self.state.wait_reachable(self.token)
        await write(line)

    async def run(self, write: Write) -> None:
        """Serve the stream until timeoutSeconds, a stop of the server, or a failed write."""
        started = time.monotonic()
        end = started + self.timeout_s
        try:
            lines, go_on = await self._start()
            for line in lines:
                await self._send(write, line, started + self.delay_s)
            if not go_on:
                return
            next_bookmark = time.monotonic() + self.bookmark_interval_s
            while not self.state.stopping.is_set():
                now = time.monotonic()
                if now >= end:
                    return
                wake = min(end, next_bookmark) if self.bookmarks else end
                try:
                    event = await asyncio.wait_for(self.queue.get(), timeout=max(0.0, wake - now))
                except TimeoutError:
                    if self.bookmarks and time.monotonic() >= next_bookmark and time.monotonic() < end:
                        rv = self.state.store.rv if self.queue.empty() else self.last_rv
                        await self._send(write, self._bookmark_line(rv), 0.0)
                        next_bookmark = time.monotonic() + self.bookmark_interval_s
                    continue
                if event is None:
                    return
                if event.rv <= self.last_rv:
                    continue
                self.last_rv = event.rv
                translated = self._translate(event)
                if translated is not None:
                    await self._send(write, translated, event.at + self.delay_s)
        finally:
            self.state.store.unsubscribe(self.rt.key, self._subscriber)

    def close(self) -> None:
        self.queue.put_nowait(None)
