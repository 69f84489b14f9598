"""Tables for the fake's pure pieces: canonical quantities, patch edge cases, selector parsing, decoding.

These pin behaviour the HTTP tests reach only indirectly, with values the real apimachinery
code produces (resource.Quantity.String(), RFC 6902, strategic merge directives).
"""

from __future__ import annotations

from typing import Any

import pytest

from sim.kubeapi import errors, schema
from sim.kubeapi.patch import PatchError, UnsupportedPatch, json_patch, merge_patch, strategic_merge_patch
from sim.kubeapi.quantities import canonical_quantity
from sim.kubeapi.resources import by_path
from sim.kubeapi.selectors import parse_field_selector, parse_label_selector


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("0.5", "500m"),
        ("1000m", "1"),
        ("1500m", "1500m"),
        ("1.5", "1500m"),
        ("0.1", "100m"),
        ("0.001", "1m"),
        ("1.0", "1"),
        ("0", "0"),
        (1, "1"),
        ("1000", "1k"),
        ("1000k", "1M"),
        ("100M", "100M"),
        ("1024", "1024"),
        ("2048Mi", "2Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("0.5Ki", "512"),
        ("512Ki", "512Ki"),
        ("2113396124Ki", "2113396124Ki"),
        ("1e3", "1e3"),
        ("1e-3", "1e-3"),
    ],
)
def test_quantities_are_written_back_canonically(raw: Any, canonical: str) -> None:
    assert canonical_quantity(raw) == canonical


def test_a_bad_quantity_is_refused() -> None:
    with pytest.raises(ValueError):
        canonical_quantity("12 GB")


def test_json_patch_pointer_escapes_and_errors() -> None:
    doc = {"metadata": {"annotations": {"tandem.dev/dispatch": "a", "x~y": "b"}}}
    out = json_patch(
        doc,
        [
            {"op": "replace", "path": "/metadata/annotations/tandem.dev~1dispatch", "value": "c"},
            {"op": "remove", "path": "/metadata/annotations/x~0y"},
        ],
    )
    assert out == {"metadata": {"annotations": {"tandem.dev/dispatch": "c"}}}
    assert doc["metadata"]["annotations"]["tandem.dev/dispatch"] == "a"  # the input is not touched
    for ops in (
        [{"op": "test", "path": "/metadata", "value": {}}],
        [{"op": "replace", "path": "/nope", "value": 1}],
        [{"op": "add", "path": "/metadata/annotations/a/b", "value": 1}],
        [{"op": "frobnicate", "path": "/"}],
        {"op": "add"},
    ):
        with pytest.raises(PatchError):
            json_patch(doc, ops)


def test_json_patch_test_distinguishes_types() -> None:
    doc = {"spec": {"replicas": 1, "suspend": True}}
    json_patch(doc, [{"op": "test", "path": "/spec/replicas", "value": 1}])
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "test", "path": "/spec/suspend", "value": 1}])


def test_merge_patch_nulls_remove_and_lists_replace() -> None:
    doc = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge_patch(doc, {"a": {"b": None, "c": [3]}, "d": None}) == {"a": {"c": [3]}}


def _pod_node() -> schema.Node:
    node = schema.root_node("", "v1", "Pod")
    assert node is not None
    return node


def test_strategic_merge_directives() -> None:
    doc = {
        "spec": {
            "schedulingGates": [{"name": "a"}, {"name": "b"}],
            "nodeSelector": {"x": "1", "y": "2"},
            "containers": [{"name": "c", "image": "i:1", "env": [{"name": "A", "value": "1"}]}],
        },
        "metadata": {"finalizers": ["f1", "f2"]},
    }
    node = _pod_node()
    replaced = strategic_merge_patch(doc, {"spec": {"nodeSelector": {"$patch": "replace", "z": "3"}}}, node)
    assert replaced["spec"]["nodeSelector"] == {"z": "3"}
    merged = strategic_merge_patch(
        doc, {"spec": {"containers": [{"name": "c", "env": [{"name": "B", "value": "2"}]}]}}, node
    )
    assert merged["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert merged["spec"]["containers"][0]["image"] == "i:1"
    list_replaced = strategic_merge_patch(
        doc, {"spec": {"schedulingGates": [{"$patch": "replace"}, {"name": "c"}]}}, node
    )
    assert list_replaced["spec"]["schedulingGates"] == [{"name": "c"}]
    ordered = strategic_merge_patch(doc, {"metadata": {"$setElementOrder/finalizers": ["f2", "f1"]}}, node)
    assert ordered["metadata"]["finalizers"] == ["f2", "f1"]
    with pytest.raises(UnsupportedPatch):
        strategic_merge_patch(doc, {"spec": {"$unknownDirective": 1}}, node)
    with pytest.raises(PatchError):
        strategic_merge_patch(doc, {"spec": {"schedulingGates": [{"notTheKey": "x"}]}}, node)


@pytest.mark.parametrize("text", ["a in (b", "a in b)", "a b", "in (a)", ",a", "a in ()", "a=b=c"])
def test_malformed_label_selectors(text: str) -> None:
    with pytest.raises(errors.ApiError) as raised:
        parse_label_selector(text)
    assert raised.value.code == 400


def test_field_selector_escapes_and_operators() -> None:
    pods = by_path("", "v1", "pods")
    assert pods is not None
    selector = parse_field_selector(r"metadata.name=a\,b,spec.nodeName!=n1", pods)
    assert selector.matches({"metadata": {"name": "a,b"}, "spec": {"nodeName": "n2"}})
    assert not selector.matches({"metadata": {"name": "a,b"}, "spec": {"nodeName": "n1"}})


def test_decoding_keeps_required_empty_lists_and_drops_optional_ones() -> None:
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {}, "finalizers": []},
        "spec": {"containers": [], "tolerations": [], "securityContext": {}},
    }
    decoded, unknown = schema.decode(_pod_node(), obj)
    assert unknown == []
    assert decoded["metadata"] == {"name": "p"}
    assert decoded["spec"] == {"containers": [], "securityContext": {}}


def test_time_fields_are_truncated_to_seconds_in_utc() -> None:
    node = schema.root_node("", "v1", "Pod")
    assert node is not None
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "status": {"startTime": "2026-12-01T12:00:00.123456+02:00"},
    }
    assert schema.decode(node, obj)[0]["status"]["startTime"] == "2026-12-01T10:00:00Z"
