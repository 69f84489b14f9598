"""The dispatcher's way down: lifecycle events committed, and the outbox orders they write sent to live sessions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from broker.clusters import link
from broker.clusters.session import Session, Sessions
from broker.config import BrokerConfig
from broker.domain import errors, job_events
from broker.domain.events import HoldReleased, JobChanged, NodesHeld, ToDispatcher, ToPlacer
from broker.domain.records import AttemptRecord, DispatchOrder, JobRecord, OrderKind
from broker.domain.specs import SpecReader
from broker.domain.states import JobState
from broker.store.base import Delivery, Store
from fleetplan import catalog as cat

__all__ = ["Outbox"]

_log = logging.getLogger("tandem.broker.dispatcher")  # the dispatcher's logger: these are its deliveries
S = JobState


class Outbox:
    """Applies lifecycle events and delivers the orders they write, in outbox order, per cluster, on the
    clusters' live sessions (the registry is the dispatcher's, shared with this outbox)."""

    def __init__(
        self,
        store: Store,
        catalog: cat.Catalog,
        sessions: Sessions,
        config: BrokerConfig,
        *,
        specs: SpecReader,
        send: Callable[[ToPlacer], None],
        clock: Callable[[], float],
        metrics: Any = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.sessions = sessions
        self.cfg = config
        self.specs = specs
        self.send = send
        """Where job changes go (the hub hands them to the placer)."""
        self.clock = clock
        self.metrics = metrics
        self._deliver_locks: dict[str, asyncio.Lock] = {}
        self._kicked: set[str] = set()
        """Clusters with a delivery pass scheduled and not yet started."""
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle events (both ways end here)

    async def apply(self, event: job_events.Event) -> JobRecord | None:
        """Apply one lifecycle event, tell the placer, and deliver any orders it wrote."""
        try:
            job, reaction = await self.store.apply_event(event)
        except errors.JobNotFound:
            return None
        self.send(JobChanged(job))
        t = reaction.transition
        if t is not None:
            if job.state is S.RUNNING and self.metrics is not None:
                self.metrics.started(job)
            clusters = {o.cluster for o in t.orders}
            for cluster in clusters:  # only transitions that wrote orders need a delivery
                self.kick(cluster)
        return job

    async def deliver_for(self, job: JobRecord) -> None:
        attempts = await self.store.list_attempts(job.job_id)
        clusters = {a.cluster for a in attempts if a.number >= job.attempt - 1}
        for cluster in clusters:
            await self.deliver(cluster)

    # ------------------------------------------------------------------ broker -> agent

    def on_event(self, event: ToDispatcher) -> None:
        """A reservation the placer committed: deliver it to its cluster. Nodes held for a job whose victims
        are leaving, or given back: tell the cluster on its live stream (a hold is best effort: it expires
        on its own, and one missed on a reconnect only leaves the nodes unprotected until the dispatch)."""
        if isinstance(event, NodesHeld):
            session = self.sessions.get(event.cluster)
            if session is not None and not session.closed:
                session.send(
                    link.HoldOut(
                        event.job_id,
                        event.attempt,
                        event.spec,
                        event.assignments,
                        event.expires_at,
                        f"{self.store.store_id}/{event.job_id}/{event.attempt}",
                        event.drain,
                        event.idle,
                    )
                )
            return
        if isinstance(event, HoldReleased):
            session = self.sessions.get(event.cluster)
            if session is not None and not session.closed:
                session.send(link.ReleaseHoldOut(event.job_id, event.attempt, event.drain))
            return
        self.kick(event.cluster)

    def kick(self, cluster: str) -> None:
        """Schedule one delivery pass for the cluster; kicks while one is pending coalesce into it."""
        if cluster in self._kicked:
            return
        self._kicked.add(cluster)

        async def run() -> None:
            self._kicked.discard(cluster)
            try:
                await self.deliver(cluster)
            except Exception:
                _log.exception("delivery failed", extra={"cluster": cluster})

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def deliver(self, cluster: str) -> None:
        """Send the cluster's undelivered outbox orders on its live stream, in order, then mark them delivered."""
        session = self.sessions.get(cluster)
        if session is None or session.closed:
            return
        lock = self._deliver_locks.setdefault(cluster, asyncio.Lock())
        async with lock:
            deliveries = await self.store.pending_deliveries(cluster)
            if not deliveries:
                return
            # One read for every order, then send strictly in outbox order, then commit together.
            done: list[int] = []
            sent: list[DispatchOrder] = []
            history = await self._previous_attempts(deliveries)
            for d in deliveries:
                if session.closed:
                    break
                body = self._build_order(session, d, history)
                if body is not None:
                    session.send(body)
                    if d.order.kind is OrderKind.DISPATCH:
                        sent.append(d.order)
                done.append(d.order.order_id)
            await asyncio.gather(*(self.apply(job_events.DispatchSent(o.job_id, o.attempt)) for o in sent))
            if done:
                await self.store.ack_orders(cluster, done)

    async def _previous_attempts(self, deliveries: list[Delivery]) -> dict[str, AttemptRecord]:
        """For dispatches of a retry, the attempt before it (its outcome and cluster go to the pods' env)."""
        out: dict[str, AttemptRecord] = {}
        for d in deliveries:
            if d.order.kind is OrderKind.DISPATCH and d.order.attempt > 1 and d.order.job_id not in out:
                prev = [a for a in await self.store.list_attempts(d.order.job_id) if a.number == d.order.attempt - 1]
                if prev:
                    out[d.order.job_id] = prev[0]
        return out

    def dispatch_out(
        self, session: Session, job: JobRecord, attempt: AttemptRecord, previous: AttemptRecord | None = None
    ) -> link.DispatchOut:
        """The Dispatch for an attempt (the dispatcher resends it to a reconnecting cluster that lacks it)."""
        timeout = self.specs.start_timeout_s(job.spec, self.cfg.gang_start_deadline_s)
        entry = self.catalog.clusters.get(session.cluster)
        return link.DispatchOut(
            job.job_id,
            attempt.number,
            job.spec,
            job.tenant,
            attempt.domain,
            attempt.assignments,
            self.clock() + timeout,
            entry.sequence if entry else 0,
            dispatch_id=f"{self.store.store_id}/{job.job_id}/{attempt.number}",
            start_timeout_s=timeout,
            restart_reason=previous.outcome.value if previous and previous.outcome else "",
            previous_cluster=previous.cluster if previous else "",
        )

    def _build_order(
        self, session: Session, d: Delivery, history: dict[str, AttemptRecord] | None = None
    ) -> link.Outbound | None:
        """The message body for one outbox order, or None when the order was superseded."""
        order, job, attempt = d.order, d.job, d.attempt
        if job is None:
            return None
        if order.kind is OrderKind.DISPATCH:
            if job.attempt != order.attempt or job.state not in (S.RESERVED, S.DISPATCHED) or attempt is None:
                return None  # superseded before it went out
            return self.dispatch_out(session, job, attempt, (history or {}).get(job.job_id))
        if order.kind is OrderKind.START:
            # Start only for the live attempt, and only on a live stream (fencing).
            if job.attempt == order.attempt and job.state is S.STARTING:
                return link.StartOut(job.job_id, order.attempt)
            return None
        reason = (
            "PREEMPTED"
            if order.kind is OrderKind.PREEMPT
            else ("USER_REQUEST" if job.state in (S.CANCELLING, S.CANCELLED) else "SUPERSEDED")
        )
        return link.CancelOut(job.job_id, order.attempt, reason, order.grace_s)
