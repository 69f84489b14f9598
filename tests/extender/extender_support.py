"""Shared helpers for the extender tests: fixture files, inventories, a real server on loopback."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from extender.app import make_app
from extender.config import ExtenderConfig
from extender.inventory import Inventory

# Re-exported: the extender tests import the fixture helpers from here.
from tests.fixtures import FIXTURES as FIXTURES
from tests.fixtures import fixture_bytes as fixture_bytes
from tests.fixtures import fixture_json as fixture_json


def cluster_items() -> list[dict[str, Any]]:
    return copy.deepcopy(fixture_json("cluster.json")["items"])


def make_inventory(
    extra: list[dict[str, Any]] | None = None, config: ExtenderConfig | None = None, drop: set[str] | None = None
) -> Inventory:
    """Inventory of the fixture cluster plus `extra` objects, minus objects named in `drop`."""
    inv = Inventory(config or ExtenderConfig())
    items = [o for o in cluster_items() if o["metadata"]["name"] not in (drop or set())]
    inv.load_list({"kind": "List", "items": items + (extra or [])})
    return inv


def fixture_pod(name: str) -> dict[str, Any]:
    for p in fixture_json("pending-pods.json")["items"]:
        if p["metadata"]["name"] == name:
            return copy.deepcopy(p)
    raise KeyError(name)


def names_args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


ALL_NODES = [o["metadata"]["name"] for o in fixture_json("cluster.json")["items"] if o["kind"] == "Node"]


class Client:
    """A real HTTP client against a real server on 127.0.0.1 (port 0)."""

    def __init__(self, server: TestServer, session: aiohttp.ClientSession, prefix: str) -> None:
        self.server = server
        self.session = session
        self.prefix = prefix

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(
            self.url(f"{self.prefix}/{verb}"), data=data, headers={"Content-Type": "application/json"}
        ) as r:
            raw = await r.read()
            try:
                return r.status, json.loads(raw)
            except ValueError:
                return r.status, raw

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.url(path)) as r:
            return r.status, await r.text()


async def start_client(inv: Inventory) -> tuple[TestServer, aiohttp.ClientSession, Client]:
    server = TestServer(make_app(inv), host="127.0.0.1", port=0)
    await server.start_server()
    session = aiohttp.ClientSession()
    return server, session, Client(server, session, inv.config.url_prefix)


@pytest_asyncio.fixture
async def client() -> AsyncIterator[Client]:
    server, session, c = await start_client(make_inventory())
    try:
        yield c
    finally:
        await session.close()
        await server.close()


__all__ = ["pytest"]
