"""Regressions: bodies that made the extender answer about nodes it was not asked about, requests it
refused as a whole when it could answer per node (FLEET-NOTES H-6), and bodies that crashed a handler.

"Asked" is what Go's encoding/json reads from the body: top-level keys matched case-insensitively
(Go's folding), the last of duplicate keys winning (`go_fields`). Every test runs over real HTTP.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from extender import protocol, webhook
from extender.app import make_app
from extender.config import ExtenderConfig
from extender.inventory import Inventory
from tests.extender.extender_support import (  # noqa: F401
    ALL_NODES,
    Client,
    client,
    cluster_items,
    fixture_json,
    fixture_pod,
    make_inventory,
    start_client,
)
from tests.extender.test_webhook import PENDING, admission_review, as_created

# ------------------------------------------------------------------------- what Go reads

_GO_SPECIAL = {"\u017f": "S", "\u212a": "K", "\u0131": "I", "\u0130": "I"}
"""Non-ASCII runes Go's JSON key folding maps onto ASCII letters (ToUpper(ToLower(r)))."""


def go_fold(key: str) -> str:
    """Go's encoding/json folding of a key, as far as ASCII field names can tell."""
    return "".join(_GO_SPECIAL.get(c, c.upper() if c.isascii() else c) for c in key)


def go_fields(body: bytes, names: tuple[str, ...] = ("Pod", "Nodes", "NodeNames")) -> dict[str, Any]:
    """The top-level fields Go's decoder fills from `body` (a JSON object): each key matched
    case-insensitively, later keys overwriting earlier ones."""
    objects: list[list[tuple[str, Any]]] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        objects.append(pairs)  # inner objects finish first: the top-level object comes last
        return dict(pairs)

    top = json.loads(body, object_pairs_hook=hook)
    assert isinstance(top, dict)
    want = {go_fold(n): n for n in names}
    out: dict[str, Any] = {}
    for k, v in objects[-1]:
        if go_fold(k) in want:
            out[want[go_fold(k)]] = v
    return out


def asked_names(body: bytes) -> list[str]:
    """The candidate names of an ExtenderArgs body as Go reads them (NodeNames, else Nodes.items)."""
    f = go_fields(body)
    if f.get("NodeNames") is not None:
        return list(f["NodeNames"])
    return [n["metadata"]["name"] for n in (f.get("Nodes") or {}).get("items") or []]


def members(*pairs: tuple[bytes, Any]) -> bytes:
    """A compact JSON object from (raw key text, value) pairs, in order, duplicates kept."""
    return b"{" + b",".join(k + b":" + orjson.dumps(v) for k, v in pairs) + b"}"


# ------------------------------------------------------------------ 1. the remembered list

A, X, B, Y = "h100-r1-n1", "h100-r2-n1", "t4-1", "cpu-1"
PRIMED = [A, Y, B]  # what the priming filter passes (a pod without GPUs passes everywhere)
ASKED = [A, X, B]  # what prioritize is asked about
DECOY = {"NodeNames": PRIMED}


def _decoy_pod(where: str, big: bool) -> dict[str, Any]:
    p = fixture_pod("no-gpu")
    meta, spec = p["metadata"], p["spec"]
    if where == "annotation-key":
        meta["annotations"] = {"NodeNames": PRIMED}
    elif where == "annotation-string":
        meta["annotations"] = {"note": '"NodeNames":["' + '","'.join(PRIMED) + '"]'}
    elif where == "label":  # label values are strings: the key's bytes come escaped
        meta["labels"] = {"NodeNames": '"NodeNames":["' + '","'.join(PRIMED) + '"]'}
    elif where == "container-field":
        spec["containers"][0]["NodeNames"] = PRIMED
    elif where == "container-args":
        spec["containers"][0]["args"] = ["NodeNames", '"NodeNames":[', *PRIMED, '\\"NodeNames\\":["cpu-1"]']
    elif where == "spec-object":
        spec["x"] = DECOY
    else:
        raise AssertionError(where)
    if big:  # past the size where NodeNames are read from the raw bytes without decoding them
        meta.setdefault("annotations", {})["pad"] = "x" * (protocol._LAZY_BYTES + 1000)
    return p


_WHERE = ["annotation-key", "annotation-string", "label", "container-field", "container-args", "spec-object"]
_NAMES = b'"NodeNames"'


