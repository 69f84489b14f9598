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
from dataclasses import dataclass, field
from typing import Any

from extender.agent import preflight
from extender.agent import status as st
from extender.agent import wire
from extender.agent.attempts import order_from_jobs, rendezvous_address
from extender.agent.config import AgentConfig, default_identity
from extender.agent.encode import LabelFilter, ReportBuilder
from extender.agent.metrics import AgentMetrics
from extender.agent.model import AttemptKey, Order
from extender.agent.stream import Stream, StreamClosed, open_channel
from extender.agent.tracker import Tracker
from extender.agent.validate import validate_order
from extender.agent.workloads import DISPATCH_ANNOTATION, Workloads
from extender.inventory import Inventory
from extender.reservations import is_hold, parse_reservation
from extender.kube import Backoff, KubeClient, KubeError

__all__ = ["Agent", "AGENT_VERSION", "default_identity"]

log = logging.getLogger("tandem.agent")

AGENT_VERSION = "0.2.0"
_TERMINAL = ("SUCCEEDED", "FAILED")


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


class Agent:
    """Runs inventory, leadership, the broker stream and the workloads of one cluster."""

    def __init__(
        self, config: AgentConfig, inventory: Inventory, kube: KubeClient | None, *, read_only: bool = False,
        identity: str | None = None, clock: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random,
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
        self.labels = LabelFilter.build(ext.topology.keys,
                                        extra_keys=[k for k in config.report_labels if not k.endswith("*")],
                                        extra_prefixes=[k[:-1] for k in config.report_labels if k.endswith("*")])
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
            except Exception:  # noqa: BLE001 - one attempt's failure must not stop the agent
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

    # ------------------------------------------------------------------ start checks

    async def preflight(self) -> None:
        """The start checks (RBAC by access reviews, PriorityClasses, the server version); KubeError to retry."""
        if self.kube is not None:
            try:
                self.kubernetes_version = await self.kube.server_version()
                self.refused = await preflight.refused_tenants(self.kube, self.config)
                self.missing_classes = await preflight.missing_priority_classes(self.kube, self.config)
            except KubeError:
                log.exception("start checks failed; retrying later")
                raise
        self.preflight_done.set()

    # ------------------------------------------------------------------ what the cluster holds

    def known_attempts(self) -> list[wire.KnownAttempt]:
        """Every attempt the cluster holds (Jobs, pods, reservations) for Hello's reconciliation."""
        keys: dict[AttemptKey, str] = {}
        for cm in self.inv.objects("ConfigMap"):
            if is_hold(cm):
                continue  # nodes kept for an attempt not dispatched yet: no workload to reconcile
            data = cm.get("data") or {}
            attempt = str(data.get("attempt", ""))
            if data.get("job") and attempt.isascii() and attempt.isdigit():
                keys[(str(data["job"]), int(attempt))] = str(data.get("dispatch", ""))
        for key in self.tracker.attempts():
            jobs = self.tracker.jobs(key)
            dispatch = next((str((j["metadata"].get("annotations") or {}).get(DISPATCH_ANNOTATION, ""))
                             for j in jobs), "")
            keys[key] = dispatch or keys.get(key, "")
        for key, a in self.attempts.items():
            if a.order is not None and not a.finished_at:
                keys.setdefault(key, a.order.dispatch_id)
        return [wire.KnownAttempt(k, self._view(k)[0] if self._order(k) else "CREATING", d)
                for k, d in sorted(keys.items())]

    def _view(self, key: AttemptKey) -> tuple[str, st.AttemptView | None]:
        """(phase to report, the status view): GATED only once every pod is also pinned to its node."""
        order = self._order(key)
        if order is None:
            return "CREATING", None
        pods = self.tracker.pods(key)
        a = self._state(key)
        names, not_ready = self._nodes()
        view = st.attempt_view(order, pods, self.tracker.jobs(key), names, self.config, now=self.clock(),
                               first_seen=a.pull_errors, not_ready_since=not_ready,
                               deleted_by_agent=a.cancelling or a.finished_at is not None)
        a.pull_errors = dict(view.first_seen)
        phase = str(view.phase)
        if phase == "GATED" and not st.pin_state(pods, order).ready_to_start:
            phase = "CREATING"
        return phase, view

    def _nodes(self) -> tuple[frozenset[str], dict[str, float]]:
        """Names of every node, and since when each NotReady one is (first seen so by this agent)."""
        snap = self.inv.snapshot()
        now = self.clock()
        not_ready = {f.name: self._not_ready.get(f.name, now) for f in snap.facts if not f.node.ready}
        self._not_ready = not_ready
        return frozenset(snap.names), not_ready

    # ------------------------------------------------------------------ broker orders

    async def dispatch(self, order: Order) -> wire.Rejection | None:
        """Validate and create one dispatched attempt; None when accepted (idempotent per dispatch id)."""
        key = order.key
        async with self._lock(order.job_id):
            rejection = await self._accept(order)
            outcome = "accepted" if rejection is None else rejection.reason
            self.metrics.dispatches.labels(outcome).inc()
            ns = self.config.namespace_for(order.tenant, order.namespace_hint) or ""
            self._send(dispatch_ack=wire.dispatch_ack(key, namespace=ns if rejection is None else "",
                                                      rejection=rejection, inventory_sequence=order.inventory_sequence))
            if rejection is None:
                log.info("dispatch accepted", extra={"job": order.job_id, "attempt": order.attempt,
                                                     "tenant": order.tenant, "namespace": ns})
                a = self._state(key)
                a.order, a.namespace = order, ns
                self.tracker.dirty.add(key)
                for drain in (False, True):  # its own reservation holds its nodes now
                    if self.work is not None and self._holds(key, drain):
                        await self._quietly(self.work.delete_hold(key, drain=drain), "deleting the hold", key)
            else:
                log.info("dispatch rejected", extra={"job": order.job_id, "attempt": order.attempt, "detail": {
                    "reason": rejection.reason, "message": rejection.message}})
            return rejection

    async def _accept(self, order: Order) -> wire.Rejection | None:
        if self.read_only or self.work is None:
            return wire.Rejection("AGENT_NOT_READY", "read-only agent: it creates nothing in this cluster")
        if not self.ready:
            return wire.Rejection("AGENT_NOT_READY", "the agent's inventory is not synced yet")
        namespace = self.config.namespace_for(order.tenant, order.namespace_hint)
        if namespace is None:
            return wire.Rejection("TENANT_NOT_ALLOWED", f"cluster {self.config.cluster_name} maps no namespace to "
                                  f"tenant {order.tenant}")
        if order.tenant in self.refused:
            return wire.Rejection("TENANT_NOT_ALLOWED", self.refused[order.tenant])
        newer = [k for k in self.tracker.attempts() | set(self.attempts)
                 if k[0] == order.job_id and k[1] > order.attempt]
        if newer:
            return wire.Rejection("STALE_ATTEMPT", f"attempt {max(k[1] for k in newer)} of {order.job_id} is "
                                  f"already here")
        cls = self.config.priority_class(order.priority_band, order.preemptible)
        if cls in self.missing_classes:
            return wire.Rejection("TEMPLATE_INVALID", f"PriorityClass {cls} (band {order.priority_band}) does not "
                                  "exist in this cluster")
        mine = [j for j in self.tracker.jobs(order.key)
                if (j["metadata"].get("annotations") or {}).get(DISPATCH_ANNOTATION) == order.dispatch_id]
        if len(mine) == len(order.pod_sets):
            return None  # a duplicate of a dispatch already carried out: accepted again, nothing created twice
        held = any(r.gang == (order.job_id, str(order.attempt)) and r.dispatch_id == order.dispatch_id
                   for r in self.inv.reservations())
        if not mine and not held:
            rejection = validate_order(order, self.inv.snapshot(), self.config.extender.topology.keys)
            if rejection is not None:
                return rejection
        # Partly created (a restart mid-create): finish it; its pods already count against the quota.
        return await self.work.create(order, namespace, resuming=bool(mine) or held)

    async def hold(self, msg: wire.HoldMsg) -> None:
        """Keep nodes for an attempt whose victims are leaving (best effort: it expires on its own)."""
        if self.read_only or self.work is None:
            return
        async with self._lock(msg.key[0]):
            if self._order(msg.key) is not None:
                return  # dispatched already: its own reservation holds the nodes
            await self._quietly(self.work.write_hold(msg.key, msg.pod_sets, msg.expires_at, msg.dispatch_id,
                                                     drain=msg.drain), "writing the hold", msg.key)

    def _holds(self, key: AttemptKey, drain: bool = False) -> bool:
        """The inventory has seen a hold for the attempt (one written a moment ago may be missed: it expires)."""
        name = Workloads.hold_name(key, drain)
        return any(r.key[1] == name for r in self.inv.reservations())

    async def release_hold(self, key: AttemptKey, drain: bool = False) -> None:
        if self.read_only or self.work is None:
            return
        async with self._lock(key[0]):
            await self._quietly(self.work.delete_hold(key, drain=drain), "deleting the hold", key)

    async def _quietly(self, op: Any, what: str, key: AttemptKey) -> None:
        try:
            await op
        except Exception as e:  # noqa: BLE001 - a hold is best effort: it expires, the dispatch checks the fit
            log.warning(f"{what} failed", extra={"job": key[0], "detail": repr(e)})

    async def start(self, key: AttemptKey) -> None:
        """Lift the gates of an attempt (its first start group), only if every pod is pinned and gated."""
        async with self._lock(key[0]):
            order = self._order(key)
            a = self._state(key)
            pods = self.tracker.pods(key)
            if order is None or self.work is None:
                self._report_failed(key, "INFRA_FAILED", "Start for an attempt this cluster does not hold")
                return
            pin = st.pin_state(pods, order)
            if not pin.ready_to_start:
                self._report_failed(key, "INFRA_FAILED", f"gang incomplete at Start: {pin.problem}")
                return
            a.start_received = self.mono()
            groups = list(self.work.renderer.start_groups(order))
            first, a.pending_groups = groups[0], groups[1:]
            errors = await self.work.ungate([p for p in pods if _pod_set(p) in first])
            if errors:
                self._report_failed(key, "INFRA_FAILED", "lifting the gates failed: " + "; ".join(errors[:3]))
                return
            if not a.pending_groups:
                self.metrics.time_to_ungate.observe(self.mono() - a.start_received)
            log.info("gang started", extra={"job": key[0], "attempt": key[1], "pods": len(pods)})
            jobs = self.tracker.jobs(key)
            await self.work.event(jobs[0] if jobs else None, "TandemStarted", f"gates lifted on Start of attempt {key[1]}")

    def _report_failed(self, key: AttemptKey, outcome: str, message: str) -> None:
        a = self._state(key)
        report = wire.WorkloadReport(key, "FAILED", namespace=a.namespace, outcome=outcome, message=message)
        a.terminal_sequence = self._send(workload_status=wire.workload_status(report, self.clock()))
        a.sent = ("FAILED", outcome, message)
        log.warning("attempt failed", extra={"job": key[0], "attempt": key[1], "detail": {"message": message}})

    async def cancel(self, key: AttemptKey, grace_s: float | None, reason: str) -> None:
        """Delete an attempt (A-6): CancelAck IN_PROGRESS now, DELETED once every pod is gone."""
        async with self._lock(key[0]):
            a = self._state(key)
            jobs, pods = self.tracker.jobs(key), self.tracker.pods(key)
            has_reservation = any(r.gang == (key[0], str(key[1])) for r in self.inv.reservations())
            if self.work is None or (not jobs and not pods and not has_reservation and a.order is None):
                self._send(cancel_ack=wire.cancel_ack(key, "NOT_FOUND", "nothing of this attempt exists here"))
                return
            namespace = a.namespace or _namespace_of(jobs, pods)
            try:
                await self.work.teardown(key, namespace, jobs, pods, grace_s)
            except KubeError as e:
                self._send(cancel_ack=wire.cancel_ack(key, "FAILED", f"deleting the workload failed: {e}"))
                return
            a.cancelling = True
            a.namespace = namespace
            self._send(cancel_ack=wire.cancel_ack(key, "IN_PROGRESS", f"deleting ({reason})"))
            await self.work.event(jobs[0] if jobs else None, "TandemCancelled", f"deleted on the broker's order: {reason}")
            self.tracker.dirty.add(key)

    # ------------------------------------------------------------------ following the cluster

    async def follow(self, key: AttemptKey) -> None:
        """Act on what the cluster shows of one attempt: pin, continue a staged start, drop the consumed
        reservation, finish deletions, clean up after an acknowledged end, and report what changed."""
        async with self._lock(key[0]):
            a = self._state(key)
            if a.cancelling or a.finished_at is not None:
                if self.tracker.gone(key) and self.work is not None:
                    await self.work.finish(key, a.namespace, _claim_templates(self._order(key)))
                    if a.cancelling:
                        self._send(cancel_ack=wire.cancel_ack(key, "DELETED", "every pod is gone"))
                    self.attempts.pop(key, None)
                return
            order = self._order(key)
            if order is None:
                return
            pods = self.tracker.pods(key)
            phase, view = self._view(key)
            assert view is not None
            if self.work is not None and phase == "CREATING":
                pin = st.pin_state(pods, order)
                if pin.to_pin:
                    errors = await self.work.pin(pin.to_pin)
                    if errors:
                        log.warning("pinning failed", extra={"job": key[0], "detail": errors[:3]})
            if a.pending_groups and self.work is not None:
                await self._next_group(key, a, pods)
            if phase == "RUNNING" and not a.reservation_dropped and self.work is not None:
                await self.work.delete_reservation(key)  # every replica bound: the holds are consumed
                a.reservation_dropped = True
            self._report(key, a, phase, view, pods)

    async def _next_group(self, key: AttemptKey, a: _Attempt, pods: list[dict[str, Any]]) -> None:
        started = {p for g in self._started_groups(a) for p in g}
        running = [p for p in pods if _pod_set(p) in started]
        if running and all((p.get("status") or {}).get("phase") == "Running" for p in running):
            group = a.pending_groups.pop(0)
            assert self.work is not None
            await self.work.ungate([p for p in pods if _pod_set(p) in group])
            if not a.pending_groups and a.start_received is not None:
                self.metrics.time_to_ungate.observe(self.mono() - a.start_received)

    def _started_groups(self, a: _Attempt) -> list[tuple[str, ...]]:
        assert a.order is not None and self.work is not None
        groups = list(self.work.renderer.start_groups(a.order))
        return groups[: len(groups) - len(a.pending_groups)]

    def _report(self, key: AttemptKey, a: _Attempt, phase: str, view: st.AttemptView,
                pods: list[dict[str, Any]]) -> None:
        replicas = view.replicas
        signature = (phase, tuple((r.pod, r.node, r.phase, r.exit_code) for r in replicas), view.outcome)
        order = a.order
        if signature != a.sent and self.stream is not None:
            report = wire.WorkloadReport(
                key, phase, replicas, a.namespace or _namespace_of(self.tracker.jobs(key), pods),
                rendezvous_address(order) if order else "",
                str(view.outcome) if phase in _TERMINAL and view.outcome else "",
                view.exit_code, view.message)
            seq = self._send(workload_status=wire.workload_status(report, self.clock()))
            if seq:
                a.sent = signature
                self.metrics.statuses.labels(phase).inc()
                if phase in _TERMINAL:
                    a.terminal_sequence = seq
        feedback = [f for f in st.scheduling_feedback(pods) if a.feedback.get(f.pod) != f.message]
        if feedback and self.stream is not None:
            # Stamped when seen: the condition's lastTransitionTime stays at the pod's creation while its
            # status stays False (SchedulingGated -> Unschedulable), older than the broker's last transition.
            now = self.clock()
            items = [wire.PodFeedback(key, f.pod_set, f.index, f.pod, f.reason, f.message, now) for f in feedback]
            if self._send(scheduling_feedback=wire.scheduling_feedback(items)):
                a.feedback.update({f.pod: f.message for f in feedback})

    async def acknowledged(self, sequence: int) -> None:
        """The broker committed our messages up to `sequence`: clean up attempts whose end it now knows."""
        for key, a in list(self.attempts.items()):
            if a.terminal_sequence and a.terminal_sequence <= sequence and a.finished_at is None:
                a.finished_at = self.mono()
                self._spawn(self._clean_finished(key), f"clean-{key[0]}-{key[1]}")

    async def _clean_finished(self, key: AttemptKey) -> None:
        await self.sleep(self.config.finished_retention_s)
        async with self._lock(key[0]):
            if self.work is None:
                return
            a = self._state(key)
            jobs, pods = self.tracker.jobs(key), self.tracker.pods(key)
            await self.work.teardown(key, a.namespace or _namespace_of(jobs, pods), jobs, pods, None)
            self.tracker.dirty.add(key)

    async def sweep_holds(self) -> None:
        """Delete holds past their expiry (the extender already ignores them; this keeps the namespace clean)."""
        if self.read_only or self.work is None:
            return  # (a replica that is not the leader is refused by the workloads' guard: nothing happens)
        now = self.clock()
        for cm in self.inv.objects("ConfigMap"):
            if not is_hold(cm):
                continue
            try:
                held = parse_reservation(cm)
            except Exception:  # noqa: BLE001 - unreadable: it holds nothing the extender honours
                continue
            if held.expired(now):
                key = (held.job, int(held.attempt))
                drain = held.key[1] == Workloads.hold_name(key, True)
                await self._quietly(self.work.delete_hold(key, drain=drain), "deleting an expired hold", key)

    async def autonomy(self) -> None:
        """Without a live stream an attempt still gated past its start deadline can never be started: delete
        it (A-13). Running attempts are never touched on the agent's own authority."""
        await self.sweep_holds()
        if self.stream is not None or self.work is None or self.stream_lost_at is None:
            return
        now = self.clock()
        for key in sorted(self.tracker.attempts()):
            order = self._order(key)
            a = self._state(key)
            if order is None or a.cancelling or a.finished_at is not None:
                continue
            if now <= order.start_deadline + self.config.gated_grace_s:
                continue
            pods = self.tracker.pods(key)
            if pods and all(st.is_gated(p) for p in pods):
                log.warning("deleting a gated attempt no broker can start", extra={"job": key[0],
                                                                                   "detail": {"attempt": key[1]}})
                async with self._lock(key[0]):
                    await self.work.teardown(key, _namespace_of(self.tracker.jobs(key), pods),
                                             self.tracker.jobs(key), pods, None)
                    a.finished_at = self.mono()

    # ------------------------------------------------------------------ the broker stream

    async def session(self, epoch: int) -> None:
        """One broker stream, from Hello to its end (raises StreamClosed with the status)."""
        channel = open_channel(self.config)
        stream = Stream(channel, self.config, self.clock)
        try:
            hello = wire.hello(self.config, self.known_attempts(), epoch=epoch, identity=self.identity,
                               instance_id=self.instance_id, kubernetes_version=self.kubernetes_version,
                               agent_version=AGENT_VERSION, dispatch=not self.read_only)
            welcome = await stream.open(hello)
            self.stream = stream
            self.stream_lost_at = None
            self.metrics.connected.set(1)
            log.info("broker stream open", extra={"detail": {"session": welcome.session_id, "epoch": epoch,
                                                             "obsolete": len(welcome.obsolete)}})
            for key in welcome.obsolete:
                self._spawn(self.cancel(key, None, "replaced by the broker"), f"obsolete-{key[0]}")
            builder = ReportBuilder(self.labels)
            self._send_snapshot(builder, stream)
            for a in self.attempts.values():
                a.sent = None  # a new stream (maybe a restarted broker) hears every attempt's status again
            self.tracker.dirty.update(self.tracker.attempts())
            reporter = asyncio.get_running_loop().create_task(self._report_loop(builder, stream, welcome.heartbeat_s))
            try:
                async for sequence, msg in stream.messages():
                    self._on_message(builder, stream, sequence, msg)
            finally:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
        finally:
            if self.stream is stream:
                self.stream = None
                self.stream_lost_at = self.mono()
            self.metrics.connected.set(0)
            await stream.close()
            await channel.close()

    def _on_message(self, builder: ReportBuilder, stream: Stream, sequence: int,
                    msg: wire.Inbound | wire.WireError) -> None:
        if isinstance(msg, wire.WireError):
            log.warning("broker message not usable", extra={"detail": str(msg)})
            if msg.key is not None:
                self._send(dispatch_ack=wire.dispatch_ack(msg.key, rejection=wire.Rejection(
                    "TEMPLATE_INVALID", str(msg))))
        elif isinstance(msg, Order):
            self._spawn(self.dispatch(msg), f"dispatch-{msg.job_id}")
        elif isinstance(msg, wire.StartMsg):
            self._spawn(self.start(msg.key), f"start-{msg.key[0]}")
        elif isinstance(msg, wire.CancelMsg):
            self._spawn(self.cancel(msg.key, msg.grace_s, msg.reason), f"cancel-{msg.key[0]}")
        elif isinstance(msg, wire.HoldMsg):
            self._spawn(self.hold(msg), f"hold-{msg.key[0]}")
        elif isinstance(msg, wire.ReleaseHoldMsg):
            self._spawn(self.release_hold(msg.key, msg.drain), f"release-hold-{msg.key[0]}")
        elif isinstance(msg, wire.AckMsg):
            self._spawn(self.acknowledged(msg.sequence), "ack")
        elif isinstance(msg, wire.ResyncMsg):
            if msg.inventory:
                self._send_snapshot(builder, stream)
            if msg.workloads:
                for a in self.attempts.values():
                    a.sent = None
                self.tracker.dirty.update(self.tracker.attempts())
        stream.applied_upto(sequence)

    def _reservation_keys(self) -> list[AttemptKey]:
        return sorted((r.job, int(r.attempt)) for r in self.inv.reservations())

    def _send_snapshot(self, builder: ReportBuilder, stream: Stream) -> None:
        snap = self.inv.snapshot()
        report = builder.snapshot(snap.facts, self._reservation_keys(), self.clock(),
                                  applied_broker_sequence=stream.applied)
        self._send(inventory_snapshot=report)
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
                delta = builder.delta(snap.facts, self._reservation_keys(), self.clock(),
                                      applied_broker_sequence=stream.applied)
                if delta is not None:
                    self._send(inventory_delta=delta)
                    self.metrics.reports.labels("delta").inc()
                    self.metrics.report_bytes.observe(delta.ByteSize())
            if self.mono() - last_beat >= heartbeat_s:
                last_beat = self.mono()
                self._send(heartbeat=wire.heartbeat(stream.applied, builder.sequence, not self.read_only))

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

    # ------------------------------------------------------------------ the loops

    async def follow_loop(self) -> None:
        """React to every change of Tandem's pods and Jobs; sweep for deadlines now and then."""
        last_sweep = self.mono()
        while True:
            await self.sleep(0.05)
            for key in sorted(self.tracker.take_dirty()):
                self._spawn(self.follow(key), f"follow-{key[0]}")
            if self.mono() - last_sweep >= 2.0:
                last_sweep = self.mono()
                self.inv.expire_reservations()
                await self.autonomy()
                self.tracker.dirty.update(k for k, a in self.attempts.items() if a.cancelling or a.pending_groups)

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.stream is not None:
            await self.stream.close()


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
