"""Prometheus metrics of the broker (own registry, served on a side port).

The gauges refreshed at scrape cadence read the fleet from a `FleetView` taken for the refresh and the
queue from the placer's job book and holds, never the catalog: they run between placement cycles, but a
reader outside the decision seam gets the same frozen snapshot the API does.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from broker.scheduling.fairness import tenant_usage
from broker.scheduling.placer_book import JobBook
from broker.scheduling.placer_holds import Holds
from fleetplan.view import FleetView

__all__ = ["Metrics"]

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class Metrics:
    """Every broker metric; a fresh registry per instance so tests and several hubs never collide."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queue_length = Gauge("tandem_broker_queue_length", "Queued jobs", ["tenant"], registry=r)
        self.oldest_wait = Gauge(
            "tandem_queue_oldest_wait_seconds",
            "Age (now - submission) of the tenant's oldest queued job",
            ["tenant"],
            registry=r,
        )
        self.pending_gpus = Gauge(
            "tandem_broker_pending_gpu_demand", "GPUs wanted by queued jobs", ["tenant", "gpu_model"], registry=r
        )
        self.reserved_gpus = Gauge(
            "tandem_broker_reserved_gpus", "GPUs held by placed jobs per cluster", ["cluster"], registry=r
        )
        self.time_to_placement = Histogram(
            "tandem_broker_time_to_placement_seconds",
            "Submission (or re-queue) to reservation",
            buckets=_LATENCY,
            registry=r,
        )
        self.time_to_start = Histogram(
            "tandem_broker_time_to_start_seconds", "Submission to RUNNING", buckets=_LATENCY, registry=r
        )
        self.decision_seconds = Histogram(
            "tandem_broker_decision_seconds", "One placement decision", buckets=_LATENCY, registry=r
        )
        self.dispatch_rejections = Counter(
            "tandem_broker_dispatch_rejections_total", "Rejected dispatches", ["cluster"], registry=r
        )
        self.retries = Counter("tandem_broker_attempt_retries_total", "Attempts after the first", registry=r)
        self.foreign_messages = Counter(
            "tandem_broker_agent_foreign_messages_total",
            "Agent messages about an attempt not dispatched to that cluster (ignored)",
            ["cluster"],
            registry=r,
        )
        self.staleness_seconds = Gauge(
            "tandem_broker_catalog_staleness_seconds", "Age of the last report", ["cluster"], registry=r
        )
        self.commit_batch = Histogram(
            "tandem_broker_commit_batch_size",
            "Requests per group commit",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.fair_share = Gauge(
            "tandem_broker_fair_share_cost", "Water-filled fair share (GPUs x model weight)", ["tenant"], registry=r
        )
        self.actual_share = Gauge(
            "tandem_broker_usage_cost", "Cost held now (GPUs x model weight)", ["tenant"], registry=r
        )
        self.demand = Gauge(
            "tandem_broker_demand_cost", "Cost held plus cost queued (GPUs x model weight)", ["tenant"], registry=r
        )
        self.borrowed_gpus = Gauge(
            "tandem_broker_borrowed_gpus", "GPUs held above quota", ["tenant", "gpu_model"], registry=r
        )
        self.preemptions = Counter(
            "tandem_broker_preemptions_total", "Jobs preempted by the broker, by rule", ["reason"], registry=r
        )
        self.preemption_lost = Counter(
            "tandem_broker_preemption_lost_gpu_hours_total",
            "GPU-hours of work lost to preemption (since start or last checkpoint)",
            ["tenant"],
            registry=r,
        )
        self.preemption_holds = Gauge(
            "tandem_broker_preemption_holds", "Waiting jobs holding nodes while their victims leave", registry=r
        )
        self.domain_holds = Counter(
            "tandem_broker_domain_holds_total", "Domains held for long-waiting gangs", registry=r
        )
        self.held_domains = Gauge("tandem_broker_held_domains", "Domains held now for draining gangs", registry=r)
        self.held_idle_gpus = Gauge(
            "tandem_broker_held_idle_gpus", "Idle GPUs kept by held domains (charged to their gangs)", registry=r
        )
        self.preemption_timeouts = Counter(
            "tandem_broker_preemption_timeouts_total",
            "Preemptions whose victims did not free the nodes in time",
            registry=r,
        )
        self.submissions = Counter(
            "tandem_broker_submissions_total", "Submitted items by outcome", ["outcome"], registry=r
        )

    def placed(self, job: Any, now: float) -> None:
        self.time_to_placement.observe(max(0.0, now - job.update_time))
        if job.attempt >= 1:
            self.retries.inc()

    def started(self, job: Any) -> None:
        self.time_to_start.observe(max(0.0, job.update_time - job.create_time))

    def rejected(self, cluster: str) -> None:
        self.dispatch_rejections.labels(cluster).inc()

    def staleness(self, fleet: FleetView) -> None:
        """Age of each cluster's last report at the snapshot's time (-1: none yet)."""
        for name, state in fleet.clusters.items():
            age = max(0.0, fleet.now - state.last_report) if state.last_report else -1
            self.staleness_seconds.labels(name).set(age)

    def refresh_queue(self, book: JobBook, now: float | None = None) -> None:
        """Recompute queue gauges from the placer's job book (called on scrape cadence by the hub).

        Tenants with nothing queued drop out of every per-tenant queue gauge (cleared, not set to 0)."""
        now = book.clock() if now is None else now
        self.queue_length.clear()
        self.pending_gpus.clear()
        self.oldest_wait.clear()
        counts: dict[str, int] = {}
        oldest: dict[str, float] = {}
        demand: dict[tuple[str, str], float] = {}
        for job in book.queued.values():
            counts[job.tenant] = counts.get(job.tenant, 0) + 1
            oldest[job.tenant] = min(oldest.get(job.tenant, job.create_time), job.create_time)
            for model in job.gpu_models or ("any",):
                key = (job.tenant, model)
                demand[key] = demand.get(key, 0.0) + job.gpus / max(len(job.gpu_models), 1)
        for tenant, n in counts.items():
            self.queue_length.labels(tenant).set(n)
        for tenant, since in oldest.items():
            self.oldest_wait.labels(tenant).set(max(0.0, now - since))
        for (tenant, model), gpus in demand.items():
            self.pending_gpus.labels(tenant, model).set(gpus)
        self.reserved_gpus.clear()
        for cluster, gpus in book.held_gpus_by_cluster().items():
            self.reserved_gpus.labels(cluster).set(gpus)

    def preempted(self, reason: str, tenant: str, lost_gpu_hours: float) -> None:
        self.preemptions.labels(reason).inc()
        self.preemption_lost.labels(tenant).inc(lost_gpu_hours)

    def refresh_shares(self, book: JobBook, holds: Holds) -> None:
        """Fair share, usage, demand and borrowed GPUs per tenant, and preemption holds (scrape cadence)."""
        snap, shares = book.shares()
        for g in (self.fair_share, self.actual_share, self.demand, self.borrowed_gpus):
            g.clear()
        for row in tenant_usage(snap, shares):
            self.fair_share.labels(row.tenant).set(row.fair_share_cost)
            self.actual_share.labels(row.tenant).set(row.usage_cost)
            self.demand.labels(row.tenant).set(row.demand_cost)
            for model, gpus in row.borrowed.items():
                self.borrowed_gpus.labels(row.tenant, model).set(gpus)
        self.preemption_holds.set(len(holds.preempting))
        self.held_domains.set(len(holds.drains))
        self.held_idle_gpus.set(sum(h.idle_gpus for h in holds.drains.holds.values()))

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
