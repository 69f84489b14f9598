"""The pod garbage collector stand-in (controller-manager's PodGC), the part Job accounting depends on.

A pod deleted before it was ever bound has no kubelet to finish it; with the Job-tracking
finalizer it would stay terminating forever and never count as failed. Upstream PodGC marks such
pods ``Failed`` and deletes them with grace 0 (``gcUnscheduledTerminating``); it does the same,
with a ``DisruptionTarget`` condition (reason ``DeletionByPodGC``), for pods whose node is gone
(``gcOrphaned``, after a quarantine). Its client carries the ``pod-garbage-collector`` identity.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from sim import jobpods as jp
from sim import kuberesources as kr
from sim.informer import Informer, WorkQueue, object_key
from sim.kubeclient import KubeApiError, KubeClient

__all__ = ["PodGC", "needs_gc"]

log = logging.getLogger("tandem.sim.podgc")

JSON = dict[str, Any]
_IO_ERRORS = (KubeApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def needs_gc(pod: JSON, node_exists: Callable[[str], bool]) -> str | None:
    """Why PodGC takes this pod: ``"unscheduled"`` (terminating, never bound), ``"orphaned"`` (node gone), or None."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    node = spec.get("nodeName")
    if meta.get("deletionTimestamp") and not node:
        return "unscheduled"
    if node and not node_exists(str(node)):
        return "orphaned"
    return None


class PodGC:
    """Runs until cancelled: ``await PodGC(client).run()``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        orphan_quarantine_s: float = 40.0,
        scan_period_s: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.pods = Informer(client, kr.PODS)
        self.nodes = Informer(client, kr.NODES)
        self.queue = WorkQueue()
        self._quarantine = orphan_quarantine_s
        self._scan_period = scan_period_s
        self._clock, self._wall = clock, wall_clock
        self._missing_since: dict[str, float] = {}
        self.pods.add_handler(self._on_pod)

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        if new is not None and needs_gc(new, lambda _: True) == "unscheduled":
            self.queue.add(object_key(new))

    def _node_exists(self, name: str) -> bool:
        if self.nodes.get(name) is not None:
            self._missing_since.pop(name, None)
            return True
        first = self._missing_since.setdefault(name, self._clock())
        return self._clock() - first < self._quarantine  # quarantined: not yet treated as gone

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.pods.run())
            tg.create_task(self.nodes.run())
            await self.pods.synced.wait()
            await self.nodes.synced.wait()
            tg.create_task(self._scan())
            for _ in range(2):
                tg.create_task(self._worker())

    async def _scan(self) -> None:
        while True:
            for key, pod in list(self.pods.store.items()):
                if needs_gc(pod, self._node_exists):
                    self.queue.add(key)
            await asyncio.sleep(self._scan_period)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.collect(key)
            except _IO_ERRORS as e:
                log.warning("pod gc failed", extra={"pod": key, "error": str(e)})
                self.queue.add_after(key, 1.0)
            finally:
                self.queue.done(key)

    async def collect(self, key: str) -> None:
        """Mark the pod Failed (if it is not terminal yet), then delete it with grace 0."""
        pod = self.pods.get(key)
        if pod is None:
            return
        why = needs_gc(pod, self._node_exists)
        if why is None:
            return
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        if not jp.is_terminal(pod):
            status: JSON = {"phase": "Failed"}
            if why == "orphaned":
                status["conditions"] = [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByPodGC",
                        "message": "PodGC: node no longer exists",
                        "lastTransitionTime": jp.format_time(self._wall()),
                    }
                ]
            try:
                await self.client.patch(
                    kr.PODS, name, {"status": status}, patch_type="strategic", namespace=ns, subresource="status"
                )
            except KubeApiError as e:
                if e.not_found:
                    return
                raise
        try:
            await self.client.delete(
                kr.PODS, name, ns, grace_period_seconds=0, preconditions={"uid": str(pod["metadata"]["uid"])}
            )
        except KubeApiError as e:
            if not (e.not_found or e.conflict):
                raise
