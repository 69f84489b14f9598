"""What the agent keeps of its attempts and its broker stream, shared by the order and cluster-following halves."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from extender.agent.attempts import order_from_jobs
from extender.agent.config import AgentConfig
from extender.agent.model import AttemptKey, Order
from extender.agent.stream import Stream, StreamClosed
from extender.agent.tracker import Tracker
from extender.inventory import Inventory
from extender.podreq import POD_SET_LABEL

__all__ = [
    "AgentState",
    "AttemptRecord",
    "Uplink",
    "StartChecks",
    "best_effort",
    "claim_template_names",
    "namespace_of",
    "pod_set_of",
]

log = logging.getLogger("tandem.agent")


@dataclass
class AttemptRecord:
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


@dataclass
class StartChecks:
    """What the start checks found: dispatches are judged against it, Hello reports the server version."""

    kubernetes_version: str = ""
    refused: dict[str, str] = field(default_factory=dict)
    """tenant -> why its namespace cannot be used (missing, or the agent lacks a permission there)."""
    missing_classes: set[str] = field(default_factory=set)
    """PriorityClasses the config names that the cluster does not have."""
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Uplink:
    """The broker stream messages go out on while one is open; between streams a message is dropped."""

    def __init__(self) -> None:
        self.stream: Stream | None = None

    @property
    def is_open(self) -> bool:
        return self.stream is not None

    def attach(self, stream: Stream) -> None:
        self.stream = stream

    def detach(self, stream: Stream) -> None:
        """The stream ended; a newer one already attached stays."""
        if self.stream is stream:
            self.stream = None

    def send(self, **body: Any) -> int:
        """Queue one agent message; its sequence, or 0 when no stream takes it."""
        stream = self.stream
        if stream is None or stream.closed:
            return 0
        try:
            return stream.send(**body)
        except StreamClosed:
            return 0


class AgentState:
    """The attempts this process remembers, one lock per job, the tasks it started, and its view of the cluster.

    Everything for one attempt runs under its job's lock, so the steps of one gang never interleave."""

    def __init__(
        self,
        config: AgentConfig,
        inventory: Inventory,
        tracker: Tracker,
        *,
        read_only: bool,
        clock: Callable[[], float],
        mono: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.config = config
        self.inv = inventory
        self.tracker = tracker
        self.read_only = read_only
        self.clock, self.mono, self.sleep = clock, mono, sleep
        self.attempts: dict[AttemptKey, AttemptRecord] = {}
        self.checks = StartChecks()
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def lock(self, job_id: str) -> asyncio.Lock:
        return self._locks.setdefault(job_id, asyncio.Lock())

    def record(self, key: AttemptKey) -> AttemptRecord:
        """The attempt's record, created empty the first time it is asked for."""
        return self.attempts.setdefault(key, AttemptRecord())

    def order(self, key: AttemptKey) -> Order | None:
        """The dispatched order, or one rebuilt from the Jobs' annotations (after an agent restart)."""
        a = self.attempts.get(key)
        if a is not None and a.order is not None:
            return a.order
        order = order_from_jobs(key, self.tracker.jobs(key), self.config)
        if order is not None:
            self.record(key).order = order
        return order

    def report_all_again(self) -> None:
        """Forget what was last reported, so every attempt's status goes out again (a new or resynced stream)."""
        for a in self.attempts.values():
            a.sent = None
        self.tracker.dirty.update(self.tracker.attempts())

    @property
    def ready(self) -> bool:
        """/readyz: the inventory is synced, the reservations are loaded and the start checks ran."""
        return self.inv.ready and (self.read_only or self.checks.done.is_set())

    def spawn(self, coro: Awaitable[object], name: str) -> None:
        """Run `coro` in the background; a failure is logged, never lost."""

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

    async def cancel_tasks(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


async def best_effort(op: Awaitable[object], what: str, key: AttemptKey) -> None:
    """Await a cluster write whose failure is only logged (holds expire on their own)."""
    try:
        await op
    except Exception as e:
        log.warning(f"{what} failed", extra={"job": key[0], "detail": repr(e)})


def pod_set_of(pod: dict[str, Any]) -> str:
    """The pod set a pod belongs to, from its Tandem label ("" without one)."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(POD_SET_LABEL, ""))


def namespace_of(jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> str:
    """The namespace an attempt's objects live in ("" when none is left)."""
    for obj in (*jobs, *pods):
        ns = (obj.get("metadata") or {}).get("namespace")
        if ns:
            return str(ns)
    return ""


def claim_template_names(order: Order | None) -> list[str]:
    """The ResourceClaimTemplates the order's DRA requests were rendered to (one per request and pod set)."""
    if order is None:
        return []
    return [f"{order.job_name(ps.name)}-{r.name}" for ps in order.pod_sets for r in ps.device_requests]
