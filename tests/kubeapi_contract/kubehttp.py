"""A small black-box HTTP client for the contract tests: what any API server, fake or real, must answer.

No knowledge of the fake: requests, raw JSON replies with their status and Warning headers,
and watch streams read line by line with a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from fleetsim.processes import wait_for

__all__ = ["KubeHTTP", "Reply", "WatchStream", "eventually", "expect"]

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@dataclasses.dataclass
class Reply:
    status: int
    body: Any
    headers: Mapping[str, str]
    warnings: list[str]

    @property
    def obj(self) -> dict[str, Any]:
        assert isinstance(self.body, dict), self.body
        return self.body


def _warnings(resp: aiohttp.ClientResponse) -> list[str]:
    out = []
    for raw in resp.headers.getall("Warning", []):
        # 299 - "text with \" escapes"
        text = raw.split(" - ", 1)[-1].strip()
        if text.startswith('"') and text.endswith('"'):
            text = json.loads(text)
        out.append(text)
    return out


class WatchStream:
    """An open watch: `next(timeout)` returns the next decoded event, or None when the stream ended."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.ended = False

    async def next(self, timeout: float = 10.0) -> dict[str, Any] | None:
        if self.ended:
            return None
        line = await asyncio.wait_for(self.resp.content.readline(), timeout)
        if not line:
            self.ended = True
            return None
        event: dict[str, Any] = json.loads(line)
        return event

    async def until(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> list[dict[str, Any]]:
        """Events up to and including the first one matching pred (AssertionError if the stream ends first)."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            event = await self.next(max(0.01, deadline - time.monotonic()))
            if event is None:
                raise AssertionError(f"watch ended before the expected event; saw {[e['type'] for e in seen]}")
            seen.append(event)
            if pred(event):
                return seen

    async def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """Everything that arrives within `seconds` (used to show that nothing else comes)."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = await self.next(left)
            except TimeoutError:
                break
            if event is None:
                break
            seen.append(event)
        return seen

    def close(self) -> None:
        self.resp.close()


class KubeHTTP:
    """Requests against one API server with one credential."""

    def __init__(self, base_url: str, token: str | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        headers = {"Accept": JSON}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._ssl = ssl_context
        self.session = aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=ssl_context or False))

    def with_token(self, token: str | None) -> KubeHTTP:
        return KubeHTTP(self.base_url, token, self._ssl)

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Reply:
        data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        hdrs = {"Content-Type": content_type, **(headers or {})}
        async with self.session.request(
            method,
            self.base_url + path,
            data=data,
            params=params,
            headers=hdrs,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            try:
                parsed: Any = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode(errors="replace")
            return Reply(resp.status, parsed, resp.headers, _warnings(resp))

    async def get(self, path: str, **params: str) -> Reply:
        return await self.request("GET", path, params=params or None)

    async def post(self, path: str, body: Any, **params: str) -> Reply:
        return await self.request("POST", path, body, params=params or None)

    async def put(self, path: str, body: Any, **params: str) -> Reply:
        return await self.request("PUT", path, body, params=params or None)

    async def patch(self, path: str, body: Any, content_type: str, **params: str) -> Reply:
        return await self.request("PATCH", path, body, content_type=content_type, params=params or None)

    async def delete(self, path: str, body: Any = None, **params: str) -> Reply:
        return await self.request("DELETE", path, body, params=params or None)

    async def watch(self, path: str, **params: str) -> WatchStream:
        query = {"watch": "true", **params}
        resp = await self.session.get(
            self.base_url + path, params=query, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)
        )
        if resp.status != 200:
            body = await resp.text()
            resp.close()
            raise AssertionError(f"watch {path} answered {resp.status}: {body}")
        return WatchStream(resp)


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll an async or sync check until it returns a truthy value, and return it (`fleetsim.processes.wait_for`)."""
    return await wait_for(check, timeout, f"a condition, {timeout:g} s")


def expect(reply: Reply, status: int) -> dict[str, Any]:
    """The reply's object, asserting its HTTP status (the body is shown when it differs)."""
    assert reply.status == status, f"expected {status}, got {reply.status}: {reply.body}"
    assert isinstance(reply.body, dict)
    return reply.body
