"""The agent following the cluster: what it holds per attempt, pins, staged starts, clean-up and status reports."""

from __future__ import annotations

import logging
from typing import Any

from extender.agent import status as st
from extender.agent import wire
from extender.agent.attempts import rendezvous_address
from extender.agent.metrics import AgentMetrics
from extender.agent.model import AttemptKey
from extender.agent.render import DISPATCH_ANNOTATION
from extender.agent.state import (
    AgentState,
    AttemptRecord,
    Uplink,
    best_effort,
    claim_template_names,
    namespace_of,
    pod_set_of,
)
from extender.agent.workloads import Workloads
from extender.reservations import is_hold, parse_reservation

__all__ = ["Following"]

log = logging.getLogger("tandem.agent")
_TERMINAL = ("SUCCEEDED", "FAILED")


class Following:
    """Act on what the cluster shows of each attempt and report it; the agent's loops call it.

    Reads the cluster through the shared `state` (inventory, tracker), writes through `work` (None: a
    read-only agent) and reports on `uplink`."""

    def __init__(self, state: AgentState, work: Workloads | None, uplink: Uplink, metrics: AgentMetrics) -> None:
        self.state = state
        self.work = work
        self.uplink = uplink
        self.metrics = metrics
        self._not_ready: dict[str, float] = {}
        """node -> since when this agent has seen it NotReady."""

    # ------------------------------------------------------------------ what the cluster holds

    def known_attempts(self) -> list[wire.KnownAttempt]:
        """Every attempt the cluster holds (Jobs, pods, reservations) for Hello's reconciliation."""
        keys: dict[AttemptKey, str] = {}
        for cm in self.state.inv.objects("ConfigMap"):
            if is_hold(cm):
                continue  # nodes kept for an attempt not dispatched yet: no workload to reconcile
            data = cm.get("data") or {}
            attempt = str(data.get("attempt", ""))
            if data.get("job") and attempt.isascii() and attempt.isdigit():
                keys[(str(data["job"]), int(attempt))] = str(data.get("dispatch", ""))
        for key in self.state.tracker.attempts():
            jobs = self.state.tracker.jobs(key)
            dispatch = next(
                (str((j["metadata"].get("annotations") or {}).get(DISPATCH_ANNOTATION, "")) for j in jobs), ""
            )
            keys[key] = dispatch or keys.get(key, "")
        for key, a in self.state.attempts.items():
            if a.order is not None and not a.finished_at:
                keys.setdefault(key, a.order.dispatch_id)
        return [
            wire.KnownAttempt(k, self._view(k)[0] if self.state.order(k) else "CREATING", d)
            for k, d in sorted(keys.items())
        ]

    def _view(self, key: AttemptKey) -> tuple[str, st.AttemptView | None]:
        """(phase to report, the status view): GATED only once every pod is also pinned to its node."""
        order = self.state.order(key)
        if order is None:
            return "CREATING", None
        pods = self.state.tracker.pods(key)
        a = self.state.record(key)
        names, not_ready = self._nodes()
        view = st.attempt_view(
            order,
            pods,
            self.state.tracker.jobs(key),
            names,
            self.state.config,
            now=self.state.clock(),
            first_seen=a.pull_errors,
            not_ready_since=not_ready,
            deleted_by_agent=a.cancelling or a.finished_at is not None,
        )
        a.pull_errors = dict(view.first_seen)
        phase = str(view.phase)
        if phase == "GATED" and not st.pin_state(pods, order).ready_to_start:
            phase = "CREATING"
        return phase, view

    def _nodes(self) -> tuple[frozenset[str], dict[str, float]]:
        """Names of every node, and since when each NotReady one is (first seen so by this agent)."""
        snap = self.state.inv.snapshot()
        now = self.state.clock()
        not_ready = {f.name: self._not_ready.get(f.name, now) for f in snap.facts if not f.node.ready}
        self._not_ready = not_ready
        return frozenset(snap.names), not_ready

    # ------------------------------------------------------------------ following the cluster

    async def follow(self, key: AttemptKey) -> None:
        """Act on what the cluster shows of one attempt: pin, continue a staged start, drop the consumed
        reservation, finish deletions, clean up after an acknowledged end, and report what changed."""
        async with self.state.lock(key[0]):
            a = self.state.record(key)
            if a.cancelling or a.finished_at is not None:
                if self.state.tracker.gone(key) and self.work is not None:
                    await self.work.finish(key, a.namespace, claim_template_names(self.state.order(key)))
                    if a.cancelling:
                        self.uplink.send(cancel_ack=wire.cancel_ack(key, "DELETED", "every pod is gone"))
                    self.state.attempts.pop(key, None)
                return
            order = self.state.order(key)
            if order is None:
                return
            pods = self.state.tracker.pods(key)
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

    async def _next_group(self, key: AttemptKey, a: AttemptRecord, pods: list[dict[str, Any]]) -> None:
        started = {p for g in self._started_groups(a) for p in g}
        running = [p for p in pods if pod_set_of(p) in started]
        if running and all((p.get("status") or {}).get("phase") == "Running" for p in running):
            group = a.pending_groups.pop(0)
            assert self.work is not None
            await self.work.ungate([p for p in pods if pod_set_of(p) in group])
            if not a.pending_groups and a.start_received is not None:
                self.metrics.time_to_ungate.observe(self.state.mono() - a.start_received)

    def _started_groups(self, a: AttemptRecord) -> list[tuple[str, ...]]:
        assert a.order is not None and self.work is not None
        groups = list(self.work.renderer.start_groups(a.order))
        return groups[: len(groups) - len(a.pending_groups)]

    def _report(
        self, key: AttemptKey, a: AttemptRecord, phase: str, view: st.AttemptView, pods: list[dict[str, Any]]
    ) -> None:
        replicas = view.replicas
        signature = (phase, tuple((r.pod, r.node, r.phase, r.exit_code) for r in replicas), view.outcome)
        order = a.order
        if signature != a.sent and self.uplink.is_open:
            report = wire.WorkloadReport(
                key,
                phase,
                replicas,
                a.namespace or namespace_of(self.state.tracker.jobs(key), pods),
                rendezvous_address(order) if order else "",
                str(view.outcome) if phase in _TERMINAL and view.outcome else "",
                view.exit_code,
                view.message,
            )
            seq = self.uplink.send(workload_status=wire.workload_status(report, self.state.clock()))
            if seq:
                a.sent = signature
                self.metrics.statuses.labels(phase).inc()
                if phase in _TERMINAL:
                    a.terminal_sequence = seq
        feedback = [f for f in st.scheduling_feedback(pods) if a.feedback.get(f.pod) != f.message]
        if feedback and self.uplink.is_open:
            # Stamped when seen: the condition's lastTransitionTime stays at the pod's creation while its
            # status stays False (SchedulingGated -> Unschedulable), older than the broker's last transition.
            if self.uplink.send(scheduling_feedback=wire.scheduling_feedback(key, feedback, self.state.clock())):
                a.feedback.update({f.pod: f.message for f in feedback})

    async def acknowledged(self, sequence: int) -> None:
        """The broker committed our messages up to `sequence`: clean up attempts whose end it now knows."""
        for key, a in list(self.state.attempts.items()):
            if a.terminal_sequence and a.terminal_sequence <= sequence and a.finished_at is None:
                a.finished_at = self.state.mono()
                self.state.spawn(self._clean_finished(key), f"clean-{key[0]}-{key[1]}")

    async def _clean_finished(self, key: AttemptKey) -> None:
        await self.state.sleep(self.state.config.finished_retention_s)
        async with self.state.lock(key[0]):
            if self.work is None:
                return
            a = self.state.record(key)
            jobs, pods = self.state.tracker.jobs(key), self.state.tracker.pods(key)
            await self.work.teardown(key, a.namespace or namespace_of(jobs, pods), jobs, pods, None)
            self.state.tracker.dirty.add(key)

    async def sweep_holds(self) -> None:
        """Delete holds past their expiry (the extender already ignores them; this keeps the namespace clean)."""
        if self.state.read_only or self.work is None:
            return  # (a replica that is not the leader is refused by the workloads' guard: nothing happens)
        now = self.state.clock()
        for cm in self.state.inv.objects("ConfigMap"):
            if not is_hold(cm):
                continue
            try:
                held = parse_reservation(cm)
            except Exception:
                continue
            if held.expired(now):
                key = (held.job, int(held.attempt))
                drain = held.key[1] == Workloads.hold_name(key, True)
                await best_effort(self.work.delete_hold(key, drain=drain), "deleting an expired hold", key)

    async def autonomy(self) -> None:
        """Without a live stream an attempt still gated past its start deadline can never be started: delete
        it (A-13). Running attempts are never touched on the agent's own authority."""
        await self.sweep_holds()
        if self.uplink.is_open or self.work is None:
            return
        now = self.state.clock()
        for key in sorted(self.state.tracker.attempts()):
            order = self.state.order(key)
            a = self.state.record(key)
            if order is None or a.cancelling or a.finished_at is not None:
                continue
            if now <= order.start_deadline + self.state.config.gated_grace_s:
                continue
            pods = self.state.tracker.pods(key)
            if pods and all(st.is_gated(p) for p in pods):
                log.warning(
                    "deleting a gated attempt no broker can start", extra={"job": key[0], "detail": {"attempt": key[1]}}
                )
                async with self.state.lock(key[0]):
                    jobs = self.state.tracker.jobs(key)
                    await self.work.teardown(key, namespace_of(jobs, pods), jobs, pods, None)
                    a.finished_at = self.state.mono()

    async def sweep(self) -> None:
        """What time alone changes, run every few seconds: reservations and holds expire, a gated attempt
        passes its deadline, and deletions and staged starts are looked at again without a cluster event."""
        self.state.inv.expire_reservations()
        await self.autonomy()
        self.state.tracker.dirty.update(k for k, a in self.state.attempts.items() if a.cancelling or a.pending_groups)
