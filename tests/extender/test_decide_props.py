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


def _replicated_inventory():  # type: ignore[no-untyped-def]
    from tests.extender.extender_builders import node

    extra = []
    for base in ("h100-r1-n2", "h100-r2-n1", "t4-1", "a100-mig-1", "gb200-r5-n2", "h100-notready"):
        for c in range(3):
            extra.append(node(base, name=f"{base}-copy{c}", labels={"network.example.com/rack": f"rk{c}"}))
    return make_inventory(extra)


REPL = _replicated_inventory()


@settings(max_examples=120, deadline=None)
@given(
    gpus=st.integers(0, 9),
    cpu=st.sampled_from(["1", "8", "150"]),
    model=st.sampled_from([None, "NVIDIA-H100-80GB-HBM3", "Tesla-T4"]),
    rack=st.sampled_from([None, "rk1", "r2"]),
    mig=st.sampled_from([None, "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb"]),
)
def test_equivalence_classes_give_the_same_verdicts_as_checking_each_node(
    gpus: int, cpu: str, model: str | None, rack: str | None, mig: str | None
) -> None:
    from extender.decide import query_for
    from extender.nodefit import QueryMemo, check_node

    sel = {}
    if model:
        sel["nvidia.com/gpu.product"] = model
    if rack:
        sel["network.example.com/rack"] = rack
    p = pod(
        "p",
        gpus=0 if mig else gpus,
        cpu=cpu,
        memory="1Gi",
        node_selector=sel or None,
        extra={mig: "2"} if mig else None,
    )
    snap = REPL.snapshot()
    q = query_for(p, REPL)
    memo = QueryMemo(q)
    for f in snap.facts:
        assert check_node(f, q, snap.evaluator, memo) == check_node(f, q, snap.evaluator), f.name
    classed = [f for f in snap.facts if f.sig_id >= 0]
    assert classed
    if q.shape.wants_gpu and rack is None:  # copies differ only in name and rack: they share
        assert len(memo.by_class) < len(classed)


def _many_copies():  # type: ignore[no-untyped-def]
    from tests.extender.extender_builders import node

    extra = [
        node(base, name=f"{base}-x{c}", labels={"network.example.com/rack": f"rk{c % 3}"})
        for base in ("h100-r1-n2", "h100-r2-n1", "t4-1", "a100-mig-1", "gb200-r5-n2", "h100-notready", "cpu-1")
        for c in range(8)
    ]
    return make_inventory(extra)


MANY = _many_copies()


@settings(max_examples=80, deadline=None)
@given(
    gpus=st.integers(0, 9),
    cpu=st.sampled_from(["1", "8", "150"]),
    model=st.sampled_from([None, "NVIDIA-H100-80GB-HBM3", "Tesla-T4"]),
    rack=st.sampled_from([None, "rk1", "r2"]),
    mig=st.sampled_from([None, "nvidia.com/mig-3g.40gb"]),
    share=st.sampled_from([None, "300"]),
)
def test_class_scatter_matches_per_node_verdicts(
    gpus: int, cpu: str, model: str | None, rack: str | None, mig: str | None, share: str | None
) -> None:
    import numpy as np

    from extender.decide import _query_for
    from extender.nodefit import check_node
    from extender.snapshot import code_name

    sel = {k: v for k, v in (("nvidia.com/gpu.product", model), ("network.example.com/rack", rack)) if v}
    extra = {mig: "1"} if mig else ({"tandem.dev/gpu-milli": share} if share else None)
    p = pod("p", gpus=0 if (mig or share) else gpus, cpu=cpu, memory="1Gi", node_selector=sel or None, extra=extra)
    snap = MANY.snapshot()
    q = _query_for(p, MANY)
    sv = snap.verdict(q)
    sv.ensure(np.arange(len(snap.facts), dtype=np.intp))
    for i, f in enumerate(snap.facts):
        v = check_node(f, q, snap.evaluator)
        assert bool(sv.ok[i]) == v.ok, f.name
        if not v.ok:
            assert v.reason is not None
            assert bool(sv.unresolvable[i]) == v.unresolvable
            assert code_name(int(sv.codes[i])) == v.reason.code
            assert sv.frags[i] == snap.name_json[i] + b":" + orjson.dumps(v.message)


def _spaced(obj: object) -> bytes:
    """The same request as a non-Go client might write it: spaces, so no raw-bytes shortcut applies."""
    import json

    return json.dumps(obj, separators=(", ", ": ")).encode()


def _replies(inv, body: bytes) -> tuple[dict, list]:  # type: ignore[no-untyped-def, type-arg]
    f = orjson.loads(decide_filter(inv, parse_extender_args(body)).body)
    p = orjson.loads(decide_prioritize(inv, parse_extender_args(body)).body)
    return f, p


