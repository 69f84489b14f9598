"""Cluster sessions: agent messages become lifecycle events; outbox orders become Dispatch / Start / Cancel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cachetools

from fleetplan import catalog as cat
from broker.domain.specs import SpecReader
from broker.domain import errors, lifecycle
from broker.clusters import link
from broker.tenancy.auth import Caller, check_agent_speaks_for
from broker.config import BrokerConfig
from broker.domain.events import CapacityChanged, HoldReleased, JobChanged, NodesHeld, ToDispatcher, ToPlacer
from broker.domain.records import AttemptRecord, DispatchOrder, JobRecord, OrderKind
from broker.domain.states import PRE_START, AttemptOutcome, JobState
from broker.store.base import Delivery, Store

__all__ = ["Session", "Dispatcher"]

_log = logging.getLogger("tandem.broker.dispatcher")
S = JobState
_BOUND = frozenset({"BOUND", "RUNNING", "SUCCEEDED"})
"""Replica phases of a pod kube-scheduler has placed."""


@dataclass
class Session:
    """One live agent stream. Outgoing domain messages go through `out` (the servicer serialises and numbers
    them); `None` closes the stream."""

    cluster: str
    session_id: str
    out: asyncio.Queue[link.Outbound | None] = field(default_factory=asyncio.Queue)
    done_upto: int = 0
    """Every agent message with a sequence up to this one is processed (what Ack may claim)."""
    acked_sequence: int = 0
    ack_scheduled: bool = False
    closed: bool = False
    aborted: str = ""
    """Why the broker ended the stream (a newer leader's stream replaced it); the servicer ends it ABORTED."""
    inventory_sequence: int = 0
    leader_epoch: int = 0
    _done: set[int] = field(default_factory=set)
    chains: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """Per job, the last message being processed: messages about one job apply in order, others concurrently."""

    def complete(self, sequence: int) -> None:
        if sequence <= self.done_upto:
            return
        self._done.add(sequence)
        while self.done_upto + 1 in self._done:
            self.done_upto += 1
            self._done.discard(self.done_upto)

    def send(self, body: link.Outbound) -> None:
        if not self.closed:
            self.out.put_nowait(body)

    def close(self, aborted: str = "") -> None:
        if not self.closed:
            self.closed = True
            self.aborted = aborted
            self.out.put_nowait(None)


class Dispatcher:
    """Serves every agent session and keeps job state following what clusters report."""

    def __init__(
        self, store: Store, catalog: cat.Catalog, config: BrokerConfig,
        *, specs: SpecReader, send: Callable[[ToPlacer], None] = lambda _e: None, clock: Callable[[], float] = time.time,
        metrics: Any = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.specs = specs
        self.send = send
        """Where job changes and capacity changes go (the hub hands them to the placer)."""
        self.cfg = config
        self.clock = clock
        self.metrics = metrics
        self.broker_id = uuid.uuid4().hex[:12]
        self.ack_delay_s = 0.005
        self.sessions: dict[str, Session] = {}
        self._deliver_locks: dict[str, asyncio.Lock] = {}
        self._kicked: set[str] = set()
        self._attempt_cluster: cachetools.LRUCache[tuple[str, int], str] = cachetools.LRUCache(100_000)
        self._all_bound: dict[tuple[str, int], bool] = {}
        """Per started attempt, whether its last WorkloadStatus showed every replica bound to a node."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._applying: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ sessions

    async def open_session(self, caller: Caller, hello: link.Hello, hello_sequence: int = 1) -> Session:
        """Validate the Hello, take the newest leader's stream, reconcile the attempts the cluster holds
        (FLEET-NOTES A-13), send Welcome and pending orders."""
        name = hello.meta.name
        check_agent_speaks_for(caller, name)
        if hello.protocol_version not in (0, 1):
            raise errors.FailedPrecondition("protocol version unsupported",
                                            details=errors.ErrorDetails(reason="PROTOCOL_VERSION_UNSUPPORTED",
                                                                        metadata=(("min", "1"), ("max", "1"))))
        now = self.clock()
        self._admit_leader(name, hello, now)
        self.catalog.connect(hello.meta, now).leader_epoch = hello.leader_epoch
        session = Session(name, uuid.uuid4().hex[:12], done_upto=hello_sequence, leader_epoch=hello.leader_epoch)
        self.sessions[name] = session
        runs = [(job, a) for job, a in await self.store.active_runs() if a.cluster == name and job.attempt == a.number]
        wanted = {(a.job_id, a.number) for _, a in runs}
        known = set(hello.known)
        session.send(link.Welcome(
            self.broker_id, session.session_id, self.cfg.heartbeat_interval_s, self.cfg.cluster_stale_after_s,
            self.cfg.agent_listener.max_message_bytes, tuple(sorted(known - wanted)), tuple(sorted(known & wanted))))
        # The agent sends its snapshot after the Welcome on its own (protocol): ask only for workloads.
        session.send(link.ResyncOut(inventory=False, workloads=True, reason="new session"))
        await self._reconcile(session, runs, known)
        self.kick(name)
        return session

    def _admit_leader(self, name: str, hello: link.Hello, now: float) -> None:
        """The highest leader epoch wins (A-12): a newer leader's Hello ends the older stream at once; a lower
        epoch is a deposed leader and is refused while the newer one has been heard from recently."""
        entry = self.catalog.clusters.get(name)
        old = self.sessions.get(name)
        live = old is not None and not old.closed
        newest = max(entry.leader_epoch if entry is not None else 0, old.leader_epoch if live and old else 0)
        recent = entry is not None and entry.silent_for(now) <= self.cfg.cluster_stale_after_s
        if hello.leader_epoch < newest and recent:
            raise errors.FailedPrecondition(
                f"deposed leader: cluster {name} has a leader of epoch {newest}, this Hello says {hello.leader_epoch}",
                details=errors.ErrorDetails(reason="DEPOSED_LEADER",
                                            metadata=(("epoch", str(newest)), ("hello_epoch", str(hello.leader_epoch)))))
        if live and old is not None:
            old.close(aborted=f"replaced by a newer stream of cluster {name} (leader epoch {hello.leader_epoch})")

    async def _reconcile(self, session: Session, runs: list[tuple[JobRecord, AttemptRecord]],
                         known: set[tuple[str, int]]) -> None:
        """Attempts the broker wants on this cluster: resend what the cluster may never have received (a
        Dispatch sent but not acknowledged; a Start for a gang still starting, on this live stream only);
        an accepted attempt the cluster no longer holds has vanished and ends INFRA_FAILED."""
        for job, a in runs:
            if (a.job_id, a.number) in known:
                if job.state is S.STARTING:
                    session.send(link.StartOut(job.job_id, a.number))
                continue
            if job.state is S.DISPATCHED:
                prev = [p for p in await self.store.list_attempts(job.job_id) if p.number == a.number - 1]
                session.send(self._dispatch_out(session, job, a, prev[0] if prev else None))
            elif job.state not in (S.RESERVED, S.QUEUED):  # RESERVED: its Dispatch is still in the outbox
                await self.apply(lifecycle.AttemptEnded(job.job_id, a.number, AttemptOutcome.INFRA_FAILED, None,
                                                         "workload vanished from cluster"))

    def close_session(self, session: Session) -> None:
        session.close()
        if self.sessions.get(session.cluster) is session:
            del self.sessions[session.cluster]
            self.catalog.disconnect(session.cluster, self.clock())

    # ------------------------------------------------------------------ agent -> broker

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

    async def _chained(self, prev: asyncio.Task[None] | None, session: Session, sequence: int,
                       msg: link.Inbound | None) -> None:
        if prev is not None:
            with contextlib.suppress(Exception):
                await prev
        await self._handled(session, sequence, msg)

    async def _handled(self, session: Session, sequence: int, msg: link.Inbound | None) -> None:
        try:
            await self.handle(session, msg)
        except Exception:  # noqa: BLE001 - one bad message must not drop the cluster
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
                await self.apply(lifecycle.AttemptEnded(msg.job_id, msg.attempt, AttemptOutcome.CANCELLED, None,
                                                         msg.message or "deleted"))

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
            _log.warning("agent message about another cluster's attempt ignored",
                         extra={"cluster": session.cluster, "job": job_id, "attempt": attempt,
                                "owner": cluster or None})
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

    async def apply(self, event: lifecycle.Event) -> JobRecord | None:
        """Apply one lifecycle event, tell the placer, and deliver any orders it wrote."""
        try:
            job, reaction = await self.store.apply_event(event)
        except errors.JobNotFound:
            return None
        self.send(JobChanged(job))
        t = reaction.transition
        if t is not None:
            _log.info("job state changed", extra=lifecycle.log_fields(job, t))
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

    async def _dispatch_ack(self, session: Session, ack: link.DispatchReply) -> None:
        if ack.accepted:
            await self.apply(lifecycle.DispatchAccepted(ack.job_id, ack.attempt, ack.namespace))
            return
        self.catalog.exclude_nodes(session.cluster, ack.nodes)
        if self.metrics is not None:
            self.metrics.rejected(session.cluster)
        job = await self.apply(lifecycle.DispatchRejected(ack.job_id, ack.attempt, ack.reason, ack.message, ack.nodes))
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
            self._all_bound[(w.job_id, w.attempt)] = all(r.phase in _BOUND for r in w.replicas)
        phase = w.phase
        if phase == "GATED":
            await self.apply(lifecycle.WorkloadReady(w.job_id, w.attempt))
        elif phase == "RUNNING":
            # min-available is a dispatch-time property: after start any replica failure fails the attempt
            # (one Indexed Job per pod set, backoffLimit 0), which the agent reports as FAILED.
            if job.state is S.ACCEPTED:
                await self.apply(lifecycle.WorkloadReady(w.job_id, w.attempt))
            await self.apply(lifecycle.AllRunning(w.job_id, w.attempt))
        elif phase in ("SUCCEEDED", "FAILED"):
            outcome = w.outcome or (AttemptOutcome.SUCCEEDED if phase == "SUCCEEDED" else AttemptOutcome.INFRA_FAILED)
            await self.apply(lifecycle.AttemptEnded(w.job_id, w.attempt, outcome, w.exit_code, w.message))
        elif phase == "DELETED":
            await self.apply(lifecycle.AttemptEnded(w.job_id, w.attempt, AttemptOutcome.CANCELLED, None, w.message))

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

    async def _teardown(self, job: JobRecord, cluster: str, outcome: AttemptOutcome, message: str, why: str) -> None:
        """End the attempt (the lifecycle re-queues it as the next attempt) and order its workload deleted."""
        attempt = job.attempt
        await self.apply(lifecycle.AttemptEnded(job.job_id, attempt, outcome, None, message))
        session = self.sessions.get(cluster)
        if session is not None:
            session.send(link.CancelOut(job.job_id, attempt, why, self.cfg.grace_period_s, message))

    # ------------------------------------------------------------------ broker -> agent

    def on_event(self, event: ToDispatcher) -> None:
        """A reservation the placer committed: deliver it to its cluster. Nodes held for a job whose victims
        are leaving, or given back: tell the cluster on its live stream (a hold is best effort: it expires
        on its own, and one missed on a reconnect only leaves the nodes unprotected until the dispatch)."""
        if isinstance(event, NodesHeld):
            session = self.sessions.get(event.cluster)
            if session is not None and not session.closed:
                session.send(link.HoldOut(event.job_id, event.attempt, event.spec, event.assignments,
                                          event.expires_at, f"{self.store.store_id}/{event.job_id}/{event.attempt}",
                                          event.drain, event.idle))
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
            except Exception:  # noqa: BLE001 - orders stay in the outbox; the next kick retries
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
            await asyncio.gather(*(self.apply(lifecycle.DispatchSent(o.job_id, o.attempt)) for o in sent))
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

    def _dispatch_out(self, session: Session, job: JobRecord, attempt: AttemptRecord,
                      previous: AttemptRecord | None = None) -> link.DispatchOut:
        timeout = self.specs.start_timeout_s(job.spec, self.cfg.gang_start_deadline_s)
        entry = self.catalog.clusters.get(session.cluster)
        return link.DispatchOut(job.job_id, attempt.number, job.spec, job.tenant, attempt.domain,
                                attempt.assignments, self.clock() + timeout, entry.sequence if entry else 0,
                                dispatch_id=f"{self.store.store_id}/{job.job_id}/{attempt.number}",
                                start_timeout_s=timeout,
                                restart_reason=previous.outcome.value if previous and previous.outcome else "",
                                previous_cluster=previous.cluster if previous else "")

    def _build_order(self, session: Session, d: Delivery,
                     history: dict[str, AttemptRecord] | None = None) -> link.Outbound | None:
        """The message body for one outbox order, or None when the order was superseded."""
        order, job, attempt = d.order, d.job, d.attempt
        if job is None:
            return None
        if order.kind is OrderKind.DISPATCH:
            if job.attempt != order.attempt or job.state not in (S.RESERVED, S.DISPATCHED) or attempt is None:
                return None  # superseded before it went out
            return self._dispatch_out(session, job, attempt, (history or {}).get(job.job_id))
        if order.kind is OrderKind.START:
            # Start only for the live attempt, and only on a live stream (fencing).
            if job.attempt == order.attempt and job.state is S.STARTING:
                return link.StartOut(job.job_id, order.attempt)
            return None
        reason = "PREEMPTED" if order.kind is OrderKind.PREEMPT else (
            "USER_REQUEST" if job.state in (S.CANCELLING, S.CANCELLED) else "SUPERSEDED")
        return link.CancelOut(job.job_id, order.attempt, reason, order.grace_s)

    # ------------------------------------------------------------------ watchdog

    async def sweep(self) -> None:
        """Stale clusters: re-plan what has not started, LOST for started work past the further bound;
        gangs past their start deadline and unacknowledged dispatches are torn down and re-planned."""
        now = self.clock()
        self.catalog.sweep(now)
        for cluster in list(self.sessions):
            self.kick(cluster)  # anything left in the outbox (e.g. a failed delivery) goes out now
        stale = {name: e.silent_for(now) for name, e in self.catalog.clusters.items()
                 if e.silent_for(now) > self.cfg.cluster_stale_after_s}
        if self.metrics is not None:
            self.metrics.staleness(self.catalog, now)
        runs = await self.store.active_runs()  # one read, not one per attempt
        for job, a in runs:
            silent = stale.get(a.cluster)
            if job.attempt != a.number:
                continue
            if silent is not None:
                if job.state in PRE_START and silent > self.cfg.cluster_stale_after_s:
                    await self.apply(lifecycle.ClusterSilent(job.job_id, a.number))
                    continue
                if job.state in (S.STARTING, S.RUNNING) and silent > self.cfg.cluster_stale_after_s + self.cfg.lost_after_s:
                    await self.apply(lifecycle.ClusterSilent(job.job_id, a.number))
                    continue
            if job.state is S.DISPATCHED and a.dispatch_time and now - a.dispatch_time > self.cfg.dispatch_ack_timeout_s:
                await self.apply(lifecycle.ReservationExpired(job.job_id, a.number))
            else:
                late = self._late(job, a, now)
                if late:
                    await self._teardown(job, a.cluster, AttemptOutcome.GANG_TIMEOUT, late, "GANG_TIMEOUT")
        active = {(j.job_id, a.number) for j, a in runs}
        for key in [k for k in self._all_bound if k not in active]:
            del self._all_bound[key]

    def _late(self, job: JobRecord, a: AttemptRecord, now: float) -> str:
        """Why a gang missed its start (empty when it has not): the broker's deadlines are the only
        authority (the agent only reports). Both start bounds count from the Start."""
        timeout = self.specs.start_timeout_s(job.spec, self.cfg.gang_start_deadline_s)
        if job.state is S.ACCEPTED and a.dispatch_time and now - a.dispatch_time > timeout:
            return f"the gang's pods were not all created and pinned {timeout:g} s after its dispatch"
        if job.state is not S.STARTING or a.start_time is None:
            return ""
        since = now - a.start_time
        schedule = min(self.cfg.gang_schedule_timeout_s, timeout)
        # Judged only on a report heard since this broker started (after a restart it knows nothing yet).
        if since > schedule and self._all_bound.get((job.job_id, a.number)) is False:
            return f"not every pod was bound to its node {schedule:g} s after Start"
        if since > timeout:
            return f"not every replica was running {timeout:g} s after Start"
        return ""

    async def run_sweeps(self, every_s: float = 1.0) -> None:
        while not self._stopped:
            await asyncio.sleep(every_s)
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - keep sweeping
                _log.exception("sweep failed")

    def in_flight(self) -> list[asyncio.Task[None]]:
        """Agent messages being applied now (shutdown lets them finish before the store closes)."""
        return list(self._applying)

    def stop(self) -> None:
        self._stopped = True
        for s in list(self.sessions.values()):
            s.close()
