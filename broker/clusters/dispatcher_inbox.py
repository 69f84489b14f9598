"""The dispatcher's way up: agent messages, one job's in order, applied as lifecycle events and acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import cachetools

from broker.clusters import link
from broker.clusters.dispatcher_outbox import Outbox
from broker.clusters.session import Session
from broker.domain import errors, job_events
from broker.domain.events import CapacityChanged, ToPlacer
from broker.domain.states import AttemptOutcome, JobState
from broker.store.base import Store
from fleetplan import catalog as cat

__all__ = ["Inbox"]

_log = logging.getLogger("tandem.broker.dispatcher")  # the dispatcher's logger: these are its messages
S = JobState
_BOUND = frozenset({"BOUND", "RUNNING", "SUCCEEDED"})
"""Replica phases of a pod kube-scheduler has placed."""


class Inbox:
    """Takes each agent message off its session's stream, applies what it reports (lifecycle events go
    through the outbox, which delivers any orders they write) and acknowledges it."""

    def __init__(
        self,
        outbox: Outbox,
        store: Store,
        catalog: cat.Catalog,
        *,
        send: Callable[[ToPlacer], None],
        clock: Callable[[], float],
        metrics: Any = None,
    ) -> None:
        self.outbox = outbox
        self.store = store
        self.catalog = catalog
        self.send = send
        """Where capacity changes go (the hub hands them to the placer)."""
        self.clock = clock
        self.metrics = metrics
        self.ack_delay_s = 0.005
        """Acks wait this long, so one acknowledges a burst of agent messages."""
        self.all_bound: dict[cat.AttemptKey, bool] = {}
        """Per started attempt, whether its last WorkloadStatus showed every replica bound to a node (the
        watchdog judges start deadlines by it, and forgets attempts that ended)."""
        self._attempt_cluster: cachetools.LRUCache[cat.AttemptKey, str] = cachetools.LRUCache(100_000)
        self._applying: set[asyncio.Task[None]] = set()

    def in_flight(self) -> list[asyncio.Task[None]]:
        """Agent messages being applied now (shutdown lets them finish before the store closes)."""
        return list(self._applying)

    async def receive(self, session: Session, sequence: int, msg: link.Inbound | None) -> None:
        """Take one agent message off the stream. Messages about a job are applied in order, but concurrently
        with other jobs' (so their commits share group-commit batches); inventory is applied inline."""
        job_id = getattr(msg, "job_id", None)
        if job_id is None:
            await self._handled(session, sequence, msg)
            return
        prev = session.chains.get(job_id)
        task = asyncio.get_running_loop().create_task(self._chained(prev, session, sequence, msg))
        session.chains[job_id] = task
        self._applying.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._applying.discard(t)
            if session.chains.get(job_id) is t:
                del session.chains[job_id]

        task.add_done_callback(done)

    async def _chained(
        self, prev: asyncio.Task[None] | None, session: Session, sequence: int, msg: link.Inbound | None
    ) -> None:
        if prev is not None:
            with contextlib.suppress(Exception):
                await prev
        await self._handled(session, sequence, msg)

    async def _handled(self, session: Session, sequence: int, msg: link.Inbound | None) -> None:
        try:
            await self.handle(session, msg)
        except Exception:
            _log.exception("agent message failed", extra={"cluster": session.cluster})
        finally:
            session.complete(sequence)
            if not isinstance(msg, link.Heartbeat) and not session.ack_scheduled:
                # Acks are cumulative: one per burst of agent messages, not one each.
                session.ack_scheduled = True
                asyncio.get_running_loop().call_later(self.ack_delay_s, self._flush_ack, session)

    async def handle(self, session: Session, msg: link.Inbound | None) -> None:
        """Apply one agent message (its effects are committed when this returns)."""
        now = self.clock()
        self.catalog.heartbeat(session.cluster, now)
        if isinstance(msg, link.Report):
            await self._report(session, msg.report, now)
        elif isinstance(msg, link.Hello):
            raise errors.FailedPrecondition("Hello may only be the first message")
        elif isinstance(msg, link.Feedback):
            await self._feedback(session, msg)
        elif isinstance(msg, (link.DispatchReply, link.WorkloadReport, link.CancelReply)):
            if not await self.speaks_for(session, msg.job_id, msg.attempt):
                return
            if isinstance(msg, link.DispatchReply):
                await self._dispatch_ack(session, msg)
            elif isinstance(msg, link.WorkloadReport):
                await self._workload(session, msg)
            elif msg.gone:
                await self.outbox.apply(
                    job_events.AttemptEnded(
                        msg.job_id, msg.attempt, AttemptOutcome.CANCELLED, None, msg.message or "deleted"
                    )
                )

    async def speaks_for(self, session: Session, job_id: str, attempt: int) -> bool:
        """The one identity check of agent messages about an attempt: it must have been dispatched to this
        session's cluster (an agent of c2 can neither accept nor fail c1's attempts). Attempt → cluster never
        changes, so the answer is cached."""
        key = (job_id, attempt)
        cluster = self._attempt_cluster.get(key)
        if cluster is None:
            try:
                attempts = await self.store.list_attempts(job_id)
            except errors.JobNotFound:
                attempts = []
            cluster = next((a.cluster for a in attempts if a.number == attempt), "")
            if cluster:
                self._attempt_cluster[key] = cluster
        if cluster != session.cluster:
            _log.warning(
                "agent message about another cluster's attempt ignored",
                extra={"cluster": session.cluster, "job": job_id, "attempt": attempt, "owner": cluster or None},
            )
            if self.metrics is not None:
                self.metrics.foreign_messages.labels(session.cluster).inc()
            return False
        return True

    def _flush_ack(self, session: Session) -> None:
        session.ack_scheduled = False
        if session.done_upto > session.acked_sequence:
            session.acked_sequence = session.done_upto
            session.send(link.AckOut(session.done_upto))

    async def _report(self, session: Session, report: cat.InventoryReport, now: float) -> None:
        try:
            self.catalog.apply_report(report, now)
        except cat.DeltaGap as exc:
            session.send(link.ResyncOut(inventory=True, workloads=False, reason=str(exc)))
            return
        session.inventory_sequence = report.sequence
        self.send(CapacityChanged(session.cluster, "inventory report"))

    async def _dispatch_ack(self, session: Session, ack: link.DispatchReply) -> None:
        if ack.accepted:
            await self.outbox.apply(job_events.DispatchAccepted(ack.job_id, ack.attempt, ack.namespace))
            return
        self.catalog.exclude_nodes(session.cluster, ack.nodes)
        if self.metrics is not None:
            self.metrics.rejected(session.cluster)
        job = await self.outbox.apply(
            job_events.DispatchRejected(ack.job_id, ack.attempt, ack.reason, ack.message, ack.nodes)
        )
        if job is not None:
            self.send(CapacityChanged(session.cluster, "dispatch rejected"))  # re-plan at once, without those nodes

    async def _workload(self, session: Session, w: link.WorkloadReport) -> None:
        try:
            job = await self.store.get_job(w.job_id)
        except errors.JobNotFound:
            return
        if w.attempt != job.attempt:
            return  # a stale attempt's status is ignored (fencing)
        if w.replicas or w.rendezvous:
            await self.store.record_workload(w.job_id, w.attempt, w.replicas, w.rendezvous)
        if w.replicas:
            self.all_bound[(w.job_id, w.attempt)] = all(r.phase in _BOUND for r in w.replicas)
        phase = w.phase
        if phase == "GATED":
            await self.outbox.apply(job_events.WorkloadReady(w.job_id, w.attempt))
        elif phase == "RUNNING":
            # min-available is a dispatch-time property: after start any replica failure fails the attempt
            # (one Indexed Job per pod set, backoffLimit 0), which the agent reports as FAILED.
            if job.state is S.ACCEPTED:
                await self.outbox.apply(job_events.WorkloadReady(w.job_id, w.attempt))
            await self.outbox.apply(job_events.AllRunning(w.job_id, w.attempt))
        elif phase in ("SUCCEEDED", "FAILED"):
            outcome = w.outcome or (AttemptOutcome.SUCCEEDED if phase == "SUCCEEDED" else AttemptOutcome.INFRA_FAILED)
            await self.outbox.apply(job_events.AttemptEnded(w.job_id, w.attempt, outcome, w.exit_code, w.message))
        elif phase == "DELETED":
            await self.outbox.apply(
                job_events.AttemptEnded(w.job_id, w.attempt, AttemptOutcome.CANCELLED, None, w.message)
            )

    async def _feedback(self, session: Session, f: link.Feedback) -> None:
        """Keep the extender's latest verdict per attempt (the newest pod's line wins), for GetJob."""
        latest: dict[tuple[str, int], link.PodFeedback] = {}
        for p in f.pods:
            key = (p.job_id, p.attempt)
            if key not in latest or p.time >= latest[key].time:
                latest[key] = p
        for (job_id, attempt), p in latest.items():
            if await self.speaks_for(session, job_id, attempt):
                await self.store.record_feedback(job_id, attempt, p.text, p.time)
