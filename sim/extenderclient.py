"""kube-scheduler's HTTP extender client (``HTTPExtender``): the filter and prioritize calls, exactly as sent.

Fields in Go's PascalCase; names mode (``nodeCacheCapable: true``) sends ``NodeNames`` with
``Nodes: null``, otherwise a ``NodeList`` without apiVersion/kind. A non-200 reply, a timeout, an
unreadable body or a non-empty ``Error`` is an ``ExtenderError`` whose text mirrors kube-scheduler's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from sim.schedconfig import ExtenderSettings

__all__ = ["ExtenderClient", "ExtenderError", "FilterResult"]

JSON = dict[str, Any]


class ExtenderError(Exception):
    """The call failed; the message is what kube-scheduler would put in the pod's condition."""


@dataclasses.dataclass(frozen=True)
class FilterResult:
    """Nodes that passed, and refusals by node (resolvable by preemption or not)."""

    nodes: list[str]
    failed: dict[str, str]
    failed_unresolvable: dict[str, str]


class ExtenderClient:
    """One configured extender reached at ``base_url`` (scheme://host:port) plus the configured path."""

    def __init__(self, settings: ExtenderSettings, base_url: str) -> None:
        self.settings = settings
        self.base_url = base_url
        self._session: aiohttp.ClientSession | None = None

    @property
    def connected(self) -> bool:
        """A session is open (it is made on the first call, inside the event loop)."""
        return self._session is not None and not self._session.closed

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers={"Content-Type": "application/json"})
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, verb: str, args: JSON) -> Any:
        url = self.settings.url(self.base_url, verb)
        timeout = aiohttp.ClientTimeout(total=self.settings.http_timeout_s)
        try:
            async with self._client().post(url, data=orjson.dumps(args), timeout=timeout) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise ExtenderError(f"failed {verb} with extender at URL {url}, code {resp.status}")
        except TimeoutError as e:
            raise ExtenderError(
                f'Post "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
            ) from e
        except aiohttp.ClientError as e:
            raise ExtenderError(f'Post "{url}": {e}') from e
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise ExtenderError(f"failed to decode {verb} reply of extender at URL {url}: {e}") from e

    def _args(self, pod: JSON, nodes: Sequence[JSON]) -> JSON:
        if self.settings.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": list(nodes)}, "NodeNames": None}

    async def filter(self, pod: JSON, nodes: Sequence[JSON]) -> FilterResult:
        """POST ``{prefix}/{filterVerb}``; only nodes that were sent come back."""
        reply = await self._post(self.settings.filter_verb, self._args(pod, nodes))
        if not isinstance(reply, dict):
            raise ExtenderError("extender filter reply is not an object")
        if reply.get("Error"):
            raise ExtenderError(str(reply["Error"]))
        sent = {n["metadata"]["name"] for n in nodes}
        if self.settings.node_cache_capable:
            names = [str(n) for n in reply.get("NodeNames") or []]
        else:
            names = [str(n["metadata"]["name"]) for n in (reply.get("Nodes") or {}).get("items") or []]
        return FilterResult(
            nodes=[n for n in names if n in sent],
            failed=_str_map(reply.get("FailedNodes")),
            failed_unresolvable=_str_map(reply.get("FailedAndUnresolvableNodes")),
        )

    async def prioritize(self, pod: JSON, nodes: Sequence[JSON]) -> dict[str, int]:
        """POST ``{prefix}/{prioritizeVerb}``: host → score (0-10)."""
        reply = await self._post(self.settings.prioritize_verb, self._args(pod, nodes))
        if not isinstance(reply, list):
            raise ExtenderError("extender prioritize reply is not a list")
        return {str(h.get("Host")): int(h.get("Score") or 0) for h in reply if isinstance(h, dict)}


def _str_map(raw: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
