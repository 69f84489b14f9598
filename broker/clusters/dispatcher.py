"""Cluster sessions: agent messages become lifecycle events; outbox orders become Dispatch / Start / Cancel."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from broker.clusters import link
from broker.clusters.dispatcher_inbox import Inbox
from broker.clusters.dispatcher_outbox import Outbox
from broker.clusters.dispatcher_watchdog import Watchdog
from broker.clusters.session import Session, Sessions
from broker.config import BrokerConfig
from broker.domain import errors, job_events
from broker.domain.events import ToDispatcher, ToPlacer
from broker.domain.records import AttemptRecord, JobRecord
from broker.domain.specs import SpecReader
from broker.domain.states import AttemptOutcome, JobState
from broker.store.base import Store
from broker.tenancy.auth import Caller, check_agent_speaks_for
from fleetplan import catalog as cat

__all__ = ["Session", "Dispatcher"]

S = JobState


class Dispatcher:
    """Serves every agent session and keeps job state following what clusters report. Owns the session
    registry and opens and closes sessions; wires the outbox (orders down), the inbox (messages up) and the
    watchdog (deadlines), which share the registry."""

    def __init__(
        self,
        store: Store,
        catalog: cat.Catalog,
        config: BrokerConfig,
        *,
        specs: SpecReader,
        send: Callable[[ToPlacer], None] = lambda _e: None,
        clock: Callable[[], float] = time.time,
        metrics: Any = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.cfg = config
        self.clock = clock
        self.broker_id = uuid.uuid4().hex[:12]
        self.sessions: Sessions = {}
        self.outbox = Outbox(
            store, catalog, self.sessions, config, specs=specs, send=send, clock=clock, metrics=metrics
        )
        self.inbox = Inbox(self.outbox, store, catalog, send=send, clock=clock, metrics=metrics)
        self.watchdog = Watchdog(
            self.outbox,
            self.sessions,
            self.inbox.all_bound,
            config,
            store=store,
            catalog=catalog,
            specs=specs,
            clock=clock,
            metrics=metrics,
        )

    # ------------------------------------------------------------------ what the rest of the broker calls

    async def apply(self, event: job_events.Event) -> JobRecord | None:
        """Apply one lifecycle event, tell the placer, and deliver any orders it wrote."""
        return await self.outbox.apply(event)

    def on_event(self, event: ToDispatcher) -> None:
        """An event from the placer: a reservation to deliver, or nodes held or given back."""
        self.outbox.on_event(event)

    async def deliver(self, cluster: str) -> None:
        """Send the cluster's undelivered outbox orders on its live stream."""
        await self.outbox.deliver(cluster)

    async def deliver_for(self, job: JobRecord) -> None:
        """Deliver what the clusters of the job's recent attempts are owed."""
        await self.outbox.deliver_for(job)

    async def receive(self, session: Session, sequence: int, msg: link.Inbound | None) -> None:
        """Take one agent message off the stream (see `Inbox.receive`)."""
        await self.inbox.receive(session, sequence, msg)

    async def run_sweeps(self, every_s: float = 1.0) -> None:
        await self.watchdog.run(every_s)

    # ------------------------------------------------------------------ sessions

    async def open_session(self, caller: Caller, hello: link.Hello, hello_sequence: int = 1) -> Session:
        """Validate the Hello, take the newest leader's stream, reconcile the attempts the cluster holds
        (FLEET-NOTES A-13), send Welcome and pending orders."""
        name = hello.meta.name
        check_agent_speaks_for(caller, name)
        if hello.protocol_version not in (0, 1):
            raise errors.FailedPrecondition(
                "protocol version unsupported",
                details=errors.ErrorDetails(
                    reason="PROTOCOL_VERSION_UNSUPPORTED", metadata=(("min", "1"), ("max", "1"))
                ),
            )
        now = self.clock()
        self._admit_leader(name, hello, now)
        self.catalog.connect(hello.meta, now).leader_epoch = hello.leader_epoch
        session = Session(name, uuid.uuid4().hex[:12], done_upto=hello_sequence, leader_epoch=hello.leader_epoch)
        self.sessions[name] = session
        runs = [(job, a) for job, a in await self.store.active_runs() if a.cluster == name and job.attempt == a.number]
        wanted = {(a.job_id, a.number) for _, a in runs}
        known = set(hello.known)
        session.send(
            link.Welcome(
                self.broker_id,
                session.session_id,
                self.cfg.heartbeat_interval_s,
                self.cfg.cluster_stale_after_s,
                self.cfg.agent_listener.max_message_bytes,
                tuple(sorted(known - wanted)),
                tuple(sorted(known & wanted)),
            )
        )
        # The agent sends its snapshot after the Welcome on its own (protocol): ask only for workloads.
        session.send(link.ResyncOut(inventory=False, workloads=True, reason="new session"))
        await self._reconcile(session, runs, known)
        self.outbox.kick(name)
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
                details=errors.ErrorDetails(
                    reason="DEPOSED_LEADER", metadata=(("epoch", str(newest)), ("hello_epoch", str(hello.leader_epoch)))
                ),
            )
        if live and old is not None:
            old.close(aborted=f"replaced by a newer stream of cluster {name} (leader epoch {hello.leader_epoch})")

    async def _reconcile(
        self, session: Session, runs: list[tuple[JobRecord, AttemptRecord]], known: set[tuple[str, int]]
    ) -> None:
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
                session.send(self.outbox.dispatch_out(session, job, a, prev[0] if prev else None))
            elif job.state not in (S.RESERVED, S.QUEUED):  # RESERVED: its Dispatch is still in the outbox
                await self.outbox.apply(
                    job_events.AttemptEnded(
                        job.job_id, a.number, AttemptOutcome.INFRA_FAILED, None, "workload vanished from cluster"
                    )
                )

    def close_session(self, session: Session) -> None:
        session.close()
        if self.sessions.get(session.cluster) is session:
            del self.sessions[session.cluster]
            self.catalog.disconnect(session.cluster, self.clock())

    def in_flight(self) -> list[asyncio.Task[None]]:
        """Agent messages being applied now (shutdown lets them finish before the store closes)."""
        return self.inbox.in_flight()

    def stop(self) -> None:
        self.watchdog.stop()
        for s in list(self.sessions.values()):
            s.close()
