"""The object store: objects by resource, one global resourceVersion, and a bounded event log.

Like etcd behind the real server: every write takes the next revision, list answers the
current revision, and a watch or paginated list can only resume from a revision still in the
log (older ones are compacted: 410 Expired). Stored objects are never mutated in place: a
write replaces the dict, so events and snapshots can share them.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import orjson

from sim.kubeapi import errors

__all__ = ["Event", "Store", "Subscriber"]

Obj = dict[str, Any]
Subscriber = Callable[["Event"], None]


@dataclasses.dataclass
class Event:
    """One write: the object after it (for DELETED, the last state at the deleting revision)."""

    rv: int
    key: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    prev: Obj | None
    at: float = dataclasses.field(default_factory=time.monotonic)
    _line: bytes | None = None

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace") or "")

    def line(self) -> bytes:
        """The watch line for this event, serialised once for every watcher."""
        if self._line is None:
            self._line = orjson.dumps({"type": self.type, "object": self.obj}) + b"\n"
        return self._line


def object_key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


class Store:
    """Objects per resource key, a global revision counter and the event window."""

    def __init__(self, event_window: int) -> None:
        self.rv = 0
        self.compacted_rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        self._log: collections.deque[Event] = collections.deque()
        self._window = max(1, event_window)
        self._subscribers: dict[str, set[Subscriber]] = collections.defaultdict(set)
        self._global: list[Subscriber] = []

    # -- reads -------------------------------------------------------------------------

    def get(self, key: str, namespace: str, name: str) -> Obj | None:
        return self._objects[key].get((namespace, name))

    def items(self, key: str, namespace: str | None = None) -> list[Obj]:
        """Current objects in key order (namespace, then name), like an etcd range read."""
        objs = self._objects[key]
        keys = sorted(k for k in objs if namespace is None or k[0] == namespace)
        return [objs[k] for k in keys]

    def count(self, key: str) -> int:
        return len(self._objects[key])

    # -- writes ------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, key: str, obj: Obj, *, created: bool) -> Obj:
        """Store obj (a fresh dict the caller gives up) at the next revision; emits ADDED or MODIFIED."""
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        ns_name = object_key(obj)
        prev = self._objects[key].get(ns_name)
        self._objects[key][ns_name] = obj
        self._emit(Event(rv, key, "ADDED" if created else "MODIFIED", obj, prev))
        return obj

    def remove(self, key: str, namespace: str, name: str) -> Obj | None:
        """Delete an object; the DELETED event carries it at the deleting revision."""
        prev = self._objects[key].pop((namespace, name), None)
        if prev is None:
            return None
        rv = self._next_rv()
        final = dict(prev)
        final["metadata"] = dict(prev["metadata"], resourceVersion=str(rv))
        self._emit(Event(rv, key, "DELETED", final, prev))
        return final

    def _emit(self, event: Event) -> None:
        self._log.append(event)
        while len(self._log) > self._window:
            self.compacted_rv = self._log.popleft().rv
        for sub in list(self._subscribers.get(event.key, ())):
            sub(event)
        for sub in list(self._global):
            sub(event)

    # -- watch support -----------------------------------------------------------------

    def subscribe(self, key: str, sub: Subscriber) -> None:
        self._subscribers[key].add(sub)

    def unsubscribe(self, key: str, sub: Subscriber) -> None:
        self._subscribers[key].discard(sub)

    def on_every_write(self, sub: Subscriber) -> None:
        """Controllers inside the server (GC, quota) see every event synchronously."""
        self._global.append(sub)

    def check_not_compacted(self, rv: int) -> None:
        if rv < self.compacted_rv:
            raise errors.ApiError(410, "Expired", f"too old resource version: {rv} ({self.compacted_rv})")

    def events_after(self, key: str, rv: int) -> list[Event]:
        """Events of one resource with revision > rv; 410 if some of them were compacted."""
        self.check_not_compacted(rv)
        return [e for e in self._log if e.rv > rv and e.key == key]

    def snapshot(self, key: str, rv: int, namespace: str | None) -> list[Obj]:
        """The objects of a resource as they were at revision rv (undoing later events)."""
        self.check_not_compacted(rv)
        current = {k: v for k, v in self._objects[key].items() if namespace is None or k[0] == namespace}
        for event in reversed(self._log):
            if event.rv <= rv:
                break
            if event.key != key or (namespace is not None and event.namespace != namespace):
                continue
            ns_name = object_key(event.obj)
            if event.type == "ADDED":
                current.pop(ns_name, None)
            elif event.prev is not None:
                current[ns_name] = event.prev
        return [current[k] for k in sorted(current)]
