"""The pin the agent writes (a metadata.name field requirement in every required term) is what the extender reads."""

from __future__ import annotations

from typing import Any

import pytest

from extender.config import ExtenderConfig
from extender.podreq import gang_of, pinned_node
from tests.extender.extender_builders import gang_pod


def _with_terms(*terms: dict[str, Any]) -> dict[str, Any]:
    pod = gang_pod("p", "train", "1", 8)
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }
    return pod


RACK = {"key": "network.example.com/rack", "operator": "In", "values": ["r7"]}
PIN = {"key": "metadata.name", "operator": "In", "values": ["node-0007"]}


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        ([{"matchExpressions": [RACK], "matchFields": [PIN]}], "node-0007"),
        ([{"matchExpressions": [RACK]}], None),  # domain affinity only: not pinned yet
        ([{"matchFields": [PIN]}, {"matchFields": [PIN]}], "node-0007"),
        ([{"matchFields": [PIN]}, {"matchExpressions": [RACK]}], None),  # terms are ORed: the second one widens
        ([{"matchFields": [PIN]}, {"matchFields": [{**PIN, "values": ["node-0008"]}]}], None),
        ([{"matchFields": [{**PIN, "values": ["node-0007", "node-0008"]}]}], None),
        ([{"matchFields": [{**PIN, "operator": "NotIn"}]}], None),
    ],
)
def test_pinned_node_reads_the_field_requirement_in_every_term(
    terms: list[dict[str, Any]], expected: str | None
) -> None:
    assert pinned_node(_with_terms(*terms)) == expected


def test_the_hostname_label_is_never_taken_for_the_node_name() -> None:
    """Node names may differ from their hostname labels (node-0007 vs h100-r7-n1): only the name pins."""
    pod = gang_pod("p", "train", "1", 8)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "h100-r7-n1"}
    assert gang_of(pod, ExtenderConfig()) is not None
    assert gang_of(pod, ExtenderConfig()).node is None  # type: ignore[union-attr]
    pod = _with_terms({"matchExpressions": [RACK], "matchFields": [PIN]})
    pod["metadata"]["labels"].update({"tandem.dev/pod-set": "workers", "batch.kubernetes.io/job-completion-index": "3"})
    ref = gang_of(pod, ExtenderConfig())
    assert ref is not None and (ref.node, ref.pod_set, ref.index) == ("node-0007", "workers", 3)
