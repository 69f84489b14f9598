"""The shipped Prometheus alerts (dashboards/tandem-alerts.yaml) and the label-cardinality rule of every metric.

* the file is a well-formed prometheus-operator PrometheusRule, one group per process, the expected alerts;
* every alert expression names only metrics the code exports (and the group's own process exports them);
* no metric any process registers has a label carrying job or pod identity (cardinality stays per tenant /
  cluster / reason, never per job or pod).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tests.metric_names import exported, exported_names, label_names, registries

ALERTS = Path(__file__).resolve().parents[1] / "dashboards" / "tandem-alerts.yaml"
EXPECTED = {
    "tandem-broker": {
        "TandemBrokerDown",
        "TandemClusterReportStale",
        "TandemDispatchRejections",
        "TandemOldestQueuedJob",
        "TandemPreemptionRate",
    },
    "tandem-extender": {"TandemExtenderFilterSlow"},
}
GROUP_PROCESS = {"tandem-broker": "broker", "tandem-extender": "extender"}
SCRAPER_METRICS = {"up"}
"""Series Prometheus itself writes per scrape target (not exported by our code)."""

FORBIDDEN_LABELS = {
    "job_id",
    "job",
    "job_name",
    "job_set",
    "pod",
    "pod_name",
    "node",
    "node_name",
    "attempt",
    "replica",
    "namespace",
    "uid",
}
_IDENTITY = re.compile(r"(^|_)(job|pod)s?(_|$)")
"""Also any label that is a job or pod name by another spelling (victim_job, pod_uid, ...)."""

_DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")
_PROMQL_OPERATORS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
}


def metric_names_in(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers left once strings, label matchers, range / subquery
    brackets and grouping clauses are gone, that are neither a function call nor an operator keyword."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    idents = re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", e)
    return {i for i in idents if i not in _PROMQL_OPERATORS}


def _labels_in(expr: str) -> set[str]:
    """Label names an expression keeps or matches on (grouping clauses and label matchers)."""
    out: set[str] = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        out |= {g.strip() for g in group.split(",") if g.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        out |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return out


def _doc() -> dict[str, Any]:
    doc = yaml.safe_load(ALERTS.read_text())
    assert isinstance(doc, dict)
    return doc


def _rules() -> list[tuple[str, dict[str, Any]]]:
    return [(g["name"], r) for g in _doc()["spec"]["groups"] for r in g["rules"]]


def test_metric_name_extraction_sees_through_promql_syntax() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, verb) (rate(tandem_x_bucket{verb="filter",le!="+Inf"}[5m]))) '
        '> 0.005 or absent(up{job="tandem-broker"}) and on (cluster) tandem_y_total offset 1h'
    )
    assert metric_names_in(expr) == {"tandem_x_bucket", "up", "tandem_y_total"}
    assert _labels_in(expr) == {"le", "verb", "job", "cluster"}


def test_the_alerts_file_is_a_prometheus_rule_with_the_expected_alerts() -> None:
    doc = _doc()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "tandem-alerts"
    assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "tandem"
    groups = doc["spec"]["groups"]
    assert [g["name"] for g in groups] == list(EXPECTED)
    for g in groups:
        assert {r["alert"] for r in g["rules"]} == EXPECTED[g["name"]], g["name"]
    names = [r["alert"] for _, r in _rules()]
    assert len(names) == len(set(names)), names
    assert "scrape job" in ALERTS.read_text().split("apiVersion:")[0]  # the header explains the `job` label


@pytest.mark.parametrize("group,rule", _rules(), ids=lambda x: x["alert"] if isinstance(x, dict) else x)
def test_every_rule_is_complete(group: str, rule: dict[str, Any]) -> None:
    assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
    assert re.fullmatch(r"Tandem[A-Z][A-Za-z]+", rule["alert"])
    assert isinstance(rule["expr"], str) and rule["expr"].strip()
    assert _DURATION.match(str(rule["for"])), rule["for"]
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    ann = rule["annotations"]
    assert set(ann) >= {"summary", "description"}
    assert all(isinstance(ann[k], str) and ann[k].strip() for k in ("summary", "description"))
    # A templated label must survive the expression (kept by its grouping or fixed by a matcher).
    used = set(re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", ann["summary"] + ann["description"]))
    assert used <= _labels_in(rule["expr"]), (rule["alert"], sorted(used - _labels_in(rule["expr"])))


@pytest.mark.parametrize("group,rule", _rules(), ids=lambda x: x["alert"] if isinstance(x, dict) else x)
def test_every_expression_names_only_exported_metrics(group: str, rule: dict[str, Any]) -> None:
    used = metric_names_in(rule["expr"])
    assert used, rule["expr"]
    ours = {n for n in used if n not in SCRAPER_METRICS}
    assert ours <= exported_names(), (rule["alert"], sorted(ours - exported_names()))
    # ... and the group's own process is the one exporting them.
    own = exported(registries()[GROUP_PROCESS[group]])
    assert ours <= own, (rule["alert"], group, sorted(ours - own))
    # Same view as the dashboards test: every tandem_* token is a real series.
    assert set(re.findall(r"\btandem_[a-z0-9_]+", rule["expr"])) == ours


def offenders(registry: CollectorRegistry) -> dict[str, set[str]]:
    return {
        name: bad
        for name, labels in label_names(registry).items()
        if (bad := {lab for lab in labels if lab in FORBIDDEN_LABELS or _IDENTITY.search(lab)})
    }


@pytest.mark.parametrize("process", sorted(registries()))
def test_no_metric_label_carries_job_or_pod_identity(process: str) -> None:
    registry = registries()[process]
    labels = label_names(registry)
    # The walk saw every family the registry exports (a missed collector would be a silent pass).
    assert set(labels) == {f.name for f in registry.collect()}
    assert labels and any(labels.values()), process
    assert offenders(registry) == {}, process


def test_label_names_are_read_even_before_any_series_exists() -> None:
    regs = registries()
    assert label_names(regs["broker"])["tandem_broker_queue_length"] == {"tenant"}
    assert label_names(regs["broker"])["tandem_queue_oldest_wait_seconds"] == {"tenant"}
    assert label_names(regs["broker"])["tandem_broker_pending_gpu_demand"] == {"tenant", "gpu_model"}
    assert label_names(regs["extender"])["tandem_extender_request_seconds"] == {"verb"}
    assert label_names(regs["agent"])["tandem_agent_kube_api_errors"] == {"code"}  # custom collector


class _PodCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("tandem_x_pod_age_seconds", "x", labels=["pod_uid"])
        family.add_metric(["abc"], 1.0)
        yield family


def test_the_cardinality_check_catches_a_job_or_pod_label() -> None:
    r = CollectorRegistry()
    Counter("tandem_x_total", "x", ["tenant", "job_id"], registry=r)
    Gauge("tandem_x_gauge", "x", ["cluster", "victim_job"], registry=r)
    Gauge("tandem_x_ok", "x", ["tenant", "cluster"], registry=r)
    r.register(_PodCollector())
    assert offenders(r) == {
        "tandem_x": {"job_id"},
        "tandem_x_gauge": {"victim_job"},
        "tandem_x_pod_age_seconds": {"pod_uid"},
    }
