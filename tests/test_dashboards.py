"""The shipped Grafana dashboards query only metric names the code really exports (broker, extender, agent)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from broker.metrics import Metrics as BrokerMetrics
from extender.agent.metrics import AgentMetrics
from extender.app import Metrics as ExtenderMetrics
from extender.config import ExtenderConfig
from extender.inventory import Inventory

DASHBOARDS = sorted((Path(__file__).resolve().parents[1] / "dashboards").glob("*.json"))
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
             "summary": ("_sum", "_count", "")}


def _exported(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
    return names


def exported() -> set[str]:
    agent = AgentMetrics()
    agent.watch_api_errors(lambda: {})
    registries = [BrokerMetrics().registry, agent.registry,
                  ExtenderMetrics(Inventory(ExtenderConfig()), clock=lambda: 0.0).registry]
    return set().union(*(_exported(r) for r in registries))


def test_there_are_dashboards() -> None:
    assert [p.name for p in DASHBOARDS] == ["tandem-broker.json", "tandem-cluster.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_names_only_exported_metrics(path: Path) -> None:
    doc = json.loads(path.read_text())
    names = exported()
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert exprs and all(p["targets"] for p in doc["panels"])
    for expr in exprs:
        used = set(re.findall(r"\btandem_[a-z0-9_]+", expr))
        assert used, expr
        assert used <= names, (path.name, expr, sorted(used - names))
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
