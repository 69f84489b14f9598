"""The shipped Grafana dashboards query only metric names the code really exports (broker, extender, agent)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.metric_names import exported_names

DASHBOARDS = sorted((Path(__file__).resolve().parents[1] / "dashboards").glob("*.json"))


def test_there_are_dashboards() -> None:
    assert [p.name for p in DASHBOARDS] == ["tandem-broker.json", "tandem-cluster.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_names_only_exported_metrics(path: Path) -> None:
    doc = json.loads(path.read_text())
    names = exported_names()
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert exprs and all(p["targets"] for p in doc["panels"])
    for expr in exprs:
        used = set(re.findall(r"\btandem_[a-z0-9_]+", expr))
        assert used, expr
        assert used <= names, (path.name, expr, sorted(used - names))
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
