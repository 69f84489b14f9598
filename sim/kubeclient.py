"""A small raw async client for the Kubernetes REST API, shared by the simulated cluster's controllers.

Raw JSON in and out (no generated models: nothing is dropped or re-validated), so the same code
runs against the fake API server and a real ``kube-apiserver``. Errors carry the server's
``Status``; 429 (and 5xx with ``Retry-After``) are retried after the advertised delay, as
client-go does; an optional token bucket stands in for a process's ``--kube-api-qps/burst``.
List-then-watch with resume, bookmarks and relist on 410 is ``sim.informer.Informer`` on top.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from sim.kubeconfig import Credentials, load_kubeconfig
from sim.kuberesources import Resource

__all__ = ["KubeApiError", "KubeClient", "ObjectList", "TokenBucket", "WatchEvent", "PATCH_TYPES"]

JSON = dict[str, Any]

PATCH_TYPES: dict[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


class KubeApiError(Exception):
    """A request the server refused; ``code``/``reason``/``message`` come from its Status object."""

    def __init__(self, code: int, reason: str, message: str, status: JSON | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.status = status or {}

    @property
    def not_found(self) -> bool:
        return self.code == 404

    @property
    def conflict(self) -> bool:
        """A stale resourceVersion (409 Conflict), not AlreadyExists."""
        return self.code == 409 and self.reason == "Conflict"

    @property
    def already_exists(self) -> bool:
        return self.code == 409 and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        """410: the resourceVersion or continue token is too old; relist."""
        return self.code == 410


@dataclasses.dataclass(frozen=True)
class ObjectList:
    """A whole (all pages) list: the items and the collection's resourceVersion to watch from."""

    items: list[JSON]
    resource_version: str


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED or BOOKMARK."""

    type: str
    object: JSON


class TokenBucket:
    """client-go's token-bucket rate limiter: ``qps`` tokens per second, at most ``burst`` saved."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps, self.burst = qps, burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._last = clock()
        self._lock = asyncio.Lock()

    def reserve(self) -> float:
        """Take one token now; the delay (seconds) the caller must wait before using it."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> None:
        async with self._lock:
            delay = self.reserve()
            if delay > 0:
                await self._sleep(delay)


def _error(code: int, body: bytes, fallback: str) -> KubeApiError:
    try:
        status = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        status = {}
    if not isinstance(status, dict) or status.get("kind") != "Status":
        return KubeApiError(code, fallback, body.decode(errors="replace")[:500])
    return KubeApiError(
        int(status.get("code") or code), str(status.get("reason") or fallback), str(status.get("message") or ""), status
    )


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    value = resp.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class KubeClient:
    """Base URL + credentials; one aiohttp session. ``async with KubeClient(url, token) as c:``."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        credentials: Credentials | None = None,
        user_agent: str = "tandem-sim",
        rate_limiter: TokenBucket | None = None,
        max_retries: int = 10,
        request_timeout_s: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._creds = credentials or Credentials(server=self.base_url, token=token)
        self._user_agent = user_agent
        self._limiter = rate_limiter
        self._max_retries = max_retries
        self._timeout = request_timeout_s
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None, **kwargs: Any) -> KubeClient:
        """A client for a kubeconfig's (current) context: token, token file or client certificate."""
        creds = load_kubeconfig(path, context)
        return cls(creds.server, credentials=creds, **kwargs)

    @property
    def token(self) -> str | None:
        return self._creds.token

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"User-Agent": self._user_agent, "Accept": "application/json"}
            if self._creds.token:
                headers["Authorization"] = f"Bearer {self._creds.token}"
            connector = aiohttp.TCPConnector(ssl=self._creds.ssl_context(), limit=100)
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """One request, retried on 429 (and 5xx carrying Retry-After); the caller reads and releases it."""
        session = self._ensure_session()
        headers = {"Content-Type": content_type} if content_type else {}
        attempt = 0
        while True:
            if self._limiter is not None:
                await self._limiter.acquire()
            resp = await session.request(
                method, self.base_url + path, params=params, data=body, headers=headers, timeout=timeout
            )
            delay = _retry_after(resp)
            retryable = resp.status == 429 or (resp.status >= 500 and delay is not None)
            if not retryable or attempt >= self._max_retries:
                return resp
            resp.release()
            attempt += 1
            await self._sleep(1.0 if delay is None else delay)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request and decode the JSON reply; a non-2xx reply raises KubeApiError."""
        data = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        resp = await self._send(method, path, params, data, content_type if data is not None else None, timeout)
        async with resp:
            raw = await resp.read()
            if resp.status >= 300:
                raise _error(resp.status, raw, resp.reason or "")
        return orjson.loads(raw) if raw else None

    # ---- verbs -------------------------------------------------------------------------------

    async def get(
        self, res: Resource, name: str, namespace: str | None = None, *, subresource: str | None = None
    ) -> JSON:
        out: JSON = await self.request("GET", res.path(namespace, name, subresource))
        return out

    async def list_page(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
    ) -> JSON:
        """One page of a list (the raw ``*List`` object)."""
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if limit:
            params["limit"] = str(limit)
        if continue_token:
            params["continue"] = continue_token
        if resource_version is not None:
            params["resourceVersion"] = resource_version
        out: JSON = await self.request("GET", res.path(namespace), params=params)
        return out

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
    ) -> ObjectList:
        """Every page; an expired continue token (410) falls back to one full list, like client-go's pager."""
        items: list[JSON] = []
        token: str | None = None
        page_limit = limit
        while True:
            try:
                page = await self.list_page(
                    res,
                    namespace,
                    label_selector=label_selector,
                    field_selector=field_selector,
                    limit=page_limit,
                    continue_token=token,
                )
            except KubeApiError as e:
                if not (e.gone and token):
                    raise
                items, token, page_limit = [], None, None
                continue
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                return ObjectList(items, str(meta.get("resourceVersion") or ""))

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = 300,
        allow_bookmarks: bool = True,
    ) -> AsyncIterator[WatchEvent]:
        """One watch request: events until the server ends the stream. ERROR events raise (410: ``gone``)."""
        params = {"watch": "1"}
        if resource_version is not None:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if timeout_seconds is not None:
            params["timeoutSeconds"] = str(timeout_seconds)
        if allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        read_timeout = None if timeout_seconds is None else timeout_seconds + 30.0
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout, sock_read=read_timeout)
        resp = await self._send("GET", res.path(namespace), params, None, None, timeout)
        async with resp:
            if resp.status >= 300:
                raise _error(resp.status, await resp.read(), resp.reason or "")
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield _event(line)
            if buf.strip():
                yield _event(buf)

    async def create(
        self,
        res: Resource,
        body: JSON,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        field_manager: str | None = None,
        field_validation: str | None = None,
    ) -> JSON:
        ns = (namespace or (body.get("metadata") or {}).get("namespace")) if res.namespaced else None
        params = _write_params(dry_run, field_manager, field_validation)
        out: JSON = await self.request("POST", res.path(ns), params=params, body=body)
        return out

    async def create_subresource(
        self, res: Resource, name: str, subresource: str, body: JSON, namespace: str | None = None
    ) -> JSON:
        """POST to a subresource, e.g. ``pods/<name>/binding`` or ``serviceaccounts/<name>/token``."""
        out: JSON = await self.request("POST", res.path(namespace, name, subresource), body=body)
        return out

    async def replace(
        self,
        res: Resource,
        body: JSON,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        """PUT the object (its metadata.resourceVersion, if set, is the precondition: 409 Conflict if stale)."""
        meta = body.get("metadata") or {}
        ns = (namespace or meta.get("namespace")) if res.namespaced else None
        out: JSON = await self.request(
            "PUT",
            res.path(ns, str(meta["name"]), subresource),
            params=_write_params(False, field_manager, None),
            body=body,
        )
        return out

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        *,
        patch_type: str,
        namespace: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        """PATCH with an explicit media type: ``json`` (RFC 6902), ``merge`` (RFC 7386) or ``strategic``."""
        out: JSON = await self.request(
            "PATCH",
            res.path(namespace, name, subresource),
            params=_write_params(False, field_manager, None),
            body=patch,
            content_type=PATCH_TYPES[patch_type],
        )
        return out

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> JSON:
        """DELETE with DeleteOptions; returns the object (still terminating) or a Success Status."""
        opts: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_seconds is not None:
            opts["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            opts["propagationPolicy"] = propagation_policy
        if preconditions:
            opts["preconditions"] = dict(preconditions)
        out: JSON = await self.request("DELETE", res.path(namespace, name), body=opts)
        return out


def _write_params(dry_run: bool, field_manager: str | None, field_validation: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if dry_run:
        params["dryRun"] = "All"
    if field_manager:
        params["fieldManager"] = field_manager
    if field_validation:
        params["fieldValidation"] = field_validation
    return params


def _event(line: bytes) -> WatchEvent:
    raw = orjson.loads(line)
    kind, obj = str(raw.get("type", "")), raw.get("object") or {}
    if kind == "ERROR":
        code = int(obj.get("code") or 500)
        raise KubeApiError(code, str(obj.get("reason") or ""), str(obj.get("message") or ""), obj)
    return WatchEvent(kind, obj)