def _bodies(p: dict[str, Any]) -> dict[str, bytes]:
    """Ways to write ASKED as the body's NodeNames around a pod carrying PRIMED somewhere inside."""
    return {
        "pod-after": members((_NAMES, ASKED), (b'"Pod"', p)),
        "pod-before": members((b'"Pod"', p), (b'"Nodes"', None), (_NAMES, ASKED)),
        "escaped-key-pod-after": members((b'"\\u004eodeNames"', ASKED), (b'"Pod"', p)),
        "escaped-key-pod-before": members((b'"Pod"', p), (b'"\\u004eodeNames"', ASKED)),
        "duplicate-last-wins": members((_NAMES, PRIMED), (b'"Pod"', p), (_NAMES, ASKED)),
        "duplicate-other-case-last": members((b'"Pod"', p), (_NAMES, PRIMED), (b'"nodeNames"', ASKED)),
        "duplicate-folded-rune-last": members((b'"Pod"', p), (_NAMES, PRIMED), ('"NodeName\u017f"'.encode(), ASKED)),
        "duplicate-escaped-last": members((b'"Pod"', p), (_NAMES, PRIMED), (b'"\\u004eodeNames"', ASKED)),
    }


_KINDS = list(_bodies(fixture_pod("no-gpu")))


def test_the_cases_ask_what_they_say() -> None:
    for where in _WHERE:
        for big in (False, True):
            for kind, body in _bodies(_decoy_pod(where, big)).items():
                assert asked_names(body) == ASKED, (where, big, kind)


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("kind", _KINDS)
async def test_prioritize_scores_exactly_the_nodes_asked(client: Client, kind: str, big: bool) -> None:
    for where in _WHERE:
        p = _decoy_pod(where, big)
        status, passed = await client.post("filter", members((b'"Pod"', p), (_NAMES, PRIMED)))
        assert status == 200 and passed["NodeNames"] == PRIMED  # the list prioritize may remember
        status, reply = await client.post("prioritize", _bodies(p)[kind])
        assert status == 200
        assert [h["Host"] for h in reply] == ASKED, where
        assert all(0 <= h["Score"] <= 10 for h in reply)


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("kind", _KINDS)
async def test_filter_answers_exactly_the_nodes_asked(client: Client, kind: str, big: bool) -> None:
    for where in _WHERE:
        status, reply = await client.post("filter", _bodies(_decoy_pod(where, big))[kind])
        assert status == 200 and reply["Error"] == ""
        assert reply["NodeNames"] == ASKED, where


@pytest.mark.parametrize("trail", [b"\x0b", b"\x0c", b"}", b"]", b"x"])
@pytest.mark.parametrize("big", [False, True])
async def test_bytes_after_the_document_are_undecodable_at_any_size(client: Client, trail: bytes, big: bool) -> None:
    body = members((b'"Pod"', _decoy_pod("annotation-string", big)), (_NAMES, ASKED))
    for verb in ("filter", "prioritize"):
        status, _ = await client.post(verb, body + trail)
        assert status == 400
    status, reply = await client.post("filter", body + b" \r\n\t")  # JSON whitespace is fine
    assert status == 200 and reply["NodeNames"] == ASKED


async def test_case_duplicates_of_pod_and_victims_follow_go(client: Client) -> None:
    want8 = fixture_pod("want-8")
    nogpu = fixture_pod("no-gpu")
    # The last Pod wins: the no-GPU pod passes the node that has no GPU.
    body = members((b'"Pod"', want8), (b'"pod"', nogpu), (_NAMES, ["cpu-1"]))
    status, reply = await client.post("filter", body)
    assert status == 200 and reply["NodeNames"] == ["cpu-1"]
    body = members((b'"pod"', nogpu), (b'"Pod"', want8), (_NAMES, ["cpu-1"]))
    status, reply = await client.post("filter", body)
    assert status == 200 and reply["NodeNames"] == []
    assert "cpu-1" in {**reply["FailedNodes"], **reply["FailedAndUnresolvableNodes"]}
    # Preemption: the last victims map wins; a node only in the map that lost never comes back.
    victims = {"Pods": [{"UID": _uid("finetune-0")}], "NumPDBViolations": 0}
    body = members(
        (b'"Pod"', want8),
        (b'"NodeNameToMetaVictims"', {"h100-r1-n1": victims}),
        (b'"nodeNameToMetaVictims"', {"h100-r2-n1": victims}),
    )
    status, reply = await client.post("preempt", body)
    assert status == 200 and set(reply["NodeNameToMetaVictims"]) <= {"h100-r2-n1"}


def _uid(pod_name: str) -> str:
    for o in cluster_items():
        if o["kind"] == "Pod" and o["metadata"]["name"] == pod_name:
            return str(o["metadata"]["uid"])
    raise KeyError(pod_name)


# ------------------------------------------------------------- a pod's answer is its own


