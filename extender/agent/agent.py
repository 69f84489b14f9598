"""The cluster agent: inventory up, orders down, status back (DESIGN.md "Flow of one gang job").

One process per replica; only the Lease holder talks to the broker and writes to the cluster. It builds
its inventory with the extender's own code (`Inventory` fed by the extender's `Watcher`), streams
snapshots and coalesced deltas, carries out Dispatch / Start / Cancel for its cluster, and reports every
attempt's status. Fencing: gates are lifted only on a Start received on the live stream; a replica that
loses the Lease stops writing (the client's guard) and closes its stream first.

Per attempt, everything (create, pin, start, cancel, clean-up) runs under one lock per job, so the
steps of one gang never interleave; different gangs proceed concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable

from extender.agent import preflight, wire
from extender.agent.config import AgentConfig, default_identity
from extender.agent.encode import LabelFilter, ReportBuilder
from extender.agent.following import Following
from extender.agent.metrics import AgentMetrics
from extender.agent.model import AttemptKey, Order
from extender.agent.orders import Orders
from extender.agent.state import AgentState, Uplink
from extender.agent.stream import Stream, StreamClosed, open_channel
from extender.agent.tracker import Tracker
from extender.agent.workloads import Workloads
from extender.inventory import Inventory
from extender.kube import Backoff, KubeClient, KubeError

__all__ = ["Agent", "AGENT_VERSION"]

log = logging.getLogger("tandem.agent")

PREPARE_SLICE_NODES = 256
"""Nodes encoded per event-loop turn while the first snapshot is prepared (about 25 ms of work)."""

FOLLOW_TICK_S = 0.05
"""How often the follow loop takes the attempts the watches changed."""

SWEEP_EVERY_S = 2.0
"""How often the follow loop runs what time alone changes (expiries, deadlines)."""

AGENT_VERSION = "0.2.0"


class Agent:
    """Runs inventory, leadership, the broker stream and the workloads of one cluster.

    It wires the parts and runs the loops: `state` (attempts, locks, tasks, start checks) is shared by
    `orders` (the broker's Dispatch / Hold / Start / Cancel) and `following` (what the cluster shows of each
    attempt, reported back); both write through `work` and send on `uplink`, the broker stream this agent
    opens in `session`."""

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
        self.state = AgentState(
            config, inventory, self.tracker, read_only=self.read_only, clock=clock, mono=mono, sleep=sleep
        )
        self.uplink = Uplink()
        self.orders = Orders(self.state, self.work, self.uplink, self.metrics)
        self.following = Following(self.state, self.work, self.uplink, self.metrics)

    @property
    def stream(self) -> Stream | None:
        """The broker stream open now, if any."""
        return self.uplink.stream

    @property
    def preflight_done(self) -> asyncio.Event:
        """Set once the start checks ran: the leader's work waits for it, /readyz reports it."""
        return self.state.checks.done

    # ------------------------------------------------------------------ start checks

    async def preflight(self) -> None:
        """The start checks (RBAC by access reviews, PriorityClasses, the server version); KubeError to retry."""
        checks = self.state.checks
        if self.kube is not None:
            try:
                checks.kubernetes_version = await self.kube.server_version()
                checks.refused = await preflight.refused_tenants(self.kube, self.config)
                checks.missing_classes = await preflight.missing_priority_classes(self.kube, self.config)
            except KubeError:
                log.exception("start checks failed; retrying later")
                raise
        checks.done.set()

    # ------------------------------------------------------------------ the broker stream

    async def session(self, epoch: int) -> None:
        """One broker stream, from Hello to its end (raises StreamClosed with the status)."""
        channel = open_channel(self.config)
        stream = Stream(channel, self.config, self.clock)
        try:
            hello = wire.hello(
                self.config,
                self.following.known_attempts(),
                epoch=epoch,
                identity=self.identity,
                instance_id=self.instance_id,
                kubernetes_version=self.state.checks.kubernetes_version,
                agent_version=AGENT_VERSION,
                dispatch=not self.read_only,
            )
            welcome = await stream.open(hello)
            self.uplink.attach(stream)
            self.metrics.connected.set(1)
            log.info(
                "broker stream open",
                extra={"detail": {"session": welcome.session_id, "epoch": epoch, "obsolete": len(welcome.obsolete)}},
            )
            for key in welcome.obsolete:
                self.state.spawn(self.orders.cancel(key, None, "replaced by the broker"), f"obsolete-{key[0]}")
            builder = ReportBuilder(self.labels)
            await self._prepare_snapshot(builder)
            self._send_snapshot(builder, stream)
            self.state.report_all_again()  # a new stream (maybe a restarted broker) hears every attempt's status
            reporter = asyncio.get_running_loop().create_task(self._report_loop(builder, stream, welcome.heartbeat_s))
            try:
                async for sequence, msg in stream.messages():
                    self._on_message(builder, stream, sequence, msg)
            finally:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
        finally:
            self.uplink.detach(stream)
            self.metrics.connected.set(0)
            await stream.close()
            await channel.close()

    def _on_message(
        self, builder: ReportBuilder, stream: Stream, sequence: int, msg: wire.Inbound | wire.WireError
    ) -> None:
        if isinstance(msg, wire.WireError):
            log.warning("broker message not usable", extra={"detail": str(msg)})
            if msg.key is not None:
                self.uplink.send(
                    dispatch_ack=wire.dispatch_ack(msg.key, rejection=wire.Rejection("TEMPLATE_INVALID", str(msg)))
                )
        elif isinstance(msg, Order):
            self.state.spawn(self.orders.dispatch(msg), f"dispatch-{msg.job_id}")
        elif isinstance(msg, wire.StartMsg):
            self.state.spawn(self.orders.start(msg.key), f"start-{msg.key[0]}")
        elif isinstance(msg, wire.CancelMsg):
            self.state.spawn(self.orders.cancel(msg.key, msg.grace_s, msg.reason), f"cancel-{msg.key[0]}")
        elif isinstance(msg, wire.HoldMsg):
            self.state.spawn(self.orders.hold(msg), f"hold-{msg.key[0]}")
        elif isinstance(msg, wire.ReleaseHoldMsg):
            self.state.spawn(self.orders.release_hold(msg.key, msg.drain), f"release-hold-{msg.key[0]}")
        elif isinstance(msg, wire.AckMsg):
            self.state.spawn(self.following.acknowledged(msg.sequence), "ack")
        elif isinstance(msg, wire.ResyncMsg):
            if msg.inventory:
                self._send_snapshot(builder, stream)
            if msg.workloads:
                self.state.report_all_again()
        stream.applied_upto(sequence)

    def _reservation_keys(self) -> list[AttemptKey]:
        return sorted((r.job, int(r.attempt)) for r in self.inv.reservations())

    async def _prepare_snapshot(self, builder: ReportBuilder) -> None:
        """Encode the first snapshot's nodes ahead, a slice per event-loop turn: at thousands of nodes one
        encode takes half a second, which would hold up Lease renewals and the broker stream. Nodes that
        change meanwhile are encoded again by the snapshot itself (prepared encodings are kept per facts)."""
        while builder.prepare(self.inv.snapshot().facts, PREPARE_SLICE_NODES):
            await asyncio.sleep(0)

    def _send_snapshot(self, builder: ReportBuilder, stream: Stream) -> None:
        snap = self.inv.snapshot()
        report = builder.snapshot(
            snap.facts, self._reservation_keys(), self.clock(), applied_broker_sequence=stream.applied
        )
        self.uplink.send(inventory_snapshot=report)
        self.metrics.reports.labels("snapshot").inc()
        self.metrics.report_bytes.observe(report.ByteSize())

    async def _report_loop(self, builder: ReportBuilder, stream: Stream, heartbeat_s: float) -> None:
        """Coalesced deltas every `coalesce_s` when the inventory changed; heartbeats in between."""
        version = self.inv.version
        last_beat = self.mono()
        while not stream.closed:
            await self.sleep(self.config.coalesce_s)
            if self.inv.version != version:
                version = self.inv.version
                snap = self.inv.snapshot()
                delta = builder.delta(
                    snap.facts, self._reservation_keys(), self.clock(), applied_broker_sequence=stream.applied
                )
                if delta is not None:
                    self.uplink.send(inventory_delta=delta)
                    self.metrics.reports.labels("delta").inc()
                    self.metrics.report_bytes.observe(delta.ByteSize())
            if self.mono() - last_beat >= heartbeat_s:
                last_beat = self.mono()
                self.uplink.send(heartbeat=wire.heartbeat(stream.applied, builder.sequence, not self.read_only))

    async def sessions(self, epoch: int) -> None:
        """Streams one after another, with capped exponential back-off and jitter between them."""
        backoff = Backoff(self.config.reconnect_base_s, self.config.reconnect_cap_s, self.rand)
        while True:
            opened = self.mono()
            try:
                await self.session(epoch)
            except StreamClosed as e:
                self.metrics.reconnects.labels(e.code.name if e.code else "EOF").inc()
                log.warning("broker stream ended", extra={"detail": str(e)})
            except (OSError, ValueError) as e:
                log.warning("broker stream failed", extra={"detail": repr(e)})
            if self.mono() - opened > 30:
                backoff.reset()  # it lived: the next failure starts from the base delay
            await self.sleep(backoff.next_delay())

    # ------------------------------------------------------------------ following the cluster

    async def follow_loop(self) -> None:
        """React to every change of Tandem's pods and Jobs; sweep for deadlines now and then."""
        last_sweep = self.mono()
        while True:
            await self.sleep(FOLLOW_TICK_S)
            for key in sorted(self.tracker.take_dirty()):
                self.state.spawn(self.following.follow(key), f"follow-{key[0]}")
            if self.mono() - last_sweep >= SWEEP_EVERY_S:
                last_sweep = self.mono()
                await self.following.sweep()

    # ------------------------------------------------------------------ stopping

    async def stop(self) -> None:
        """Cancel every task in flight (orders, follows, clean-ups) and close the broker stream."""
        await self.state.cancel_tasks()
        if self.uplink.stream is not None:
            await self.uplink.stream.close()
