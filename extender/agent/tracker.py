"""What the cluster holds of each attempt: Tandem's pods and Jobs as the watches deliver them (pure bookkeeping).

The agent feeds the extender's own inventory with one pod watch; `Tee` hands the same events to the
tracker too (no second watch of every pod), and the agent's Job watch goes to the tracker only. Every
change marks its attempt dirty; the agent re-reads dirty attempts, reports and acts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from extender.agent.model import AttemptKey

__all__ = ["Tracker", "Tee", "attempt_of"]


def attempt_of(obj: Mapping[str, Any], job_label: str, attempt_label: str) -> AttemptKey | None:
    """(job, attempt) from an object's Tandem labels; None for objects that are not Tandem's."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, Mapping):
        return None
    job, attempt = labels.get(job_label), labels.get(attempt_label)
    if not isinstance(job, str) or not job or not isinstance(attempt, str):
        return None
    if not (attempt.isascii() and attempt.isdigit()):
        return None
    return (job, int(attempt))


def _uid_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class Tracker:
    """Pods and Jobs by attempt; `dirty` holds the attempts changed since the caller last took them."""

    def __init__(self, job_label: str = "tandem.dev/job", attempt_label: str = "tandem.dev/attempt") -> None:
        self.job_label = job_label
        self.attempt_label = attempt_label
        self._objs: dict[str, dict[AttemptKey, dict[tuple[str, str], dict[str, Any]]]] = {"Pod": {}, "Job": {}}
        self._key_of: dict[str, dict[tuple[str, str], AttemptKey]] = {"Pod": {}, "Job": {}}
        self.synced: set[str] = set()
        self.dirty: set[AttemptKey] = set()
        self.version = 0

    def take_dirty(self) -> set[AttemptKey]:
        out, self.dirty = self.dirty, set()
        return out

    def replace(self, kind: str, objects: Iterable[dict[str, Any]]) -> None:
        if kind not in self._objs:
            return
        for key in list(self._objs[kind]):
            self.dirty.add(key)
        self._objs[kind] = {}
        self._key_of[kind] = {}
        for obj in objects:
            self._put(kind, obj)
        self.synced.add(kind)
        self.version += 1

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        if kind not in self._objs:
            return
        ident = _uid_key(obj)
        old = self._key_of[kind].pop(ident, None)
        if old is not None:
            self._objs[kind].get(old, {}).pop(ident, None)
            if not self._objs[kind].get(old, True):
                del self._objs[kind][old]
            self.dirty.add(old)
        if event_type != "DELETED":
            self._put(kind, obj)
        self.version += 1

    def _put(self, kind: str, obj: dict[str, Any]) -> None:
        key = attempt_of(obj, self.job_label, self.attempt_label)
        if key is None:
            return
        ident = _uid_key(obj)
        self._objs[kind].setdefault(key, {})[ident] = obj
        self._key_of[kind][ident] = key
        self.dirty.add(key)

    def pods(self, key: AttemptKey) -> list[dict[str, Any]]:
        return list(self._objs["Pod"].get(key, {}).values())

    def jobs(self, key: AttemptKey) -> list[dict[str, Any]]:
        return list(self._objs["Job"].get(key, {}).values())

    def attempts(self) -> set[AttemptKey]:
        """Every attempt with a Tandem pod or Job in the cluster."""
        return set(self._objs["Pod"]) | set(self._objs["Job"])

    def gone(self, key: AttemptKey) -> bool:
        """No pod of the attempt is left (a deletionTimestamp is not gone) and no Job either."""
        return key not in self._objs["Pod"] and key not in self._objs["Job"]


class _Sink(Protocol):
    def replace(self, kind: str, objects: list[dict[str, Any]]) -> None: ...

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None: ...


class Tee:
    """One watch, two readers: pods go to the inventory and the tracker, Jobs to the tracker only."""

    def __init__(self, inventory: _Sink, tracker: Tracker) -> None:
        self.inventory = inventory
        self.tracker = tracker

    def replace(self, kind: str, objects: list[dict[str, Any]]) -> None:
        if kind != "Job":
            self.inventory.replace(kind, objects)
        if kind in ("Pod", "Job"):
            self.tracker.replace(kind, objects)

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        if kind != "Job":
            self.inventory.apply(kind, event_type, obj)
        if kind in ("Pod", "Job"):
            self.tracker.apply(kind, event_type, obj)
