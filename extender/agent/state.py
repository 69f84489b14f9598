"""The agent's state its halves share: what it remembers per attempt, per-job locks, tasks and sends."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from extender.agent.attempts import order_from_jobs
from extender.agent.config import AgentConfig, default_identity
from extender.agent.encode import LabelFilter
from extender.agent.metrics import AgentMetrics
from extender.agent.model import AttemptKey, Order
from extender.agent.stream import Stream, StreamClosed
from extender.agent.tracker import Tracker
from extender.agent.workloads import Workloads
from extender.inventory import Inventory
from extender.kube import KubeClient

__all__ = ["AgentState"]

log = logging.getLogger("tandem.agent")


@dataclass
class _Attempt:
    """What this agent process remembers of one attempt beyond what the cluster shows."""

    order: Order | None = None
    namespace: str = ""
    sent: tuple[Any, ...] | None = None
    """The last status reported (phase, replicas, outcome): a status goes out only when it changes."""
    terminal_sequence: int = 0
    """Agent sequence of the terminal status; clean-up once the broker acknowledged it."""
    finished_at: float | None = None
    cancelling: bool = False
    """Deletion started on the broker's order: CancelAck DELETED once every pod is gone."""
    pending_groups: list[tuple[str, ...]] = field(default_factory=list)
    """Pod sets still gated after a Start (MPI: the launcher waits for its workers)."""
    start_received: float | None = None
    reservation_dropped: bool = False
    feedback: dict[str, str] = field(default_factory=dict)
    """pod -> kube-scheduler message last sent."""
    pull_errors: dict[str, float] = field(default_factory=dict)
    """pod uid -> when an image / configuration error was first seen (a bound fails it as APP_FAILED)."""


class AgentState:
    """The Agent's state and the small helpers its broker-order and cluster-following halves share."""

    def __init__(
        self,
        config: AgentConfig,
        inventory: Inventory,
        kube: KubeClient | None,
        *,
        read_only: bool = False,
        identity: str | None = None,
        clock: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.inv = inventory
        self.kube = kube
        self.read_only = read_only or kube is None
        self.identity = identity or config.identity or default_identity()
        self.clock, self.mono, self.rand, self.sleep = clock, mono, rand, sleep
        ext = config.extender
        self.tracker = Tracker(ext.gang_job_label, ext.gang_attempt_label)
        self.work = Workloads(kube, config, identity=self.identity, clock=clock) if kube is not None else None
        self.metrics = AgentMetrics()
        if kube is not None:
            self.metrics.watch_api_errors(lambda: dict(kube.errors))
        self.labels = LabelFilter.build(
            ext.topology.keys,
            extra_keys=[k for k in config.report_labels if not k.endswith("*")],
            extra_prefixes=[k[:-1] for k in config.report_labels if k.endswith("*")],
        )
        self.instance_id = uuid.uuid4().hex[:12]
        self.attempts: dict[AttemptKey, _Attempt] = {}
        self.refused: dict[str, str] = {}
        self.missing_classes: set[str] = set()
        self.kubernetes_version = ""
        self.preflight_done = asyncio.Event()
        self.stream: Stream | None = None
        self.stream_lost_at: float | None = mono()
        self.epoch = 0
        self._locks: dict[str, asyncio.Lock] = {}
        self._not_ready: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ small helpers

    def _lock(self, job_id: str) -> asyncio.Lock:
        return self._locks.setdefault(job_id, asyncio.Lock())

    def _spawn(self, coro: Awaitable[object], name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("agent task failed", extra={"detail": name})

        task = asyncio.get_running_loop().create_task(guarded(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _state(self, key: AttemptKey) -> _Attempt:
        return self.attempts.setdefault(key, _Attempt())

    def _order(self, key: AttemptKey) -> Order | None:
        """The dispatched order, or one rebuilt from the Jobs' annotations (after an agent restart)."""
        a = self.attempts.get(key)
        if a is not None and a.order is not None:
            return a.order
        order = order_from_jobs(key, self.tracker.jobs(key), self.config)
        if order is not None:
            self._state(key).order = order
        return order

    def _send(self, **body: Any) -> int:
        stream = self.stream
        if stream is None or stream.closed:
            return 0
        try:
            return stream.send(**body)
        except StreamClosed:
            return 0

    @property
    def ready(self) -> bool:
        """/readyz: the inventory is synced, the reservations are loaded and the start checks ran."""
        return self.inv.ready and (self.read_only or self.preflight_done.is_set())

    async def _quietly(self, op: Any, what: str, key: AttemptKey) -> None:
        try:
            await op
        except Exception as e:
            log.warning(f"{what} failed", extra={"job": key[0], "detail": repr(e)})


def _pod_set(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get("tandem.dev/pod-set", ""))


def _namespace_of(jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> str:
    for obj in (*jobs, *pods):
        ns = (obj.get("metadata") or {}).get("namespace")
        if ns:
            return str(ns)
    return ""


def _claim_templates(order: Order | None) -> list[str]:
    if order is None:
        return []
    return [f"{order.job_name(ps.name)}-{r.name}" for ps in order.pod_sets for r in ps.device_requests]
