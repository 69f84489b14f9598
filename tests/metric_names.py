"""What the processes export to Prometheus: metric names (as queried) and each metric's label names.

Shared by the dashboard and alert tests: every registry the code builds (broker, extender, agent), each
fresh, so nothing leaks between tests.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from broker.metrics import Metrics as BrokerMetrics
from extender.agent.metrics import AgentMetrics
from extender.app import Metrics as ExtenderMetrics
from extender.config import ExtenderConfig
from extender.inventory import Inventory

__all__ = ["SUFFIXES", "exported", "exported_names", "label_names", "registries"]

SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("_sum", "_count", ""),
}
_SERIES_LABELS = {"le", "quantile"}
"""Labels prometheus_client adds to a histogram's / summary's series (not ours)."""


def registries() -> dict[str, CollectorRegistry]:
    """A fresh registry per process kind, every collector registered (the agent's API-error reader has data so
    its custom collector yields a labelled sample)."""
    agent = AgentMetrics()
    agent.watch_api_errors(lambda: {500: 1})
    return {
        "broker": BrokerMetrics().registry,
        "agent": agent.registry,
        "extender": ExtenderMetrics(Inventory(ExtenderConfig()), clock=lambda: 0.0).registry,
    }


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry exposes (counters with _total, histograms with their three series)."""
    names: set[str] = set()
    for family in registry.collect():
        names |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
    return names


def exported_names() -> set[str]:
    return set().union(*(exported(r) for r in registries().values()))


def label_names(registry: CollectorRegistry) -> dict[str, frozenset[str]]:
    """Family name -> the label names its series carry, for every collector in the registry.

    prometheus_client metrics declare their label names (read even when no child exists yet); a custom
    collector's are read from the samples it yields, so it must yield at least one."""
    out: dict[str, set[str]] = {}
    for collector in list(registry._collector_to_names):  # no public way to list a registry's collectors
        if isinstance(collector, MetricWrapperBase):
            declared = frozenset(collector._labelnames)
            for family in collector.describe():
                out.setdefault(family.name, set()).update(declared)
        else:
            for family in collector.collect():
                assert family.samples, f"custom collector family {family.name} yielded no sample to read labels from"
                for sample in family.samples:
                    out.setdefault(family.name, set()).update(set(sample.labels) - _SERIES_LABELS)
    return {name: frozenset(labels) for name, labels in out.items()}
