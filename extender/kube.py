"""The Kubernetes API client: its loading, the Watcher's sources, raw JSON requests, writes (the one kubernetes importer)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from extender.kubecommon import Backoff, KubeError, error_from_reply
from extender.kubecommon import NotLeader as NotLeader
from extender.kubecommon import api_path as api_path
from extender.kubewatch import INVENTORY_KINDS as INVENTORY_KINDS
from extender.kubewatch import InventorySink, Kind, KubeSettings, WatchLoop, WatchSource

__all__ = [
    "Backoff",
    "InventorySink",
    "Kind",
    "KubeError",
    "KubeSettings",
    "Watcher",
    "create_or_get",
    "load_api_client",
]


def _sources(api: kclient.ApiClient, settings: KubeSettings) -> list[WatchSource]:
    core = kclient.CoreV1Api(api)
    dra = kclient.ResourceV1Api(api)
    batch = kclient.BatchV1Api(api)
    return [
        WatchSource(
            Kind.JOB,
            batch.list_job_for_all_namespaces_without_preload_content,
            kwargs={"label_selector": settings.gang_job_label},
        ),
        WatchSource(Kind.NODE, core.list_node_without_preload_content),
        WatchSource(Kind.POD, core.list_pod_for_all_namespaces_without_preload_content),
        WatchSource(Kind.RESOURCE_SLICE, dra.list_resource_slice_without_preload_content),
        WatchSource(Kind.RESOURCE_CLAIM, dra.list_resource_claim_for_all_namespaces_without_preload_content),
        WatchSource(Kind.DEVICE_CLASS, dra.list_device_class_without_preload_content),
        WatchSource(
            Kind.RESERVATION,
            core.list_namespaced_config_map_without_preload_content,
            (settings.reservation_namespace,),
            {"label_selector": settings.reservation_label},
        ),
    ]


class Watcher(WatchLoop):
    """List then watch every kind into an inventory; relist on 410, reconnect with backoff on errors.

    ``synced`` is set (and ``on_synced`` called once) when every kind has completed its first list;
    ``reservations_loaded`` likewise after the reservation ConfigMaps were listed.
    """

    def __init__(
        self,
        api: kclient.ApiClient,
        inventory: InventorySink,
        settings: KubeSettings = KubeSettings(),
        *,
        on_synced: Callable[[], None] | None = None,
        on_reservations_loaded: Callable[[], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        kinds: frozenset[Kind] | None = None,
    ) -> None:
        self._inventory = inventory
        self._settings = settings
        self._sleep = sleep
        self._clock = clock
        self._rand = rand
        self._on_synced = on_synced
        self._on_reservations_loaded = on_reservations_loaded
        wanted = INVENTORY_KINDS if kinds is None else kinds
        self._sources = [s for s in _sources(api, settings) if s.kind in wanted]
        self._pending = {s.kind for s in self._sources}
        self.synced = asyncio.Event()
        self.reservations_loaded = asyncio.Event()
        self.resource_versions: dict[Kind, str | None] = {s.kind: None for s in self._sources}


async def load_api_client(
    host: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    token: str | None = None,
    *,
    in_cluster: bool = False,
) -> kclient.ApiClient:
    """Build the API client: an explicit host (tests, proxies; with a bearer `token`), else in-cluster (the
    pod's service account: `in_cluster`, as KubeAccess resolved it), else kubeconfig (None = the client's
    default)."""
    cfg = kclient.Configuration()
    if host:
        cfg.host = host
        if token:
            cfg.api_key = {"authorization": f"Bearer {token}"}
    elif in_cluster:
        kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await kconfig.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=cfg
        )
    return kclient.ApiClient(cfg)


async def _send(
    api: kclient.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    query: list[tuple[str, str]] | None = None,
    content_type: str = "application/json",
    timeout_s: float | None = None,
) -> aiohttp.ClientResponse:
    """One request with a raw JSON body and reply (no generated models: nothing is dropped or re-validated);
    `timeout_s` None is the client's own default."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    params = await api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = await api.call_api(*params, _preload_content=False, _request_timeout=timeout_s)
    raw: aiohttp.ClientResponse = resp.response
    return raw


