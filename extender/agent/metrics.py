"""The agent's Prometheus metrics (no job or pod names in any label: cardinality stays per cluster)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["AgentMetrics"]


class _ApiErrors(Collector):
    """Failed kube API requests by HTTP status, read from the client's own counters."""

    def __init__(self, read: Callable[[], Mapping[int, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "tandem_agent_kube_api_errors", "Failed Kubernetes API requests by code", labels=["code"]
        )
        for code, n in sorted(self._read().items()):
            family.add_metric([str(code)], n)
        yield family


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.dispatches = Counter(
            "tandem_agent_dispatches_total",
            "Dispatches by outcome (accepted or the reject reason)",
            ["outcome"],
            registry=r,
        )
        self.time_to_ungate = Histogram(
            "tandem_agent_time_to_ungate_seconds",
            "Start received to every gate lifted",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.leader = Gauge("tandem_agent_leader", "1 while this replica holds the agent Lease", registry=r)
        self.connected = Gauge("tandem_agent_broker_connected", "1 while a broker stream is live", registry=r)
        self.reports = Counter("tandem_agent_inventory_reports_total", "Inventory reports sent", ["kind"], registry=r)
        self.report_bytes = Histogram(
            "tandem_agent_inventory_report_bytes",
            "Size of one inventory report",
            buckets=(1e3, 1e4, 1e5, 1e6, 4e6, 16e6, 64e6),
            registry=r,
        )
        self.statuses = Counter(
            "tandem_agent_workload_statuses_total", "WorkloadStatus messages by phase", ["phase"], registry=r
        )
        self.reconnects = Counter(
            "tandem_agent_broker_reconnects_total", "Broker streams that ended", ["code"], registry=r
        )

    def watch_api_errors(self, read: Callable[[], Mapping[int, int]]) -> None:
        self.registry.register(_ApiErrors(read))
