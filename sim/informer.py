"""List-then-watch caches and a work queue: the informer/workqueue pair every controller here is built on.

Modelled on client-go: an ``Informer`` lists, then watches from the list's resourceVersion
(bookmarks advance it), resumes after a stream ends, relists on 410 Gone and backs off on
errors; handlers see (old, new) pairs, DELETED included, also when a relist finds changes. A
``WorkQueue`` holds each key once, delays keys, and never hands one key to two workers.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from sim.kubeclient import KubeApiError, KubeClient
from sim.kuberesources import Resource

__all__ = ["Handler", "Informer", "WorkQueue", "object_key"]

log = logging.getLogger("tandem.sim.informer")

JSON = dict[str, Any]
Handler = Callable[[JSON | None, JSON | None], None]
"""Called with (old, new): ADDED has old None, DELETED has new None."""


def _rv(obj: JSON) -> object:
    return (obj.get("metadata") or {}).get("resourceVersion")


def object_key(obj: JSON) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


class Informer:
    """A cache of one resource kept current by list+watch. ``store`` maps keys to the latest objects."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout_s: int = 300,
        backoff_base_s: float = 0.2,
        backoff_cap_s: float = 10.0,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.store: dict[str, JSON] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self._handlers: list[Handler] = []

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def get(self, key: str) -> JSON | None:
        return self.store.get(key)

    def _notify(self, old: JSON | None, new: JSON | None) -> None:
        for h in self._handlers:
            try:
                h(old, new)
            except Exception:  # a handler bug must not stop the cache
                log.exception("informer handler failed", extra={"resource": self.resource.plural})

    def _replace(self, items: list[JSON]) -> None:
        fresh = {object_key(o): o for o in items}
        for key in list(self.store):
            if key not in fresh:
                self._notify(self.store.pop(key), None)
        for key, obj in fresh.items():
            old = self.store.get(key)
            self.store[key] = obj
            if old is None:
                self._notify(None, obj)
            elif _rv(old) != _rv(obj):
                self._notify(old, obj)

    def _apply(self, kind: str, obj: JSON) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if kind == "BOOKMARK":
            return
        key = object_key(obj)
        old = self.store.get(key)
        if kind == "DELETED":
            self.store.pop(key, None)
            self._notify(old, None)
        else:
            self.store[key] = obj
            self._notify(old, obj)

    async def _list(self) -> None:
        result = await self.client.list(
            self.resource,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=self.page_size,
        )
        self.resource_version = result.resource_version
        self._replace(result.items)
        self.synced.set()

    async def _watch_once(self) -> bool:
        """One watch request from the current resourceVersion; True if it delivered anything."""
        got = False
        timeout = self.watch_timeout_s + random.randint(0, max(1, self.watch_timeout_s // 5))
        async for ev in self.client.watch(
            self.resource,
            self.namespace,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout,
        ):
            got = True
            self._apply(ev.type, ev.object)
        return got

    async def run(self) -> None:
        """List, then watch until cancelled; relist on 410, back off (capped, jittered) on other errors."""
        failures = 0
        need_list = True
        while True:
            started = time.monotonic()
            try:
                if need_list:
                    await self._list()
                    need_list = False
                if await self._watch_once() or time.monotonic() - started > 1.0:
                    failures = 0
                    continue
                # an empty stream that ended at once: back off below, as after an error
            except KubeApiError as e:
                if e.gone:
                    need_list = True
                    continue
                log.warning("list/watch failed", extra={"resource": self.resource.plural, "error": str(e)})
            except (TimeoutError, OSError, ValueError) as e:
                log.warning("list/watch connection failed", extra={"resource": self.resource.plural, "error": repr(e)})
            except Exception as e:  # aiohttp errors and the like: never end the cache
                log.warning("list/watch error", extra={"resource": self.resource.plural, "error": repr(e)})
            delay = min(self.backoff_cap_s, self.backoff_base_s * 2 ** min(failures, 20))
            failures += 1
            await asyncio.sleep(delay / 2 + random.random() * delay / 2)


class WorkQueue:
    """Keys to process: each key once, optionally after a delay; a key in flight is re-run after ``done``."""

    def __init__(self) -> None:
        self._ready: list[str] = []
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._delayed: list[tuple[float, int, str]] = []
        self._seq = 0
        self._wake = asyncio.Event()

    def add(self, key: str) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._wake.set()

    def add_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
            return
        self._seq += 1
        heapq.heappush(self._delayed, (time.monotonic() + delay_s, self._seq, key))
        self._wake.set()

    def _promote(self) -> float | None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            self.add(heapq.heappop(self._delayed)[2])
        return self._delayed[0][0] - now if self._delayed else None

    async def get(self) -> str:
        """The next ready key (marked in flight until ``done``)."""
        while True:
            wait = self._promote()
            if self._ready:
                key = self._ready.pop(0)
                self._queued.discard(key)
                self._processing.add(key)
                return key
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            except TimeoutError:
                pass

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def __len__(self) -> int:
        return len(self._ready) + len(self._delayed)
