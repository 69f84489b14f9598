"""The hot path's shortcuts: NodeNames read from the body's bytes, names resolved by the numpy table,
NodeNames decoded lazily, the priorities gathered by numpy. Each must agree with the plain way."""

from __future__ import annotations

import json
import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import protocol
from extender.errors import UndecodableBody
from extender.names import MAX_WIDTH, NameTable, find_raw_names
from extender.protocol import encode_priorities, parse_extender_args
from tests.extender.extender_builders import args, pod
from tests.extender.extender_support import ALL_NODES, make_inventory


def _go(obj: object) -> bytes:
    return orjson.dumps(obj)  # compact, as kube-scheduler's encoder writes


def _resolve(table: NameTable, index: dict[str, int], names: list[str]) -> list[int] | None:
    raw = _go(args(pod("p"), names))
    span = find_raw_names(raw, len(names))
    assert span is not None
    got = table.lookup(raw, span)
    if got is None:
        return None
    rows, left = got
    for j in left.tolist():
        rows[j] = index.get(names[j], -1)
    return [int(r) for r in rows]


def test_raw_names_of_a_go_body_are_the_joined_encodings() -> None:
    names = ["h100-r1-n2", "ünïcode-node", "a,b", "x]y"]
    raw = _go(args(pod("p"), names))
    span = find_raw_names(raw, len(names))
    assert span is not None
    assert raw[span.start : span.end] == b",".join(orjson.dumps(n) for n in names)
    again = find_raw_names(raw)  # the count can be left to the array
    assert again is not None and (again.start, again.end) == (span.start, span.end)
    assert find_raw_names(raw, len(names) + 1) is None


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"Pod": {"metadata": {"name": "p"}, "spec": {}}, "NodeNames": ["a", "b"]}).encode(),  # spaces
        _go({"NodeNames": ["a", "b"], "Pod": {"metadata": {"name": "p"}, "spec": {}}}),  # not the last member
        _go({"Pod": {"metadata": {"name": "p"}, "spec": {}}, "NodeNames": ['we"ird', "b"]}),  # escapes
        _go({"Pod": {"metadata": {"name": "p"}, "spec": {"x": {"NodeNames": ["a"]}}}, "NodeNames": ["a", "b"]}),
        _go({"Pod": {"metadata": {"name": "p"}, "spec": {}}, "NodeNames": []}),
        _go({"Pod": {"metadata": {"name": "p"}, "spec": {}}, "NodeNames": ["a", 1, "b"]}),
        b'{"Pod":{"metadata":{"name":"p"},"spec":{}},"NodeNames":["a\x01","b"]}',  # raw control char
        b'{"Pod":{"metadata":{"name":"p"},"spec":{}},"NodeNames":["a\xff","b"]}',  # not UTF-8
    ],
)
def test_raw_names_refuses_other_shapes(body: bytes) -> None:
    assert find_raw_names(body) is None


NAME = st.text(st.sampled_from("abc-.0129ü"), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    known=st.lists(NAME, min_size=1, max_size=60, unique=True),
    asked=st.lists(NAME, min_size=1, max_size=60),
    picks=st.lists(st.integers(0, 59), max_size=60),
    seed=st.integers(0, 1000),
)
def test_table_lookup_equals_dict_lookup(known: list[str], asked: list[str], picks: list[int], seed: int) -> None:
    names = asked + [known[i % len(known)] for i in picks]
    random.Random(seed).shuffle(names)
    index = {n: i for i, n in enumerate(known)}
    assert _resolve(NameTable(known), index, names) == [index.get(n, -1) for n in names]


def test_table_separates_thousands_of_similar_names_over_levels() -> None:
    known = [f"gpu-node-{i:05d}.zone-{i % 3}.example.internal" for i in range(6000)]
    table = NameTable(known)
    index = {n: i for i, n in enumerate(known)}
    asked = known[::-1] + ["gpu-node-99999.zone-0.example.internal", known[7] + "x", known[7][:-1], "g"]
    assert len(table.levels) > 1  # some names shared a slot at the first level
    assert _resolve(table, index, asked) == [index.get(n, -1) for n in asked]


def test_names_longer_than_the_table_serves_are_left_to_the_dict() -> None:
    assert NameTable(["a" * (MAX_WIDTH + 1), "b"]).lookup(b"", find_raw_names(b'{"NodeNames":["b"]}')) is None  # type: ignore[arg-type]
    table = NameTable(["short", "other"])
    assert _resolve(table, {"short": 0, "other": 1}, ["x" * 200, "other"]) == [-1, 1]


def _big_pod() -> dict[str, object]:
    p = pod("p", gpus=4)
    p["metadata"]["annotations"] = {"note": "x" * (protocol._LAZY_BYTES + 100)}  # type: ignore[index]
    return p


def test_large_bodies_leave_node_names_undecoded_until_asked() -> None:
    names = ALL_NODES + ["ghost"]
    body = _go(args(_big_pod(), names))
    parsed = parse_extender_args(body)
    assert parsed.raw_names is not None and parsed.count == len(names)
    assert parsed.pod == orjson.loads(body)["Pod"]
    assert parsed.node_names == names


def test_large_body_with_a_name_that_is_not_utf8_is_still_undecodable() -> None:
    body = _go(args(_big_pod(), ["h100-r1-n2"])).replace(b'"h100-r1-n2"', b'"h100-\xff"')
    with pytest.raises(UndecodableBody):
        parse_extender_args(body)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.integers(0, len(ALL_NODES) - 1), max_size=40), data=st.data())
def test_numpy_priorities_body_equals_the_joined_entries(rows: list[int], data: st.DataObject) -> None:
    import numpy as np

    snap = make_inventory().snapshot()
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(rows), max_size=len(rows)))
    body = snap.priorities_body(np.array(rows, np.intp), np.array(scores, np.int64))
    assert body == encode_priorities([snap.host_prefix[r] for r in rows], scores)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(0, len(ALL_NODES) - 1), max_size=40))
def test_numpy_names_csv_equals_the_joined_names(rows: list[int]) -> None:
    import numpy as np

    snap = make_inventory().snapshot()
    assert snap.names_csv(np.array(rows, np.intp)) == b",".join(snap.name_json[r] for r in rows)
