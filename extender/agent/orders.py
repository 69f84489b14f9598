"""The agent carrying out the broker's orders: Dispatch, Hold, ReleaseHold, Start and Cancel."""

from __future__ import annotations

import logging

from extender.agent import status as st
from extender.agent import wire
from extender.agent.model import AttemptKey, Order
from extender.agent.state import AgentState, _namespace_of, _pod_set
from extender.agent.validate import validate_order
from extender.agent.workloads import DISPATCH_ANNOTATION, Workloads
from extender.kube import KubeError

__all__ = ["Orders"]

log = logging.getLogger("tandem.agent")


class Orders(AgentState):
    """Dispatch / Hold / ReleaseHold / Start / Cancel for this cluster, each under its job's lock."""

    # ------------------------------------------------------------------ broker orders

    async def dispatch(self, order: Order) -> wire.Rejection | None:
        """Validate and create one dispatched attempt; None when accepted (idempotent per dispatch id)."""
        key = order.key
        async with self._lock(order.job_id):
            rejection = await self._accept(order)
            outcome = "accepted" if rejection is None else rejection.reason
            self.metrics.dispatches.labels(outcome).inc()
            ns = self.config.namespace_for(order.tenant, order.namespace_hint) or ""
            self._send(
                dispatch_ack=wire.dispatch_ack(
                    key,
                    namespace=ns if rejection is None else "",
                    rejection=rejection,
                    inventory_sequence=order.inventory_sequence,
                )
            )
            if rejection is None:
                log.info(
                    "dispatch accepted",
                    extra={"job": order.job_id, "attempt": order.attempt, "tenant": order.tenant, "namespace": ns},
                )
                a = self._state(key)
                a.order, a.namespace = order, ns
                self.tracker.dirty.add(key)
                for drain in (False, True):  # its own reservation holds its nodes now
                    if self.work is not None and self._holds(key, drain):
                        await self._quietly(self.work.delete_hold(key, drain=drain), "deleting the hold", key)
            else:
                log.info(
                    "dispatch rejected",
                    extra={
                        "job": order.job_id,
                        "attempt": order.attempt,
                        "detail": {"reason": rejection.reason, "message": rejection.message},
                    },
                )
            return rejection

    async def _accept(self, order: Order) -> wire.Rejection | None:
        if self.read_only or self.work is None:
            return wire.Rejection("AGENT_NOT_READY", "read-only agent: it creates nothing in this cluster")
        if not self.ready:
            return wire.Rejection("AGENT_NOT_READY", "the agent's inventory is not synced yet")
        namespace = self.config.namespace_for(order.tenant, order.namespace_hint)
        if namespace is None:
            return wire.Rejection(
                "TENANT_NOT_ALLOWED", f"cluster {self.config.cluster_name} maps no namespace to tenant {order.tenant}"
            )
        if order.tenant in self.refused:
            return wire.Rejection("TENANT_NOT_ALLOWED", self.refused[order.tenant])
        newer = [
            k for k in self.tracker.attempts() | set(self.attempts) if k[0] == order.job_id and k[1] > order.attempt
        ]
        if newer:
            return wire.Rejection(
                "STALE_ATTEMPT", f"attempt {max(k[1] for k in newer)} of {order.job_id} is already here"
            )
        cls = self.config.priority_class(order.priority_band, order.preemptible)
        if cls in self.missing_classes:
            return wire.Rejection(
                "TEMPLATE_INVALID", f"PriorityClass {cls} (band {order.priority_band}) does not exist in this cluster"
            )
        mine = [
            j
            for j in self.tracker.jobs(order.key)
            if (j["metadata"].get("annotations") or {}).get(DISPATCH_ANNOTATION) == order.dispatch_id
        ]
        if len(mine) == len(order.pod_sets):
            return None  # a duplicate of a dispatch already carried out: accepted again, nothing created twice
        held = any(
            r.gang == (order.job_id, str(order.attempt)) and r.dispatch_id == order.dispatch_id
            for r in self.inv.reservations()
        )
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
            await self._quietly(
                self.work.write_hold(msg.key, msg.pod_sets, msg.expires_at, msg.dispatch_id, drain=msg.drain),
                "writing the hold",
                msg.key,
            )

    def _holds(self, key: AttemptKey, drain: bool = False) -> bool:
        """The inventory has seen a hold for the attempt (one written a moment ago may be missed: it expires)."""
        name = Workloads.hold_name(key, drain)
        return any(r.key[1] == name for r in self.inv.reservations())

    async def release_hold(self, key: AttemptKey, drain: bool = False) -> None:
        if self.read_only or self.work is None:
            return
        async with self._lock(key[0]):
            await self._quietly(self.work.delete_hold(key, drain=drain), "deleting the hold", key)

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
            await self.work.event(
                jobs[0] if jobs else None, "TandemStarted", f"gates lifted on Start of attempt {key[1]}"
            )

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
            await self.work.event(
                jobs[0] if jobs else None, "TandemCancelled", f"deleted on the broker's order: {reason}"
            )
            self.tracker.dirty.add(key)
