"""The extender v1 wire format, spoken through the real app with the fixtures' bodies as-is."""

from __future__ import annotations

import json

import pytest

from extender.errors import BadRequest, UndecodableBody
from extender.protocol import encode_priorities, host_prefix, parse_extender_args, parse_preemption_args
from tests.extender.extender_support import ALL_NODES, Client, client, fixture_bytes, fixture_json  # noqa: F401

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@pytest.mark.parametrize(
    ("fixture", "passed"),
    [
        ("args-want-4-h100-names.json", ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]),
        ("args-want-8-names.json", ["h100-r1-n2"]),
        ("args-want-mig-3g-names.json", ["a100-mig-1"]),
        ("args-want-dra-4-names.json", ["h200-dra-1"]),
        ("args-want-4-h100-allnodes.json", ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]),
        ("args-want-8-allnodes.json", ["h100-r1-n2"]),
        ("args-want-mig-3g-allnodes.json", ["a100-mig-1"]),
        ("args-want-dra-4-allnodes.json", ["h200-dra-1"]),
        ("args-no-gpu-allnodes.json", ALL_NODES),
        ("args-no-gpu-names.json", ["cpu-1"]),
    ],
)
async def test_filter_names_mode_fixture(client: Client, fixture: str, passed: list[str]) -> None:
    status, body = await client.post("filter", fixture_bytes(fixture))
    assert status == 200
    assert set(body) == FILTER_KEYS
    assert body["Error"] == ""
    assert body["Nodes"] is None
    assert body["NodeNames"] == passed
    sent = fixture_json(fixture)["NodeNames"]
    refused = set(body["FailedNodes"]) | set(body["FailedAndUnresolvableNodes"])
    assert refused == set(sent) - set(passed)
    assert not set(body["FailedNodes"]) & set(body["FailedAndUnresolvableNodes"])
    assert all(isinstance(v, str) and v for v in {**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}.values())


async def test_filter_nodelist_mode_echoes_full_nodes(client: Client) -> None:
    args = fixture_json("args-want-4-h100-nodelist.json")
    assert "apiVersion" not in args["Nodes"] and "kind" not in args["Nodes"]
    status, body = await client.post("filter", fixture_bytes("args-want-4-h100-nodelist.json"))
    assert status == 200 and body["Error"] == ""
    assert body["NodeNames"] is None
    items = body["Nodes"]["items"]
    assert [n["metadata"]["name"] for n in items] == ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]
    sent = {n["metadata"]["name"]: n for n in args["Nodes"]["items"]}
    for n in items:  # nodes come back exactly as sent
        assert n == sent[n["metadata"]["name"]]


async def test_prioritize_ranks_broken_up_nodes_first(client: Client) -> None:
    status, body = await client.post("prioritize", fixture_bytes("args-want-4-h100-names.json"))
    assert status == 200
    assert isinstance(body, list)
    assert [set(e) for e in body] == [{"Host", "Score"}] * 3
    scores = {e["Host"]: e["Score"] for e in body}
    assert list(scores) == ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]
    assert all(0 <= s <= 10 and isinstance(s, int) for s in scores.values())
    assert scores["h100-r2-n1"] > scores["h100-r1-n2"]
    assert scores["h100-r2-n2"] > scores["h100-r1-n2"]


async def test_prioritize_nodelist_mode(client: Client) -> None:
    status, body = await client.post("prioritize", fixture_bytes("args-want-4-h100-nodelist.json"))
    assert status == 200
    scores = {e["Host"]: e["Score"] for e in body}
    assert scores["h100-r2-n1"] > scores["h100-r1-n2"]


async def test_prioritize_no_gpu_is_neutral(client: Client) -> None:
    status, body = await client.post("prioritize", fixture_bytes("args-no-gpu-allnodes.json"))
    assert status == 200
    assert len(body) == len(ALL_NODES)
    assert len({e["Score"] for e in body}) == 1


def test_parse_accepts_go_case_insensitive_fields() -> None:
    args = fixture_json("args-want-8-names.json")
    body = {"pod": args["Pod"], "nodenames": args["NodeNames"]}
    import json

    parsed = parse_extender_args(json.dumps(body).encode())
    assert parsed.node_names == ["h100-r1-n2"] and parsed.nodes is None


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[1,2]", BadRequest),
        (b'{"NodeNames": ["a"]}', BadRequest),
        (b'{"Pod": 3, "NodeNames": ["a"]}', BadRequest),
        (b'{"Pod": {"metadata": {"name": "p"}, "spec": {}}, "NodeNames": null, "Nodes": null}', BadRequest),
        (b'{"Pod": {"metadata": {"name": "p"}, "spec": {}}, "Nodes": {"items": [{}]}}', BadRequest),
        (b"{not json", UndecodableBody),
    ],
)
def test_parse_rejects(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_extender_args(body)


def test_encode_priorities_is_valid_json() -> None:
    import json

    out = encode_priorities([host_prefix('we"ird'), host_prefix("n2")], [10, 0])
    assert json.loads(out) == [{"Host": 'we"ird', "Score": 10}, {"Host": "n2", "Score": 0}]


def test_parse_preemption_meta_and_full_victims() -> None:
    import json

    pod = fixture_json("args-want-8-names.json")["Pod"]
    body = {
        "Pod": pod,
        "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}},
        "NodeNameToVictims": {"b": {"Pods": [{"metadata": {"name": "v", "uid": "u2"}}], "NumPDBViolations": 0}},
    }
    parsed = parse_preemption_args(json.dumps(body).encode())
    assert parsed.victims["a"].uids == ("u1",) and parsed.victims["a"].num_pdb_violations == 1
    assert parsed.victims["b"].uids == ("u2",) and parsed.victims["b"].pods[0]["metadata"]["name"] == "v"


async def test_nodelist_mode_unknown_node_is_refused_not_echoed(client: Client) -> None:
    args = fixture_json("args-want-4-h100-nodelist.json")
    extra = json.loads(json.dumps(args["Nodes"]["items"][0]))
    extra["metadata"]["name"] = "not-in-inventory"
    args["Nodes"]["items"].append(extra)
    status, body = await client.post("filter", args)
    assert status == 200 and body["Error"] == ""
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]
    assert "not-in-inventory" in body["FailedAndUnresolvableNodes"]


async def test_prioritize_before_sync_is_empty_list() -> None:
    from extender.config import ExtenderConfig
    from extender.inventory import Inventory
    from tests.extender.extender_support import start_client

    server, session, c = await start_client(Inventory(ExtenderConfig()))
    try:
        status, body = await c.post("prioritize", fixture_bytes("args-want-4-h100-names.json"))
        assert status == 200 and body == []
    finally:
        await session.close()
        await server.close()
