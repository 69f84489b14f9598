"""Helpers for the kube.py tests: a recording inventory, fixture loading and kmock scripting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from tests.fixtures import fixture_json

RESERVATION_CONFIGMAP: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "reservation-job-7-1",
        "namespace": "tandem-system",
        "labels": {"tandem.dev/reservation": "job-7"},
    },
    "data": {"reservation.json": '{"job": "job-7", "attempt": 1}'},
}
"""A reservation ConfigMap as the agent writes it (no resourceVersion: the server gives one)."""


def fixture_items(name: str, kind: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = fixture_json(name)["items"]
    return [i for i in items if kind is None or i.get("kind") == kind]


class RecordingInventory:
    """Implements replace/apply and records every call in order; tests await conditions on it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self._changed = asyncio.Condition()
        self.fail_on: Callable[[str, dict[str, Any]], bool] | None = None

    @staticmethod
    def _key(obj: dict[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace') or ''}/{meta.get('name')}"

    def replace(self, kind: str, objects: list[dict[str, Any]]) -> None:
        self.calls.append(("replace", kind, [self._key(o) for o in objects]))
        self.objects[kind] = {self._key(o): o for o in objects}
        self._notify()

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        if self.fail_on is not None and self.fail_on(kind, obj):
            raise RuntimeError("inventory refused object")
        self.calls.append(("apply", kind, event_type, self._key(obj)))
        bucket = self.objects.setdefault(kind, {})
        if event_type == "DELETED":
            bucket.pop(self._key(obj), None)
        else:
            bucket[self._key(obj)] = obj
        self._notify()

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.get_running_loop().create_task(wake())

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        # A guard against a hung test, not a timing assertion.
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(predicate)

    def kinds_called(self, op: str) -> list[str]:
        return [c[1] for c in self.calls if c[0] == op]


class SleepRecorder:
    """Injected sleep: records the delays and yields to the loop instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


def node_list(rv: str, items: list[dict[str, Any]], kind: str = "NodeList", cont: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "items": items}


def event(etype: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": etype, "object": obj}


def bookmark(rv: str, kind: str = "Node") -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv}}}


def gone_status() -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 1 (2000)",
        "reason": "Expired",
        "code": 410,
    }


def with_rv(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(obj))
    out["metadata"]["resourceVersion"] = rv
    return out


async def hang() -> None:
    """A reaction that never answers: an open watch with no events (the test cancels the watcher)."""
    await asyncio.Event().wait()


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll until the predicate holds; the timeout only guards against a hung test."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


def times(n: int, status: int, body: dict[str, Any] | bytes) -> Callable[[], Any]:
    """A reaction that answers ``status`` with ``body`` to the next n requests it sees, then steps aside."""
    from kmock import Response  # type: ignore[attr-defined]  # exported, not listed in __all__

    left = [n]

    def react() -> Any:
        if left[0] <= 0:
            return NotImplemented
        left[0] -= 1
        return Response(status=status, payload=body)

    return react
