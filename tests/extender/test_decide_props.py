"""Properties of the filter over random candidate lists and shapes: exact partition, order kept."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.decide import decide_filter, decide_prioritize
from extender.protocol import parse_extender_args
from tests.extender.extender_builders import args, pod
from tests.extender.extender_support import ALL_NODES, make_inventory

INV = make_inventory()
NAMES = st.lists(st.sampled_from(ALL_NODES + ["ghost-1", "ghost-2"]), min_size=1, max_size=20)


@settings(max_examples=150, deadline=None)
@given(names=NAMES, gpus=st.integers(0, 9), cpu=st.sampled_from(["1", "8", "150", "500"]))
def test_filter_partitions_the_request(names: list[str], gpus: int, cpu: str) -> None:
    body = orjson.dumps(args(pod("p", gpus=gpus, cpu=cpu, memory="1Gi"), names))
    try:
        reply = orjson.loads(decide_filter(INV, parse_extender_args(body)).body)
    except Exception as e:  # only a request naming no known node may be refused as a whole
        assert all(n.startswith("ghost") for n in names), e
        return
    passed = reply["NodeNames"]
    failed, unres = set(reply["FailedNodes"]), set(reply["FailedAndUnresolvableNodes"])
    assert not failed & unres and not (failed | unres) & set(passed)
    assert set(passed) | failed | unres == set(names)  # nothing invented, nothing lost
    assert passed == [n for n in names if n in set(passed)]  # request order kept
    assert not any(n.startswith("ghost") for n in passed)
    if gpus == 0:
        assert set(passed) == {n for n in names if not n.startswith("ghost")}
    scores = orjson.loads(decide_prioritize(INV, parse_extender_args(body)).body)
    assert [e["Host"] for e in scores] == names
    assert all(0 <= e["Score"] <= 10 for e in scores)
    assert all(e["Score"] == 0 for e in scores if e["Host"] not in passed or gpus == 0)
