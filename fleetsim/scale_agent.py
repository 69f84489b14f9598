"""Scale mode's synthetic agent: one cluster speaking the real agent's stream, and the tally of what the agents hold."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extender.agent import wire
from extender.agent.attempts import rendezvous_address
from extender.agent.config import AgentConfig
from extender.agent.model import AttemptKey, Order
from extender.agent.status import ReplicaPhase, ReplicaView
from extender.agent.stream import Stream, StreamClosed, open_channel
from fleetsim.scale_inventory import GPUS_PER_NODE, RecordedInventory
from tandem.v1 import common_pb2
from tandem.v1 import inventory_pb2 as inv

__all__ = [
    "AGENT_VERSION",
    "FleetTally",
    "KUBERNETES_VERSION",
    "Placement",
    "SyntheticAgent",
]

AGENT_VERSION = "0.2.0+synthetic"
KUBERNETES_VERSION = "v1.35.2"


# ----------------------------------------------------------------------------- what the agents saw


@dataclass(frozen=True, slots=True)
class Placement:
    """A job's first dispatch as its cluster received it."""

    job_id: str
    attempt: int
    cluster: str
    nodes: tuple[str, ...]
    racks: frozenset[str]
    blocks: frozenset[str]
    received: float
    """time.monotonic() at the agent."""


@dataclass
class FleetTally:
    """What every synthetic agent saw and did, for the measurements and the checks."""

    placements: dict[str, Placement] = field(default_factory=dict)
    dispatches: int = 0
    redispatches: int = 0
    """Dispatches of a job after its first (another attempt: rejected, timed out or re-planned)."""
    overcommits: list[str] = field(default_factory=list)
    """A node handed more GPUs than it has (or a node the cluster does not have): must stay empty."""
    held_gpus: dict[str, int] = field(default_factory=dict)
    peak_gpus: dict[str, int] = field(default_factory=dict)
    started: int = 0
    finished: int = 0
    finished_at: list[float] = field(default_factory=list)
    """time.monotonic() of every attempt's end at its agent."""
    cancelled: int = 0
    stream_errors: list[str] = field(default_factory=list)
    messages_sent: int = 0

    def hold(self, cluster: str, gpus: int) -> None:
        held = self.held_gpus[cluster] = self.held_gpus.get(cluster, 0) + gpus
        self.peak_gpus[cluster] = max(self.peak_gpus.get(cluster, 0), held)


# ----------------------------------------------------------------------------- one synthetic agent


@dataclass
class _Attempt:
    order: Order
    replicas: tuple[tuple[str, int, str], ...]
    """(pod set, index, node) of every replica."""
    gpus: dict[str, int]
    """node -> GPUs the attempt takes there."""
    bound: bool = False
    reserved: bool = True
    """Its reservation ConfigMap exists: from the accept until a report has shown every replica bound (the agent
    then deletes it, as every replica runs)."""
    started_at: float | None = None
    finish: asyncio.TimerHandle | None = None