@dataclasses.dataclass(eq=False)
class KubeClient:
    """Raw JSON requests to the API server for everything the agent writes (no generated models: nothing
    is dropped or re-validated on the way). Writes use `fieldValidation=Strict`; every patch names its
    media type; every delete names its propagation policy (FLEET-NOTES A-6, A-7); 429 and 5xx answers are
    retried after `Retry-After` (API Priority and Fairness throttles bursts). Mutating calls first ask
    `guard`: a replica that lost the leader Lease must not write (A-11)."""

    api: kclient.ApiClient
    _: dataclasses.KW_ONLY
    field_manager: str = "tandem-agent"
    timeout_s: float = 30.0
    retries: int = 4
    guard: Callable[[], bool] | None = None
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    errors: dict[int, int] = dataclasses.field(default_factory=dict, init=False)
    """Failed requests by HTTP status (0 = transport), for the agent's metrics."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        mutating: bool | None = None,
    ) -> dict[str, Any]:
        """One request; the reply's JSON object, or KubeError (status, Status reason and message)."""
        if mutating is None:
            mutating = method != "GET"
        for attempt in range(self.retries + 1):
            if mutating and self.guard is not None and not self.guard():
                raise NotLeader()
            try:
                resp = await _send(self.api, method, path, body, query, content_type, self.timeout_s)
            except (TimeoutError, aiohttp.ClientError) as e:
                self.errors[0] = self.errors.get(0, 0) + 1
                if attempt == self.retries:
                    raise KubeError(0, repr(e)) from e
                await self.sleep(min(8.0, 0.2 * 2**attempt))
                continue
            if resp.status < 300:
                try:
                    raw = await resp.read()
                finally:
                    resp.release()
                out = orjson.loads(raw) if raw else {}
                return out if isinstance(out, dict) else {"items": out}
            self.errors[resp.status] = self.errors.get(resp.status, 0) + 1
            if (resp.status == 429 or resp.status >= 500) and attempt < self.retries:
                retry_after = resp.headers.get("Retry-After", "")
                resp.release()
                told = retry_after.isascii() and retry_after.isdigit()
                # the server's hint, but not an unbounded one (a proxy's Retry-After may say anything)
                await self.sleep(min(30.0, float(retry_after)) if told else min(8.0, 0.2 * 2**attempt))
                continue
            raise await error_from_reply(resp)
        raise KubeError(0, "unreachable")  # pragma: no cover - the loop returns or raises

    def write_query(self) -> list[tuple[str, str]]:
        """The query of every write: it names the field manager and has unknown or duplicate fields refused."""
        return [("fieldManager", self.field_manager), ("fieldValidation", "Strict")]

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", path)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, path: str, *, label_selector: str = "", field_selector: str = "") -> list[dict[str, Any]]:
        """Every item of a collection (all pages)."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = [("limit", "500")]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if token:
                query.append(("continue", token))
            page = await self.request("GET", path, query=query)
            items.extend(page.get("items") or [])
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    async def create(self, path: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        query = self.write_query()
        if dry_run:
            query.append(("dryRun", "All"))
        return await self.request("POST", path, body=body, query=query)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", path, body=body, query=self.write_query())

    async def patch(self, path: str, patch: Any, *, content_type: str) -> dict[str, Any]:
        """A patch of an explicit media type (JSON Patch for lists; never a merge patch on lists)."""
        return await self.request("PATCH", path, body=patch, query=self.write_query(), content_type=content_type)

    async def delete(
        self,
        path: str,
        *,
        propagation_policy: str,
        grace_period_s: int | None = None,
        preconditions: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """Delete with an explicit propagation policy (a Job deleted without one orphans its pods);
        None when it was already gone."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        if preconditions:
            options["preconditions"] = preconditions
        try:
            return await self.request("DELETE", path, body=options)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def delete_collection(
        self, path: str, *, label_selector: str, propagation_policy: str, grace_period_s: int | None = None
    ) -> None:
        query = [("labelSelector", label_selector)]
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        await self.request("DELETE", path, body=options, query=query)

    async def server_version(self) -> str:
        """`gitVersion` of the API server, e.g. "v1.36.1" ("" when it does not say)."""
        info = await self.request("GET", "/version")
        return str(info.get("gitVersion", ""))

    async def can_i(
        self, verb: str, resource: str, *, group: str = "", namespace: str = "", name: str = "", subresource: str = ""
    ) -> tuple[bool, str]:
        """A SelfSubjectAccessReview: whether this identity may do it, and the server's reason."""
        attrs = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        if subresource:
            attrs["subresource"] = subresource
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        out = await self.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review, mutating=False
        )
        status = out.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason", "") or status.get("evaluationError", ""))


# Namespaced kinds the agent creates, by kind: (API group, version, plural).
WRITABLE: dict[str, tuple[str, str, str]] = {
    "ConfigMap": ("", "v1", "configmaps"),
    "Service": ("", "v1", "services"),
    "Job": ("batch", "v1", "jobs"),
}


async def create_or_get(
    api: kclient.ApiClient, body: dict[str, Any], *, field_manager: str = "tandem-agent"
) -> tuple[dict[str, Any], bool]:
    """Create a namespaced object, or return the one of that name that already exists (idempotent dispatch).

    Returns (the object as the server has it, whether this call created it). Another object of the
    same name is returned as is: the caller decides whether it is its own (labels name job and attempt).
    """
    group, version, plural = WRITABLE[body["kind"]]
    meta = body["metadata"]
    resp = await _send(
        api, "POST", api_path(group, version, plural, meta["namespace"]), body, [("fieldManager", field_manager)]
    )
    if resp.status in (200, 201, 202):
        try:
            created: dict[str, Any] = orjson.loads(await resp.read())
        finally:
            resp.release()
        return created, True
    if resp.status != 409:
        raise await error_from_reply(resp)
    resp.release()
    resp = await _send(api, "GET", api_path(group, version, plural, meta["namespace"], meta["name"]))
    if resp.status != 200:
        raise await error_from_reply(resp)  # e.g. 404: deleted between our POST and GET; the caller retries
    try:
        existing: dict[str, Any] = orjson.loads(await resp.read())
    finally:
        resp.release()
    return existing, False
