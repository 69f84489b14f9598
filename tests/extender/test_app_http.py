"""The app over real HTTP: bad bodies, huge bodies, probes, metrics."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from extender.app import make_app
from extender.config import ExtenderConfig
from extender.inventory import Inventory
from tests.extender.extender_support import (  # noqa: F401
    Client,
    client,
    cluster_items,
    fixture_bytes,
    fixture_json,
    start_client,
)


async def test_garbage_body_is_400_and_server_keeps_answering(client: Client) -> None:
    status, _ = await client.post("filter", b"\x00\xffnot json")
    assert status == 400
    status, body = await client.post("filter", fixture_bytes("args-want-8-names.json"))
    assert status == 200 and body["NodeNames"] == ["h100-r1-n2"]


@pytest.mark.parametrize(
    "body",
    [
        {"Pod": None, "NodeNames": ["h100-r1-n2"]},
        {"NodeNames": ["h100-r1-n2"]},
        {"Pod": "pod", "NodeNames": ["h100-r1-n2"]},
        {"Pod": {"metadata": {"name": "x"}, "spec": {}}, "NodeNames": "h100-r1-n2"},
        {"Pod": {"metadata": {"name": "x"}, "spec": {}}, "NodeNames": [1, "h100-r1-n2"]},
        {"Pod": {"metadata": {"name": "x"}, "spec": {}}, "NodeNames": [["h100-r1-n2"]]},
        {"Pod": {"metadata": {"name": "x"}, "spec": {"containers": "x"}}, "NodeNames": ["h100-r1-n2"]},
        [1, 2, 3],
    ],
)
async def test_wrong_types_are_200_with_error(client: Client, body: object) -> None:
    status, reply = await client.post("filter", body)
    assert status == 200
    assert reply["Error"]
    assert reply["NodeNames"] is None


async def test_unknown_nodes_only_are_refused_per_node(client: Client) -> None:
    # H-6: an Error would fail kube-scheduler's whole cycle; per-node refusals let it retry when they appear
    args = fixture_json("args-want-8-names.json")
    args["NodeNames"] = ["nope-1", "nope-2"]
    status, reply = await client.post("filter", args)
    assert status == 200 and reply["Error"] == "" and reply["NodeNames"] == []
    assert sorted(reply["FailedAndUnresolvableNodes"]) == ["nope-1", "nope-2"]


async def test_unknown_node_among_known_is_unresolvable(client: Client) -> None:
    args = fixture_json("args-want-8-names.json")
    args["NodeNames"] = ["h100-r1-n2", "ghost"]
    status, reply = await client.post("filter", args)
    assert status == 200 and reply["Error"] == ""
    assert reply["NodeNames"] == ["h100-r1-n2"]
    assert "not in the extender's inventory" in reply["FailedAndUnresolvableNodes"]["ghost"]


async def test_bad_quantity_in_pod_is_200_with_error(client: Client) -> None:
    args = fixture_json("args-want-8-names.json")
    args["Pod"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "lots"
    status, reply = await client.post("filter", args)
    assert status == 200 and "nvidia.com/gpu" in reply["Error"]


async def test_prioritize_and_preempt_bad_bodies(client: Client) -> None:
    status, reply = await client.post("prioritize", {"Pod": None})
    assert status == 200 and reply == []
    status, reply = await client.post("preempt", {"Pod": None})
    assert status == 200 and reply == {"NodeNameToMetaVictims": {}}
    status, _ = await client.post("preempt", b"{{")
    assert status == 400


async def test_huge_body_refused_without_crashing() -> None:
    cfg = ExtenderConfig(max_body_bytes=64 * 1024)
    inv = Inventory(cfg)
    inv.load_list({"kind": "List", "items": cluster_items()})
    server = TestServer(make_app(inv), host="127.0.0.1", port=0)
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        url = str(server.make_url("/filter"))  # no prefix configured
        async with session.post(url, data=b"[" + b"1," * 100_000 + b"1]") as r:
            assert r.status in (400, 413)
        async with session.post(url, data=fixture_bytes("args-want-8-names.json")) as r:
            assert r.status == 200
            assert (await r.json())["NodeNames"] == ["h100-r1-n2"]
    await server.close()


async def test_readyz_before_and_after_sync() -> None:
    inv = Inventory(ExtenderConfig())
    server, session, c = await start_client(inv)
    try:
        status, text = await c.get("/readyz")
        assert status == 503 and "not synced" in text
        status, _ = await c.get("/healthz")
        assert status == 200
        status, reply = await c.post("filter", fixture_bytes("args-want-8-names.json"))
        assert status == 200 and "first sync" in reply["Error"]
        items = cluster_items()
        for kind in ("Node", "Pod", "ResourceSlice", "ResourceClaim", "DeviceClass"):
            inv.replace(kind, [o for o in items if o["kind"] == kind])
        status, text = await c.get("/readyz")
        assert status == 503 and "reservations not loaded" in text
        inv.replace("Reservation", [])
        status, _ = await c.get("/readyz")
        assert status == 200
        status, reply = await c.post("filter", fixture_bytes("args-want-8-names.json"))
        assert reply["NodeNames"] == ["h100-r1-n2"]
    finally:
        await session.close()
        await server.close()


async def test_metrics_content(client: Client) -> None:
    await client.post("filter", fixture_bytes("args-want-8-allnodes.json"))
    await client.post("prioritize", fixture_bytes("args-want-4-h100-names.json"))
    await client.post("filter", b"garbage")
    status, text = await client.get("/metrics")
    assert status == 200
    assert 'tandem_extender_request_seconds_count{verb="filter"} 2.0' in text
    assert 'tandem_extender_request_seconds_count{verb="prioritize"} 1.0' in text
    assert 'tandem_extender_decisions_total{reason="Fit",verb="filter"} 1.0' in text
    assert 'tandem_extender_decisions_total{reason="NotReady",verb="filter"} 1.0' in text
    assert 'tandem_extender_decisions_total{reason="InsufficientGpus",verb="filter"} 3.0' in text
    assert 'tandem_extender_request_errors_total{kind="undecodable",verb="filter"} 1.0' in text
    assert "tandem_extender_inventory_age_seconds" in text
    assert "tandem_extender_ready 1.0" in text


async def test_configurable_prefix_and_verbs() -> None:
    cfg = ExtenderConfig(url_prefix="scheduler", filter_verb="f", prioritize_verb="p")
    inv = Inventory(cfg)
    inv.load_list({"kind": "List", "items": cluster_items()})
    server, session, c = await start_client(inv)
    try:
        status, reply = await c.post("f", fixture_bytes("args-want-8-names.json"))
        assert status == 200 and reply["NodeNames"] == ["h100-r1-n2"]
        status, _ = await c.post("filter", fixture_bytes("args-want-8-names.json"))
        assert status == 404
    finally:
        await session.close()
        await server.close()


async def test_without_a_prefix_the_verbs_sit_at_the_root() -> None:
    inv = Inventory(ExtenderConfig())
    inv.load_list({"kind": "List", "items": cluster_items()})
    server = TestServer(make_app(inv), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(server.make_url("/filter"), data=fixture_bytes("args-want-4-h100-names.json")) as r:
                assert r.status == 200
                passed = (await r.json())["NodeNames"]
            assert sorted(passed) == ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]
            body = orjson.dumps({**orjson.loads(fixture_bytes("args-want-4-h100-names.json")), "NodeNames": passed})
            async with session.post(server.make_url("/prioritize"), data=body) as r:
                assert r.status == 200 and {h["Host"] for h in await r.json()} == set(passed)
            async with session.post(server.make_url("/tandem/filter"), data=body) as r:
                assert r.status == 404
    finally:
        await server.close()


async def test_refusal_is_logged_with_fields(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.WARNING, logger="tandem.extender"):
        await client.post("filter", {"Pod": None, "NodeNames": []})
    rec = next(r for r in caplog.records if r.getMessage() == "request refused")
    assert rec.__dict__["verb"] == "filter" and "Pod is missing" in rec.__dict__["error"]


async def test_recent_decisions_endpoint(client: Client) -> None:
    import json

    await client.post("filter", fixture_bytes("args-want-8-allnodes.json"))
    await client.post("filter", fixture_bytes("args-want-mig-3g-names.json"))
    status, text = await client.get("/debug/decisions?pod=team-a/want-8")
    assert status == 200
    items = json.loads(text)
    assert len(items) == 1 and items[0]["verb"] == "filter" and items[0]["passed"] == 1
    assert items[0]["reasons"]["InsufficientGpus"] == 3 and items[0]["reasons"]["NotReady"] == 1
    status, text = await client.get("/debug/decisions")
    assert [d["pod"] for d in json.loads(text)] == ["inference/want-mig-3g", "team-a/want-8"]
    status, _ = await client.get("/debug/decisions?limit=x")
    assert status == 400