class SyntheticAgent:
    """One cluster's agent without a cluster: the real agent's protocol over the real wire, pods that bind the
    moment the broker says Start and finish `run_seconds` later."""

    def __init__(
        self,
        name: str,
        recorded: RecordedInventory,
        tally: FleetTally,
        *,
        run_seconds: tuple[float, float],
        coalesce_s: float,
        rng: random.Random,
    ) -> None:
        self.name = name
        self.recorded = recorded
        self.layout = recorded.layout
        self.tally = tally
        self.run_seconds = run_seconds
        self.coalesce_s = coalesce_s
        self.rng = rng
        self.index = {self.layout.node_name(name, i): i for i in range(self.layout.nodes)}
        self.held: dict[int, int] = {}
        """node index -> GPUs dispatched there and not finished."""
        self.bound: dict[int, int] = {}
        """node index -> GPUs of bound (running) pods: what the inventory shows."""
        self.attempts: dict[AttemptKey, _Attempt] = {}
        self.dirty: set[int] = set()
        self.reservations_changed = False
        self.inventory_sequence = 0
        self.config: AgentConfig | None = None
        self.stream: Stream | None = None
        self.heartbeat_s = 5.0
        self._channel: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    # ------------------------------------------------------------------ the link

    async def connect(self, broker_addr: str, cert: Path, key: Path, ca: Path, timeout_s: float = 120.0) -> None:
        """Hello -> Welcome, then the full snapshot; the reader and reporter run until `close`."""
        self.config = AgentConfig(
            cluster_name=self.name,
            region=self.layout.region,
            role=self.layout.role,
            broker=broker_addr,
            tls_cert_file=cert,
            tls_key_file=key,
            tls_ca_file=ca,
            tenants={self.layout.tenant: [self.layout.namespace]},
            coalesce_s=self.coalesce_s,
        )
        self._channel = open_channel(self.config)
        self.stream = Stream(self._channel, self.config, time.time)
        hello = wire.hello(
            self.config,
            [],
            epoch=1,
            identity=f"{self.name}-synthetic_0",
            instance_id=uuid.uuid4().hex[:12],
            kubernetes_version=KUBERNETES_VERSION,
            agent_version=AGENT_VERSION,
            dispatch=True,
            dra_enabled=False,
        )
        welcome = await self.stream.open(hello, timeout_s)
        self.heartbeat_s = welcome.heartbeat_s
        self._send_snapshot()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._read(), name=f"{self.name}-read"),
            loop.create_task(self._report_loop(), name=f"{self.name}-report"),
        ]

    def _send(self, **body: Any) -> int:
        stream = self.stream
        if stream is None or stream.closed:
            return 0
        try:
            seq = stream.send(**body)
        except StreamClosed:
            return 0
        self.tally.messages_sent += 1
        return seq

    async def _read(self) -> None:
        assert self.stream is not None
        try:
            async for sequence, msg in self.stream.messages():
                self._on_message(msg)
                self.stream.applied_upto(sequence)
        except StreamClosed as e:
            if not self._closing:
                self.tally.stream_errors.append(f"{self.name}: {e}")
        except Exception as e:
            self.tally.stream_errors.append(f"{self.name}: reader failed: {e!r}")

    def _on_message(self, msg: wire.Inbound | wire.WireError) -> None:
        if isinstance(msg, wire.WireError):  # as the agent: an unreadable Dispatch is rejected, naming the field
            if msg.key is not None:
                rejection = wire.Rejection("TEMPLATE_INVALID", str(msg))
                self._send(dispatch_ack=wire.dispatch_ack(msg.key, rejection=rejection))
        elif isinstance(msg, Order):
            self._dispatch(msg)
        elif isinstance(msg, wire.StartMsg):
            self._start(msg.key)
        elif isinstance(msg, wire.CancelMsg):
            self._cancel(msg.key)
        elif isinstance(msg, wire.ResyncMsg):
            if msg.inventory:
                self._send_snapshot()
            if msg.workloads:
                for key in list(self.attempts):
                    self._status(key)

    # ------------------------------------------------------------------ orders

    def _dispatch(self, order: Order) -> None:
        key = order.key
        namespace = self.config.namespace_for(order.tenant, order.namespace_hint) if self.config else None
        if key in self.attempts:  # a redelivered dispatch: accepted again, nothing created twice
            self._send(
                dispatch_ack=wire.dispatch_ack(
                    key, namespace=namespace or "", inventory_sequence=order.inventory_sequence
                )
            )
            return
        if namespace is None:
            self._send(
                dispatch_ack=wire.dispatch_ack(
                    key,
                    rejection=wire.Rejection(
                        "TENANT_NOT_ALLOWED", f"cluster {self.name} maps no namespace to tenant {order.tenant}"
                    ),
                )
            )
            return
        replicas: list[tuple[str, int, str]] = []
        gpus: dict[str, int] = {}
        for ps in order.pod_sets:
            for index in range(ps.count):
                node = ps.node_of(index) or ""
                replicas.append((ps.name, index, node))
                gpus[node] = gpus.get(node, 0) + ps.shape.gpus
        now = time.monotonic()
        t = self.tally
        t.dispatches += 1
        if order.job_id in t.placements:
            t.redispatches += 1
        else:
            nodes = tuple(sorted(gpus))
            idx = [self.index[n] for n in nodes if n in self.index]
            t.placements[order.job_id] = Placement(
                order.job_id,
                order.attempt,
                self.name,
                nodes,
                frozenset(self.layout.rack_of(i) for i in idx),
                frozenset(self.layout.block_of(i) for i in idx),
                now,
            )
        for node, n in gpus.items():
            i = self.index.get(node)
            if i is None:
                t.overcommits.append(f"{self.name}: {order.job_id} on unknown node {node}")
                continue
            self.held[i] = self.held.get(i, 0) + n
            if self.held[i] > GPUS_PER_NODE:
                t.overcommits.append(f"{self.name}/{node}: {self.held[i]} GPUs held after {order.job_id}")
        t.hold(self.name, sum(gpus.values()))
        self.attempts[key] = _Attempt(order, tuple(replicas), gpus)
        self.reservations_changed = True  # the agent writes a reservation ConfigMap: the next report lists it
        self._send(
            dispatch_ack=wire.dispatch_ack(key, namespace=namespace, inventory_sequence=order.inventory_sequence)
        )
        self._status(key)  # every pod created, pinned and gated at once

    def _start(self, key: AttemptKey) -> None:
        a = self.attempts.get(key)
        if a is None:
            self._send(
                workload_status=wire.workload_status(
                    wire.WorkloadReport(
                        key, "FAILED", outcome="INFRA_FAILED", message="Start for an attempt this cluster does not hold"
                    ),
                    time.time(),
                )
            )
            return
        if a.bound:
            return
        a.bound, a.started_at = True, time.time()
        for node, n in a.gpus.items():
            i = self.index.get(node)
            if i is not None:
                self.bound[i] = self.bound.get(i, 0) + n
                self.dirty.add(i)
        self.tally.started += 1
        self._status(key)
        a.finish = asyncio.get_running_loop().call_later(self.rng.uniform(*self.run_seconds), self._finish, key)

    def _release(self, a: _Attempt) -> None:
        for node, n in a.gpus.items():
            i = self.index.get(node)
            if i is None:
                continue
            self.held[i] = self.held.get(i, 0) - n
            if a.bound:
                self.bound[i] = self.bound.get(i, 0) - n
                self.dirty.add(i)
        self.tally.hold(self.name, -sum(a.gpus.values()))
        if a.reserved:
            self.reservations_changed = True

    def _finish(self, key: AttemptKey) -> None:
        a = self.attempts.get(key)
        if a is None:
            return
        self._release(a)
        self._status(key, "SUCCEEDED")
        del self.attempts[key]
        self.tally.finished += 1
        self.tally.finished_at.append(time.monotonic())

    def _cancel(self, key: AttemptKey) -> None:
        a = self.attempts.pop(key, None)
        if a is None:
            self._send(cancel_ack=wire.cancel_ack(key, "NOT_FOUND", "nothing of this attempt exists here"))
            return
        if a.finish is not None:
            a.finish.cancel()
        self._release(a)
        self.tally.cancelled += 1
        self._send(cancel_ack=wire.cancel_ack(key, "DELETED", "every pod is gone"))

    def _status(self, key: AttemptKey, end: str = "") -> None:
        """The attempt's WorkloadStatus as the agent reports it: GATED before Start, RUNNING after, then the end."""
        a = self.attempts[key]
        phase = end or ("RUNNING" if a.bound else "GATED")
        replica_phase = {"GATED": ReplicaPhase.GATED, "RUNNING": ReplicaPhase.RUNNING}.get(
            phase, ReplicaPhase.SUCCEEDED
        )
        finished = time.time() if end else None
        replicas = tuple(
            ReplicaView(
                ps,
                index,
                f"{a.order.job_name(ps)}-{index}-synth",
                node,
                replica_phase,
                exit_code=0 if end else None,
                start_time=a.started_at,
                finish_time=finished,
            )
            for ps, index, node in a.replicas
        )
        report = wire.WorkloadReport(
            key,
            phase,
            replicas,
            self.layout.namespace,
            rendezvous_address(a.order),
            outcome="SUCCEEDED" if end else "",
            exit_code=0 if end else None,
        )
        self._send(workload_status=wire.workload_status(report, time.time()))

    # ------------------------------------------------------------------ reports

    def _progress(self) -> list[inv.ReservationProgress]:
        """Every reservation the cluster holds, with the replicas bound so far. A reservation reported fully
        bound is deleted afterwards (the agent drops it once every replica runs): the next report leaves it out."""
        out = []
        for (job, attempt), a in sorted(self.attempts.items()):
            if not a.reserved:
                continue
            p = inv.ReservationProgress(attempt=common_pb2.AttemptRef(job_id=job, attempt=attempt))
            if a.bound:
                for ps, index, node in a.replicas:
                    p.bound.add(pod_set=ps, index=index, node=node)
                a.reserved = False
                self.reservations_changed = True
            out.append(p)
        return out

    def _shown(self, i: int) -> int:
        """GPUs the node's report shows in use: a node the broker overcommitted (counted in the tally) still
        shows only its own GPUs."""
        return min(self.bound.get(i, 0), GPUS_PER_NODE)

    def _send_snapshot(self) -> None:
        self.inventory_sequence += 1
        applied = self.stream.applied if self.stream else 0
        self.reservations_changed = False
        bound = {i: self._shown(i) for i, g in self.bound.items() if g}
        snap = self.recorded.snapshot(self.name, self.inventory_sequence, time.time(), bound, self._progress(), applied)
        self.dirty.clear()
        self._send(inventory_snapshot=snap)

    def _send_delta(self) -> None:
        base = self.inventory_sequence
        self.inventory_sequence += 1
        self.reservations_changed = False
        delta = inv.InventoryDelta(
            sequence=self.inventory_sequence,
            base_sequence=base,
            reservations=self._progress(),
            applied_broker_sequence=self.stream.applied if self.stream else 0,
        )
        delta.observe_time.FromNanoseconds(time.time_ns())
        for i in sorted(self.dirty):
            delta.upserted_nodes.add().MergeFromString(self.recorded.node(self.name, i, self._shown(i)))
        self.dirty.clear()
        self._send(inventory_delta=delta)

    async def _report_loop(self) -> None:
        """Changes coalesced into one delta per `coalesce_s` (as the agent), heartbeats in between."""
        last_beat = time.monotonic()
        try:
            while self.stream is not None and not self.stream.closed:
                await asyncio.sleep(self.coalesce_s)
                if self.dirty or self.reservations_changed:
                    self._send_delta()
                if time.monotonic() - last_beat >= self.heartbeat_s:
                    last_beat = time.monotonic()
                    self._send(heartbeat=wire.heartbeat(self.stream.applied, self.inventory_sequence, True))
        except Exception as e:
            self.tally.stream_errors.append(f"{self.name}: reporter failed: {e!r}")

    async def close(self) -> None:
        self._closing = True
        for a in self.attempts.values():
            if a.finish is not None:
                a.finish.cancel()
        if self.stream is not None:
            await self.stream.close()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._channel is not None:
            await self._channel.close()