async def test_a_pod_with_a_known_uid_and_version_but_another_spec_gets_its_own_answer(client: Client) -> None:
    genuine = fixture_json("args-want-8-allnodes.json")
    status, reply = await client.post("filter", genuine)
    assert reply["NodeNames"] == ["h100-r1-n2"]
    forged = fixture_json("args-want-8-allnodes.json")  # same uid and resourceVersion, 1 GPU instead of 8
    for part in ("requests", "limits"):
        forged["Pod"]["spec"]["containers"][0]["resources"][part]["nvidia.com/gpu"] = "1"
    status, reply = await client.post("filter", forged)
    assert status == 200 and len(reply["NodeNames"]) > 1
    status, reply = await client.post("filter", genuine)
    assert status == 200 and reply["NodeNames"] == ["h100-r1-n2"]
    status, reply = await client.post("prioritize", {**genuine, "NodeNames": ["h100-r1-n2", "h100-r2-n1"]})
    assert status == 200 and reply[1] == {"Host": "h100-r2-n1", "Score": 0}


# --------------------------------------------------------------------- 2. unknown nodes (H-6)

_YET = "is not in the extender's inventory yet"


def _assert_all_unresolvable(reply: dict[str, Any], names: list[str]) -> None:
    assert reply["Error"] == "" and reply["FailedNodes"] == {}
    assert set(reply["FailedAndUnresolvableNodes"]) == set(names)
    assert all(_YET in v for v in reply["FailedAndUnresolvableNodes"].values())


async def test_every_candidate_unknown_is_refused_per_node_in_names_mode(client: Client) -> None:
    args = fixture_json("args-want-8-names.json")
    args["NodeNames"] = ["nope-1", "nope-2"]
    status, reply = await client.post("filter", args)
    assert status == 200 and reply["NodeNames"] == [] and reply["Nodes"] is None
    _assert_all_unresolvable(reply, ["nope-1", "nope-2"])


async def test_every_candidate_unknown_is_refused_per_node_in_nodelist_mode(client: Client) -> None:
    args = fixture_json("args-want-4-h100-nodelist.json")
    for n in args["Nodes"]["items"]:
        n["metadata"]["name"] = "new-" + n["metadata"]["name"]
    names = [n["metadata"]["name"] for n in args["Nodes"]["items"]]
    status, reply = await client.post("filter", args)
    assert status == 200 and reply["Nodes"]["items"] == []
    _assert_all_unresolvable(reply, names)


async def test_a_synced_inventory_without_nodes_refuses_per_node() -> None:
    inv = Inventory(ExtenderConfig())
    inv.load_list({"kind": "List", "items": [o for o in cluster_items() if o["kind"] != "Node"]})
    assert inv.ready and len(inv.snapshot()) == 0
    server, session, c = await start_client(inv)
    try:
        status, reply = await c.post("filter", fixture_json("args-want-8-names.json"))
        assert status == 200
        _assert_all_unresolvable(reply, fixture_json("args-want-8-names.json")["NodeNames"])
        status, reply = await c.post("filter", fixture_json("args-want-4-h100-nodelist.json"))
        assert status == 200 and reply["Nodes"]["items"] == []
        status, reply = await c.post("prioritize", fixture_json("args-want-8-names.json"))
        assert status == 200 and reply == [
            {"Host": n, "Score": 0} for n in fixture_json("args-want-8-names.json")["NodeNames"]
        ]
    finally:
        await session.close()
        await server.close()


async def test_an_unsynced_inventory_is_still_a_whole_request_error() -> None:
    server, session, c = await start_client(Inventory(ExtenderConfig()))
    try:
        args = fixture_json("args-want-8-names.json")
        args["NodeNames"] = ["nope-1"]
        status, reply = await c.post("filter", args)
        assert status == 200 and "first sync" in reply["Error"] and reply["NodeNames"] is None
    finally:
        await session.close()
        await server.close()


async def test_prioritize_gives_unknown_nodes_score_0_in_request_order(client: Client) -> None:
    args = fixture_json("args-want-4-h100-names.json")
    args["NodeNames"] = ["ghost-1", "h100-r1-n2", "ghost-2", "h100-r2-n1"]
    status, reply = await client.post("prioritize", args)
    assert status == 200 and [h["Host"] for h in reply] == args["NodeNames"]
    assert reply[0]["Score"] == 0 and reply[2]["Score"] == 0
    args["NodeNames"] = ["ghost-1", "ghost-2"]
    status, reply = await client.post("prioritize", args)
    assert status == 200 and reply == [{"Host": "ghost-1", "Score": 0}, {"Host": "ghost-2", "Score": 0}]


async def test_preempt_drops_unknown_nodes_like_filter_refuses_them(client: Client) -> None:
    victims = {"Pods": [{"UID": _uid("finetune-0")}], "NumPDBViolations": 0}
    body = {"Pod": fixture_pod("want-8"), "NodeNameToMetaVictims": {"ghost": victims, "h100-r2-n1": victims}}
    status, reply = await client.post("preempt", body)
    assert status == 200 and set(reply["NodeNameToMetaVictims"]) == {"h100-r2-n1"}


# -------------------------------------------------------------- 3. bodies that crashed a handler


