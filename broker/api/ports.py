"""What the API's handlers get instead of the hub: one small bundle per family of calls (`broker.server` builds them).

Each bundle carries only what its calls use. The fleet is read through a `FleetView` taken per call (the
same snapshot a placement cycle decides over: frozen cluster facts, GPU pictures computed through it),
never the live catalog; the queue is read from the placer's job book; changes to the catalog, the placer
and the dispatcher go through the hub's named operations, never their internals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter

from broker.clusters import link
from broker.clusters.session import Session
from broker.domain.records import JobRecord
from broker.scheduling.fairness import Shares
from broker.scheduling.queue import QueueSnapshot, WaitInfo
from broker.store.base import Store
from broker.tenancy.auth import AuditLog, Authorizer, Caller
from broker.tenancy.policy import PolicyFile
from fleetplan.decide import ClusterVerdict
from fleetplan.view import FleetView
from placement.model import JobRequest

__all__ = [
    "QueueReads",
    "QueueUpdates",
    "AgentSessions",
    "Gate",
    "JobPorts",
    "QueuePorts",
    "ClusterPorts",
    "AgentPorts",
    "ApiPorts",
]


class QueueReads(Protocol):
    """The placer's job book as the API reads it: queue order, why jobs wait, fair shares, per-cluster verdicts."""

    def snapshot(self, now: float | None = None) -> QueueSnapshot: ...

    def shares(self, now: float | None = None) -> tuple[QueueSnapshot, Shares]: ...

    def why(self, job_id: str) -> WaitInfo: ...

    def why_all(self, snap: QueueSnapshot | None = None) -> dict[str, WaitInfo]: ...

    async def cluster_verdicts(self, job: JobRecord) -> tuple[ClusterVerdict, ...]: ...


class QueueUpdates(Protocol):
    """What the API tells the placer after a commit: a job changed, the request parsed at submission, or
    waiting jobs deserve another look."""

    def observe(self, job: JobRecord) -> None: ...

    def remember(self, job: JobRecord, req: JobRequest) -> None: ...

    def capacity_changed(self) -> None: ...


class AgentSessions(Protocol):
    """The dispatcher as an agent's stream uses it: a session opened at the Hello, each message after it
    handed over in order, the session closed when the stream ends."""

    async def open_session(self, caller: Caller, hello: link.Hello, hello_sequence: int = 1) -> Session: ...

    async def receive(self, session: Session, sequence: int, msg: link.Inbound | None) -> None: ...

    def close_session(self, session: Session) -> None: ...


@dataclass(frozen=True, slots=True)
class Gate:
    """Who is calling, may they, and the audit record: what every edge uses before and after a call."""

    authz: Authorizer
    audit: AuditLog


@dataclass(frozen=True, slots=True)
class JobPorts:
    """The job calls: submit, read, list, watch, cancel, requeue, reprioritise, hold and release."""

    store: Store
    policy: PolicyFile
    clock: Callable[[], float]
    grace_s: float
    """Grace period a cancelled or requeued attempt gets to stop."""
    max_response_bytes: int
    """Largest message the tenant listener sends (list pages and item errors are cut to fit)."""
    queue: QueueUpdates
    reads: QueueReads
    reprioritised: Callable[[JobRecord], None]
    deliver_for: Callable[[JobRecord], Awaitable[None]]
    """Send the job's clusters what they are owed about it now."""
    deliver_all: Callable[[], Awaitable[None]]
    fleet_view: Callable[[], FleetView]
    """The fleet now, frozen (the clusters' log link templates)."""
    submissions: Counter
    """Submitted items by outcome."""


@dataclass(frozen=True, slots=True)
class QueuePorts:
    """The queue and usage views: fair shares, why jobs wait, GPU-hours."""

    reads: QueueReads
    policy: PolicyFile
    store: Store
    clock: Callable[[], float]


@dataclass(frozen=True, slots=True)
class ClusterPorts:
    """The cluster calls: list, get, cordon and uncordon."""

    policy: PolicyFile
    fleet_view: Callable[[], FleetView]
    """The fleet now, frozen: what the cluster calls and the fleet picture read (its `now` is their clock)."""
    cordon_reasons: Mapping[str, str]
    set_cordon: Callable[[str, str | None, str], Awaitable[None]]
    """(cluster, reason or None to uncordon, actor): durable first, then in effect for the placer."""


@dataclass(frozen=True, slots=True)
class AgentPorts:
    """The agents' Connect stream: their sessions with the dispatcher."""

    sessions: AgentSessions
    clock: Callable[[], float]


@dataclass(frozen=True, slots=True)
class ApiPorts:
    """Every bundle, for the places that construct the servicers and the fleet view."""

    gate: Gate
    jobs: JobPorts
    queues: QueuePorts
    clusters: ClusterPorts
    agents: AgentPorts
