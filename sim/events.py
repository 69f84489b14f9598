"""Core ``v1`` Events written by the simulated controllers (``FailedCreate``, ``FailedScheduling``, ...).

Operators and the cluster agent read these to learn why nothing happens, exactly as on a real
cluster; writing them is best effort and never fails the caller.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from sim import kuberesources as kr
from sim.jobpods import format_time
from sim.kubeclient import KubeApiError, KubeClient

__all__ = ["EventRecorder"]

log = logging.getLogger("tandem.sim.events")


class EventRecorder:
    """Writes one Event per call, named ``<object>.<16 hex>`` like client-go's recorder."""

    def __init__(self, client: KubeClient, component: str, *, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.component = component
        self._clock = clock

    async def record(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        now = format_time(self._clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": "",
        }
        try:
            await self.client.create(kr.EVENTS, event, namespace)
        except (TimeoutError, KubeApiError, aiohttp.ClientError, OSError) as e:
            log.debug("event not written", extra={"reason": reason, "error": str(e)})