def _deep(depth: int) -> bytes:
    """A list nested `depth` deep: within the decoder's limit, past Python's recursion limit."""
    return b"[" * depth + b"1" + b"]" * depth


def _with_deep(obj: Any, depth: int = 1015) -> bytes:
    return orjson.dumps(obj).replace(b'"@DEEP@"', _deep(depth))


@pytest.mark.parametrize("field", ["namespace", "uid", "resourceVersion", "labels"])
async def test_deep_or_odd_pod_metadata_is_an_error_not_a_crash(client: Client, field: str) -> None:
    for value in ("@DEEP@", 5, ["x"]):
        args = fixture_json("args-want-dra-4-names.json")  # a pod with claims reads its namespace
        args["Pod"]["metadata"][field] = value
        status, reply = await client.post("filter", _with_deep(args))
        assert status == 200 and reply["Error"] and "internal error" not in reply["Error"], (field, value)
        assert reply["NodeNames"] is None


@pytest.mark.parametrize("value", [5, "claims", {"a": 1}, [5]])
async def test_odd_resource_claims_are_an_error_not_a_crash(client: Client, value: Any) -> None:
    args = fixture_json("args-want-8-names.json")
    args["Pod"]["spec"]["resourceClaims"] = value
    status, reply = await client.post("filter", args)
    assert status == 200 and reply["Error"] and "internal error" not in reply["Error"]


async def test_a_node_too_deep_to_echo_is_an_error_not_a_crash(client: Client) -> None:
    args = fixture_json("args-want-4-h100-nodelist.json")
    for n in args["Nodes"]["items"]:
        n["metadata"]["annotations"] = {"deep": "@DEEP@"}
    status, reply = await client.post("filter", _with_deep(args, 300))
    assert status == 200 and reply["Error"] and "internal error" not in reply["Error"]
    status, reply = await client.post("filter", fixture_json("args-want-4-h100-nodelist.json"))
    assert status == 200 and [n["metadata"]["name"] for n in reply["Nodes"]["items"]]


async def test_a_huge_pdb_count_is_an_error_not_a_crash(client: Client) -> None:
    body = {
        "Pod": fixture_pod("want-8"),
        "NodeNameToMetaVictims": {"h100-r2-n1": {"Pods": [{"UID": _uid("finetune-0")}], "NumPDBViolations": 2**64}},
    }
    status, reply = await client.post("preempt", json.dumps(body).encode())
    assert status == 200 and reply == {"NodeNameToMetaVictims": {}}


async def test_recent_decisions_keep_a_bounded_pod_key(client: Client) -> None:
    args = fixture_json("args-want-8-names.json")
    args["Pod"]["metadata"]["name"] = "n" * 100_000
    await client.post("filter", args)
    status, text = await client.get("/debug/decisions?limit=1")
    assert status == 200 and len(json.loads(text)[0]["pod"]) <= 400


@pytest.fixture
async def webhook_url() -> AsyncIterator[str]:
    cfg = ExtenderConfig(webhook_namespaces=["team-a"])
    app = make_app(Inventory(cfg), cfg, extra_routes=webhook.add_routes)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("/mutate"))
    finally:
        await server.close()


def _review(**changes: Any) -> dict[str, Any]:
    r = admission_review(as_created(PENDING["want-4-h100"]), "team-a")
    for path, value in changes.items():
        node = r
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return r


@pytest.mark.parametrize(
    "changes",
    [
        {"request__name": "@DEEP@"},
        {"request__namespace": "@DEEP@"},
        {"request__object__metadata__name": "@DEEP@"},
        {"request__object__metadata__generateName": "@DEEP@"},
        {"request__object__spec__schedulerName": "@DEEP@"},
        {"request__object__spec__schedulerName": 5},
        {"request__object__spec__containers": 5},
        {"request__object__spec__initContainers": "abc"},
        {"request__uid": "@DEEP@"},
        {"apiVersion": "@DEEP@"},
    ],
)
async def test_webhook_always_allows_with_a_well_formed_review(webhook_url: str, changes: dict[str, Any]) -> None:
    review = _review(**changes)
    async with aiohttp.ClientSession() as s:
        async with s.post(webhook_url, data=_with_deep(review)) as r:
            assert r.status == 200
            out = await r.json()
    assert out["kind"] == "AdmissionReview" and out["apiVersion"] in webhook.ADMISSION_VERSIONS
    resp = out["response"]
    assert resp["allowed"] is True
    uid = review["request"]["uid"]
    assert resp["uid"] == ("" if uid == "@DEEP@" else uid)
    assert "internal error" not in " ".join(resp.get("warnings") or [])
    if "patch" in resp:
        assert json.loads(base64.b64decode(resp["patch"]))[0]["path"] == "/spec/schedulerName"


__all__ = ["go_fields", "go_fold", "asked_names", "members"]
