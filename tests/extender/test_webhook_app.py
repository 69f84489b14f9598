"""The webhook mounted on the real extender app (as main() does) and its listener's readiness following the inventory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from extender import webhook
from extender.app import make_app
from extender.config import load_config
from extender.inventory import Inventory
from tests.extender.test_webhook import PENDING, admission_review, as_created
from tests.fixtures import fixture_json


@pytest.fixture
async def served() -> AsyncIterator[tuple[Inventory, str, str]]:
    # The environment is read once, at load (as main() does); plain HTTP here, the manifests set TLS.
    cfg = load_config(None, env={"TANDEM_WEBHOOK_LISTEN": "127.0.0.1:0"}, webhook_namespaces=["team-a"])
    inv = Inventory(cfg)
    app = make_app(inv, cfg, extra_routes=webhook.add_routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    main_host, main_port = runner.addresses[0][:2]
    side_host, side_port = app[webhook.LISTENER_KEY].addresses[0][:2]
    yield inv, f"http://{main_host}:{main_port}", f"http://{side_host}:{side_port}"
    await runner.cleanup()


async def fetch(method: str, url: str, body: Any = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url, json=body) as r:
            return r.status, await r.text()


async def test_both_listeners_route_a_gpu_pod(served: tuple[Inventory, str, str]) -> None:
    _, main, side = served
    review = admission_review(as_created(PENDING["want-4-h100"]), "team-a")
    for base in (main, side):
        status, text = await fetch("POST", f"{base}/mutate", review)
        assert status == 200
        assert json.loads(text)["response"]["patchType"] == "JSONPatch"


async def test_listener_readiness_is_the_inventory_readiness(served: tuple[Inventory, str, str]) -> None:
    inv, main, side = served
    assert (await fetch("GET", f"{side}/readyz"))[0] == 503
    assert (await fetch("GET", f"{side}/healthz")) == (200, "ok")
    inv.load_list(fixture_json("cluster.json"))
    assert inv.ready
    assert (await fetch("GET", f"{side}/readyz"))[0] == 200
    assert (await fetch("GET", f"{main}/readyz"))[0] == 200