@settings(max_examples=120, deadline=None)
@given(
    names=st.lists(st.sampled_from(ALL_NODES + ["ghost-1"]), min_size=1, max_size=25),
    gpus=st.integers(0, 9),
    big=st.booleans(),
)
def test_raw_bytes_path_gives_the_replies_of_the_decoded_path(names: list[str], gpus: int, big: bool) -> None:
    # Go-shaped bodies take the table lookup, the echo and (big) the lazy decoding; spaced bodies
    # are decoded whole and looked up name by name. The replies must be the same.
    if all(n.startswith("ghost") for n in names):
        names = names + [ALL_NODES[0]]
    p = pod("p", gpus=gpus, cpu="8", memory="1Gi")
    if big:
        p["metadata"]["annotations"] = {"note": "x" * 20000}
    fast_f, fast_p = _replies(INV, orjson.dumps(args(p, names)))
    slow_f, slow_p = _replies(INV, _spaced(args(p, names)))
    assert fast_f == slow_f and fast_p == slow_p


def test_refusals_of_every_node_match_one_request_per_node() -> None:
    # All-node requests take refusals joined once per (version, query); each one-node request
    # is checked on its own. Same reason per node, same split between the two maps.
    p = pod("p", gpus=4, cpu="8", memory="1Gi")
    everyone, _ = _replies(REPL, orjson.dumps(args(p, list(reversed(REPL.snapshot().names)))))
    for name in REPL.snapshot().names:
        alone = orjson.loads(decide_filter(REPL, parse_extender_args(_spaced(args(p, [name, "ghost-1"])))).body)
        for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
            assert everyone[key].get(name) == alone[key].get(name), (key, name)
        assert (name in everyone["NodeNames"]) == (name in alone["NodeNames"])


def test_refusals_of_every_node_follow_the_inventory() -> None:
    from tests.extender.extender_builders import node

    inv = make_inventory([node("h100-r1-n2", name=f"spare-{i}") for i in range(3)])
    p = pod("p", gpus=8, cpu="8", memory="1Gi")
    names = list(inv.snapshot().names)
    before = orjson.loads(decide_filter(inv, parse_extender_args(orjson.dumps(args(p, names)))).body)
    assert "spare-1" in before["NodeNames"]
    inv.apply("Pod", "ADDED", pod("hog", gpus=8, cpu="8", memory="1Gi", node_name="spare-1", phase="Running"))
    after = orjson.loads(decide_filter(inv, parse_extender_args(orjson.dumps(args(p, names)))).body)
    assert "spare-1" not in after["NodeNames"] and "spare-1" in after["FailedNodes"]
    assert {k: v for k, v in after["FailedNodes"].items() if k != "spare-1"} == before["FailedNodes"]
    assert after["FailedAndUnresolvableNodes"] == before["FailedAndUnresolvableNodes"]


@settings(max_examples=40, deadline=None)
@given(gpus=st.integers(1, 8), cpu=st.sampled_from(["1", "8", "150"]), seed=st.integers(0, 100), mig=st.booleans())
def test_prioritize_after_an_all_node_filter_scores_as_computed_afresh(
    gpus: int, cpu: str, seed: int, mig: bool
) -> None:
    import random

    # The prioritize that follows a filter naming every node gets the fitting nodes' scores once
    # per version; a spaced body (no shortcut) computes them for its own candidates.
    p = pod("p", gpus=0 if mig else gpus, cpu=cpu, memory="1Gi", extra={"nvidia.com/mig-3g.40gb": "1"} if mig else None)
    names = list(MANY.snapshot().names)
    random.Random(seed).shuffle(names)
    passed = orjson.loads(decide_filter(MANY, parse_extender_args(orjson.dumps(args(p, names)))).body)["NodeNames"]
    if not passed:
        return
    shuffled = list(passed)
    random.Random(seed + 1).shuffle(shuffled)  # another order than the filter's reply: not remembered
    for order in (passed, shuffled):
        body = args(p, order)
        remembered = orjson.loads(decide_prioritize(MANY, parse_extender_args(orjson.dumps(body))).body)
        fresh = orjson.loads(decide_prioritize(MANY, parse_extender_args(_spaced(body))).body)
        assert remembered == fresh
    from extender.decide import query_for

    assert MANY.snapshot().verdict(query_for(p, MANY))._fit_scores is not None  # the shortcut was taken


def test_fitting_scores_follow_the_inventory() -> None:
    from tests.extender.extender_builders import node

    inv = make_inventory([node("h100-r1-n2", name=f"spare-{i}") for i in range(3)])
    p = pod("p", gpus=4, cpu="8", memory="1Gi")
    names = list(inv.snapshot().names)

    def pair() -> dict[str, int]:
        passed = orjson.loads(decide_filter(inv, parse_extender_args(orjson.dumps(args(p, names)))).body)["NodeNames"]
        reply = decide_prioritize(inv, parse_extender_args(orjson.dumps(args(p, passed)))).body
        fresh = decide_prioritize(inv, parse_extender_args(_spaced(args(p, passed)))).body
        assert orjson.loads(reply) == orjson.loads(fresh)
        return {e["Host"]: e["Score"] for e in orjson.loads(reply)}

    before = pair()
    inv.apply("Pod", "ADDED", pod("half", gpus=4, cpu="8", memory="1Gi", node_name="spare-1", phase="Running"))
    after = pair()
    assert set(before) >= set(after) and after != before
