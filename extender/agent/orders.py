"""The agent carrying out the broker's orders: Dispatch, Hold, ReleaseHold, Start and Cancel."""

from __future__ import annotations

import logging

from extender.agent import status as st
from extender.agent import wire
from extender.agent.metrics import AgentMetrics
from extender.agent.model import AttemptKey, Order
from extender.agent.render import DISPATCH_ANNOTATION
from extender.agent.state import AgentState, Uplink, best_effort, namespace_of, pod_set_of
from extender.agent.validate import validate_order
from extender.agent.workloads import Workloads
from extender.kube import KubeError

__all__ = ["Orders"]

log = logging.getLogger("tandem.agent")


class Orders:
    """Dispatch / Hold / ReleaseHold / Start / Cancel for this cluster, each under its job's lock.

    Writes to the cluster through `work` (None: a read-only agent, which creates nothing) and answers on
    `uplink`; what it learns of an attempt goes into the shared `state`."""

    def __init__(self, state: AgentState, work: Workloads | None, uplink: Uplink, metrics: AgentMetrics) -> None:
        self.state = state
        self.work = work
        self.uplink = uplink
        self.metrics = metrics

    async def dispatch(self, order: Order) -> wire.Rejection | None:
        """Validate and create one dispatched attempt; None when accepted (idempotent per dispatch id)."""
        key = order.key
        async with self.state.lock(order.job_id):
            rejection = await self._accept(order)
            outcome = "accepted" if rejection is None else rejection.reason
            self.metrics.dispatches.labels(outcome).inc()
            ns = self.state.config.namespace_for(order.tenant, order.namespace_hint) or ""
            self.uplink.send(
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
                a = self.state.record(key)
                a.order, a.namespace = order, ns
                self.state.tracker.dirty.add(key)
                for drain in (False, True):  # its own reservation holds its nodes now
                    if self.work is not None and self._holds(key, drain):
                        await best_effort(self.work.delete_hold(key, drain=drain), "deleting the hold", key)
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
        if self.state.read_only or self.work is None:
            return wire.Rejection("AGENT_NOT_READY", "read-only agent: it creates nothing in this cluster")
        if not self.state.ready:
            return wire.Rejection("AGENT_NOT_READY", "the agent's inventory is not synced yet")
        namespace = self.state.config.namespace_for(order.tenant, order.namespace_hint)
        if namespace is None:
            return wire.Rejection(
                "TENANT_NOT_ALLOWED",
                f"cluster {self.state.config.cluster_name} maps no namespace to tenant {order.tenant}",
            )
        if order.tenant in self.state.checks.refused:
            return wire.Rejection("TENANT_NOT_ALLOWED", self.state.checks.refused[order.tenant])
        newer = [
            k
            for k in self.state.tracker.attempts() | set(self.state.attempts)
            if k[0] == order.job_id and k[1] > order.attempt
        ]
        if newer:
            return wire.Rejection(
                "STALE_ATTEMPT", f"attempt {max(k[1] for k in newer)} of {order.job_id} is already here"
            )
        cls = self.state.config.priority_class(order.priority_band, order.preemptible)
        if cls in self.state.checks.missing_classes:
            return wire.Rejection(
                "TEMPLATE_INVALID", f"PriorityClass {cls} (band {order.priority_band}) does not exist in this cluster"
            )
        mine = [
            j
            for j in self.state.tracker.jobs(order.key)
            if (j["metadata"].get("annotations") or {}).get(DISPATCH_ANNOTATION) == order.dispatch_id
        ]
        if len(mine) == len(order.pod_sets):
            return None  # a duplicate of a dispatch already carried out: accepted again, nothing created twice
        held = any(
            r.gang == (order.job_id, str(order.attempt)) and r.dispatch_id == order.dispatch_id
            for r in self.state.inv.reservations()
        )
        if not mine and not held:
            rejection = validate_order(order, self.state.inv.snapshot(), self.state.config.extender.topology.keys)
            if rejection is not None:
                return rejection
        # Partly created (a restart mid-create): finish it; its pods already count against the quota.
        return await self.work.create(order, namespace, resuming=bool(mine) or held)

    async def hold(self, msg: wire.HoldMsg) -> None:
        """Keep nodes for an attempt whose victims are leaving (best effort: it expires on its own)."""
        if self.state.read_only or self.work is None:
            return
        async with self.state.lock(msg.key[0]):
            if self.state.order(msg.key) is not None:
                return  # dispatched already: its own reservation holds the nodes
            await best_effort(
                self.work.write_hold(msg.key, msg.pod_sets, msg.expires_at, msg.dispatch_id, drain=msg.drain),
                "writing the hold",
                msg.key,
            )

    def _holds(self, key: AttemptKey, drain: bool = False) -> bool:
        """The inventory has seen a hold for the attempt (one written a moment ago may be missed: it expires)."""
        name = Workloads.hold_name(key, drain)
        return any(r.key[1] == name for r in self.state.inv.reservations())

    async def release_hold(self, key: AttemptKey, drain: bool = False) -> None:
        if self.state.read_only or self.work is None:
            return
        async with self.state.lock(key[0]):
            await best_effort(self.work.delete_hold(key, drain=drain), "deleting the hold", key)

    async def start(self, key: AttemptKey) -> None:
        """Lift the gates of an attempt (its first start group), only if every pod is pinned and gated."""
        async with self.state.lock(key[0]):
            order = self.state.order(key)
            a = self.state.record(key)
            pods = self.state.tracker.pods(key)
            if order is None or self.work is None:
                self._report_failed(key, "INFRA_FAILED", "Start for an attempt this cluster does not hold")
                return
            pin = st.pin_state(pods, order)
            if not pin.ready_to_start:
                self._report_failed(key, "INFRA_FAILED", f"gang incomplete at Start: {pin.problem}")
                return
            a.start_received = self.state.mono()
            groups = list(self.work.renderer.start_groups(order))
            first, a.pending_groups = groups[0], groups[1:]
            errors = await self.work.ungate([p for p in pods if pod_set_of(p) in first])
            if errors:
                self._report_failed(key, "INFRA_FAILED", "lifting the gates failed: " + "; ".join(errors[:3]))
                return
            if not a.pending_groups:
                self.metrics.time_to_ungate.observe(self.state.mono() - a.start_received)
            log.info("gang started", extra={"job": key[0], "attempt": key[1], "pods": len(pods)})
            jobs = self.state.tracker.jobs(key)
            await self.work.event(
                jobs[0] if jobs else None, "TandemStarted", f"gates lifted on Start of attempt {key[1]}"
            )

    def _report_failed(self, key: AttemptKey, outcome: str, message: str) -> None:
        a = self.state.record(key)
        report = wire.WorkloadReport(key, "FAILED", namespace=a.namespace, outcome=outcome, message=message)
        a.terminal_sequence = self.uplink.send(workload_status=wire.workload_status(report, self.state.clock()))
        a.sent = ("FAILED", outcome, message)
        log.warning("attempt failed", extra={"job": key[0], "attempt": key[1], "detail": {"message": message}})

    async def cancel(self, key: AttemptKey, grace_s: float | None, reason: str) -> None:
        """Delete an attempt (A-6): CancelAck IN_PROGRESS now, DELETED once every pod is gone."""
        async with self.state.lock(key[0]):
            a = self.state.record(key)
            jobs, pods = self.state.tracker.jobs(key), self.state.tracker.pods(key)
            has_reservation = any(r.gang == (key[0], str(key[1])) for r in self.state.inv.reservations())
            if self.work is None or (not jobs and not pods and not has_reservation and a.order is None):
                self.uplink.send(cancel_ack=wire.cancel_ack(key, "NOT_FOUND", "nothing of this attempt exists here"))
                return
            namespace = a.namespace or namespace_of(jobs, pods)
            try:
                await self.work.teardown(key, namespace, jobs, pods, grace_s)
            except KubeError as e:
                self.uplink.send(cancel_ack=wire.cancel_ack(key, "FAILED", f"deleting the workload failed: {e}"))
                return
            a.cancelling = True
            a.namespace = namespace
            self.uplink.send(cancel_ack=wire.cancel_ack(key, "IN_PROGRESS", f"deleting ({reason})"))
            await self.work.event(
                jobs[0] if jobs else None, "TandemCancelled", f"deleted on the broker's order: {reason}"
            )
            self.state.tracker.dirty.add(key)
