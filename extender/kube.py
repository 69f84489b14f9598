"""Feed the extender's inventory from the Kubernetes API by list+watch (the one extender module that imports kubernetes)."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import aiohttp
import orjson
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from extender.config import ExtenderConfig
from extender.errors import ExtenderError

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

log = logging.getLogger("tandem.extender.kube")

RESERVATION_LABEL = "tandem.dev/reservation"


class Kind(str, enum.Enum):
    """The object kinds the inventory is fed with; the value is the ``kind`` string passed to the inventory."""

    NODE = "Node"
    POD = "Pod"
    RESOURCE_SLICE = "ResourceSlice"
    RESOURCE_CLAIM = "ResourceClaim"
    DEVICE_CLASS = "DeviceClass"
    RESERVATION = "Reservation"  # ConfigMaps labelled tandem.dev/reservation
    JOB = "Job"  # Tandem's batch/v1 Jobs (labelled tandem.dev/job): the agent's, not the extender's


INVENTORY_KINDS = frozenset(k for k in Kind if k is not Kind.JOB)
"""What the extender's inventory is fed with (the default of `Watcher`)."""


class InventorySink(Protocol):
    """What the watcher needs from the inventory (extender.inventory.Inventory satisfies it)."""

    def replace(self, kind: str, objects: list[dict[str, Any]]) -> None: ...

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None: ...


class KubeError(ExtenderError):
    """A kube API call failed; ``status`` is the HTTP status (0 when the stream itself was bad)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class _Gone(KubeError):
    """The resourceVersion we resume from is too old (HTTP 410 or an ERROR event with code 410): relist."""


class _InventoryError(KubeError):
    """The inventory raised on an object we handed it."""


@dataclasses.dataclass(frozen=True)
class KubeSettings:
    """How the watcher talks to the API server. Every field has a default."""

    reservation_namespace: str = "tandem-system"
    """Namespace holding the reservation ConfigMaps."""
    reservation_label: str = RESERVATION_LABEL
    """Label selector of the reservation ConfigMaps (a label key: presence selects)."""
    gang_job_label: str = "tandem.dev/job"
    """Label selector of Tandem's Jobs (Kind.JOB; the agent watches them)."""
    watch_timeout_s: int = 300
    """Server-side ``timeoutSeconds`` of one watch request, seconds; jittered by up to +20%."""
    list_page_size: int = 500
    """``limit`` of one list page, objects; large pod lists are fetched in pages."""
    backoff_base_s: float = 0.5
    """First reconnect delay after a failure, seconds."""
    backoff_cap_s: float = 30.0
    """Largest reconnect delay, seconds."""
    stable_after_s: float = 10.0
    """A watch that lived this long (or delivered an event) resets the backoff, seconds."""
    absent_api_retry_s: float = 300.0
    """Re-check interval for an API group the server does not serve (404 on list), seconds."""

    @classmethod
    def from_config(cls, config: ExtenderConfig) -> KubeSettings:
        """The one way to build it: the reservation namespace and label from the extender's config."""
        return cls(reservation_namespace=config.reservation_namespace, reservation_label=config.reservation_label,
                   gang_job_label=config.gang_job_label)


@dataclasses.dataclass
class Backoff:
    """Capped exponential backoff with equal jitter: delay n is in [d/2, d], d = min(cap, base * 2**n)."""

    base_s: float
    cap_s: float
    rand: Callable[[], float] = random.random
    failures: int = 0

    def next_delay(self) -> float:
        d = min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return d / 2 + self.rand() * d / 2

    def reset(self) -> None:
        self.failures = 0


ListFn = Callable[..., Awaitable[aiohttp.ClientResponse]]


@dataclasses.dataclass(frozen=True)
class _Source:
    kind: Kind
    list_fn: ListFn  # a generated ``list_*_without_preload_content`` method: raw JSON, no model validation
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _sources(api: kclient.ApiClient, settings: KubeSettings) -> list[_Source]:
    core = kclient.CoreV1Api(api)
    dra = kclient.ResourceV1Api(api)
    batch = kclient.BatchV1Api(api)
    return [
        _Source(Kind.JOB, batch.list_job_for_all_namespaces_without_preload_content,
                kwargs={"label_selector": settings.gang_job_label}),
        _Source(Kind.NODE, core.list_node_without_preload_content),
        _Source(Kind.POD, core.list_pod_for_all_namespaces_without_preload_content),
        _Source(Kind.RESOURCE_SLICE, dra.list_resource_slice_without_preload_content),
        _Source(Kind.RESOURCE_CLAIM, dra.list_resource_claim_for_all_namespaces_without_preload_content),
        _Source(Kind.DEVICE_CLASS, dra.list_device_class_without_preload_content),
        _Source(
            Kind.RESERVATION,
            core.list_namespaced_config_map_without_preload_content,
            (settings.reservation_namespace,),
            {"label_selector": settings.reservation_label},
        ),
    ]


async def _error_of(resp: aiohttp.ClientResponse) -> KubeError:
    """Turn a non-200 reply into a KubeError carrying the Status message; 410 becomes _Gone."""
    try:
        body = await resp.read()
        status = orjson.loads(body)
        message = str(status.get("message", "")) if isinstance(status, dict) else ""
    except (ValueError, aiohttp.ClientError):
        message = ""
    finally:
        resp.release()
    message = message or (resp.reason or "")
    cls = _Gone if resp.status == 410 else KubeError
    return cls(resp.status, message)


class Watcher:
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

    async def run(self) -> None:
        """Watch every kind until cancelled."""
        async with asyncio.TaskGroup() as group:
            for source in self._sources:
                group.create_task(self._run_source(source), name=f"watch-{source.kind.value}")

    async def _run_source(self, source: _Source) -> None:
        backoff = Backoff(self._settings.backoff_base_s, self._settings.backoff_cap_s, self._rand)
        rv: str | None = None
        gone_streak = 0
        while True:
            try:
                if rv is None:
                    rv = await self._list(source)
                    self._listed(source.kind)
                rv, delivered = await self._watch(source, rv, backoff)
                if delivered:
                    gone_streak = 0
            except _Gone as e:
                log.info("watch expired, relisting", extra={"detail": {"kind": source.kind.value}})
                rv = None
                gone_streak += 1
                if gone_streak > 1:  # 410 again right after a relist: do not spin
                    await self._fail(source, backoff, e)
            except _InventoryError as e:
                # The inventory refused an object: start over from a fresh list after a pause.
                log.exception("inventory update failed", extra={"detail": {"kind": source.kind.value}})
                rv = None
                await self._fail(source, backoff, e)
            except KubeError as e:
                if e.status == 404 and rv is None:
                    # The API group is not served (e.g. no DRA on this cluster): nothing of this kind exists.
                    log.warning("kind not served, treating as empty", extra={"detail": {"kind": source.kind.value}})
                    self._replace(source.kind, [])
                    self._listed(source.kind)
                    await self._sleep(self._settings.absent_api_retry_s)
                    continue
                rv = self._resume_version(source.kind, rv)
                await self._fail(source, backoff, e)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                rv = self._resume_version(source.kind, rv)
                await self._fail(source, backoff, e)

    def _resume_version(self, kind: Kind, rv: str | None) -> str | None:
        # Resume after the last event applied before the failure; never resume from a list that failed.
        return None if rv is None else self.resource_versions[kind]

    def _replace(self, kind: Kind, items: list[dict[str, Any]]) -> None:
        try:
            self._inventory.replace(kind.value, items)
        except Exception as e:
            raise _InventoryError(0, repr(e)) from e

    async def _fail(self, source: _Source, backoff: Backoff, error: BaseException) -> None:
        delay = backoff.next_delay()
        log.warning(
            "watch failed, retrying",
            extra={"error": repr(error), "detail": {"kind": source.kind.value, "delay_s": round(delay, 3)}},
        )
        await self._sleep(delay)

    def _listed(self, kind: Kind) -> None:
        if kind is Kind.RESERVATION and not self.reservations_loaded.is_set():
            self.reservations_loaded.set()
            if self._on_reservations_loaded is not None:
                self._on_reservations_loaded()
        self._pending.discard(kind)
        if not self._pending and not self.synced.is_set():
            self.synced.set()
            log.info("inventory synced")
            if self._on_synced is not None:
                self._on_synced()

    async def _list(self, source: _Source) -> str:
        """Fetch every page of the list, hand the items to replace(), return the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            resp = await source.list_fn(
                *source.args, limit=self._settings.list_page_size, _continue=token, **source.kwargs
            )
            if resp.status != 200:
                raise await _error_of(resp)
            try:
                page = orjson.loads(await resp.read())
            finally:
                resp.release()
            if not isinstance(page, dict):
                raise ValueError("list reply is not an object")
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                rv = str(meta.get("resourceVersion") or "")
                break
        self._replace(source.kind, items)
        self.resource_versions[source.kind] = rv
        log.info("listed", extra={"detail": {"kind": source.kind.value, "count": len(items)}, "version": rv})
        # An empty resourceVersion would make the watch start "from now" and skip events: relist instead.
        if not rv:
            raise KubeError(0, "list returned no resourceVersion")
        return rv

    async def _watch(self, source: _Source, rv: str, backoff: Backoff) -> tuple[str, bool]:
        """Stream one watch request from ``rv``; return the version to resume from and whether events came."""
        timeout = int(self._settings.watch_timeout_s * (1 + 0.2 * self._rand()))
        started = self._clock()
        delivered = False
        resp = await source.list_fn(
            *source.args,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=rv,
            timeout_seconds=timeout,
            _request_timeout=float(timeout + 30),
            **source.kwargs,
        )
        if resp.status != 200:
            raise await _error_of(resp)
        try:
            async for line in resp.content:
                if not line.strip():
                    continue
                rv = self._event(source.kind, line, rv)
                self.resource_versions[source.kind] = rv
                delivered = True
                backoff.reset()
        finally:
            resp.release()
        if delivered or self._clock() - started >= self._settings.stable_after_s:
            backoff.reset()  # a healthy watch: the next failure starts from the base delay again
        else:
            # The server closed an empty watch at once: back off so a misbehaving server is not hammered.
            await self._fail(source, backoff, KubeError(0, "watch closed early"))
        return rv, delivered

    def _event(self, kind: Kind, line: bytes, rv: str) -> str:
        """Apply one watch event line; return the new resume version. Raises on ERROR events and bad lines."""
        event = orjson.loads(line)
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ValueError("malformed watch event")
        etype = event.get("type")
        obj: dict[str, Any] = event["object"]
        if etype == "ERROR":
            code = int(obj.get("code") or 0)
            message = str(obj.get("message", ""))
            raise _Gone(code, message) if code == 410 else KubeError(code, message)
        new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or rv
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self._inventory.apply(kind.value, etype, obj)
            except Exception as e:
                raise _InventoryError(0, repr(e)) from e
        elif etype != "BOOKMARK":
            raise ValueError(f"unknown watch event type {etype!r}")
        return new_rv


async def load_api_client(
    host: str | None = None, kubeconfig: str | None = None, context: str | None = None, token: str | None = None,
    *, in_cluster: bool = False,
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


def api_path(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None,
             sub: str | None = None) -> str:
    """REST path of a collection or object: `/api/v1/...` for the core group, `/apis/<g>/<v>/...` else."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
        if sub:
            path += f"/{sub}"
    return path


class NotLeader(KubeError):
    """A mutating call was refused by the leader guard: this replica is not (or no longer) the leader."""

    def __init__(self) -> None:
        super().__init__(0, "not the leader: mutating calls are refused")


class KubeClient:
    """Raw JSON requests to the API server for everything the agent writes (no generated models: nothing
    is dropped or re-validated on the way). Writes use `fieldValidation=Strict`; every patch names its
    media type; every delete names its propagation policy (FLEET-NOTES A-6, A-7); 429 and 5xx answers are
    retried after `Retry-After` (API Priority and Fairness throttles bursts). Mutating calls first ask
    `guard`: a replica that lost the leader Lease must not write (A-11)."""

    def __init__(
        self, api: kclient.ApiClient, *, field_manager: str = "tandem-agent", timeout_s: float = 30.0,
        retries: int = 4, guard: Callable[[], bool] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.api = api
        self.field_manager = field_manager
        self.timeout_s = timeout_s
        self.retries = retries
        self.guard = guard
        self._sleep = sleep
        self.errors: dict[int, int] = {}
        """Failed requests by HTTP status (0 = transport), for the agent's metrics."""

    async def request(
        self, method: str, path: str, *, body: Any = None, query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json", mutating: bool | None = None,
    ) -> dict[str, Any]:
        """One request; the reply's JSON object, or KubeError (status, Status reason and message)."""
        if mutating is None:
            mutating = method != "GET"
        for attempt in range(self.retries + 1):
            if mutating and self.guard is not None and not self.guard():
                raise NotLeader()
            headers = {"Accept": "application/json", "Content-Type": content_type}
            params = await self.api.param_serialize(
                method=method, resource_path=path, query_params=query or [], header_params=headers, body=body,
                auth_settings=["BearerToken"],
            )
            try:
                resp = (await self.api.call_api(*params, _preload_content=False,
                                                _request_timeout=self.timeout_s)).response
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                self.errors[0] = self.errors.get(0, 0) + 1
                if attempt == self.retries:
                    raise KubeError(0, repr(e)) from e
                await self._sleep(min(8.0, 0.2 * 2 ** attempt))
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
                await self._sleep(min(30.0, float(retry_after)) if told else min(8.0, 0.2 * 2 ** attempt))
                continue
            raise await _error_of(resp)
        raise KubeError(0, "unreachable")  # pragma: no cover - the loop returns or raises

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
        query = [("fieldManager", self.field_manager), ("fieldValidation", "Strict")]
        if dry_run:
            query.append(("dryRun", "All"))
        return await self.request("POST", path, body=body, query=query)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        query = [("fieldManager", self.field_manager), ("fieldValidation", "Strict")]
        return await self.request("PUT", path, body=body, query=query)

    async def patch(self, path: str, patch: Any, *, content_type: str) -> dict[str, Any]:
        """A patch of an explicit media type (JSON Patch for lists; never a merge patch on lists)."""
        query = [("fieldManager", self.field_manager), ("fieldValidation", "Strict")]
        return await self.request("PATCH", path, body=patch, query=query, content_type=content_type)

    async def delete(self, path: str, *, propagation_policy: str, grace_period_s: int | None = None,
                     preconditions: dict[str, str] | None = None) -> dict[str, Any] | None:
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

    async def delete_collection(self, path: str, *, label_selector: str, propagation_policy: str,
                                grace_period_s: int | None = None) -> None:
        query = [("labelSelector", label_selector)]
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        await self.request("DELETE", path, body=options, query=query)

    async def server_version(self) -> str:
        """`gitVersion` of the API server, e.g. "v1.36.1" ("" when it does not say)."""
        info = await self.request("GET", "/version")
        return str(info.get("gitVersion", ""))

    async def can_i(self, verb: str, resource: str, *, group: str = "", namespace: str = "", name: str = "",
                    subresource: str = "") -> tuple[bool, str]:
        """A SelfSubjectAccessReview: whether this identity may do it, and the server's reason."""
        attrs = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        if subresource:
            attrs["subresource"] = subresource
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": attrs}}
        out = await self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review,
                                 mutating=False)
        status = out.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason", "") or status.get("evaluationError", ""))


# Namespaced kinds the agent creates, by kind: (API group, version, plural).
WRITABLE: dict[str, tuple[str, str, str]] = {
    "ConfigMap": ("", "v1", "configmaps"),
    "Service": ("", "v1", "services"),
    "Job": ("batch", "v1", "jobs"),
}


async def _raw(
    api: kclient.ApiClient, method: str, path: str, body: dict[str, Any] | None = None,
    query: list[tuple[str, str]] | None = None,
) -> aiohttp.ClientResponse:
    """One request with a raw JSON body and reply (no generated models: nothing is dropped or re-validated)."""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    params = await api.param_serialize(
        method=method, resource_path=path, query_params=query or [], header_params=headers, body=body,
        auth_settings=["BearerToken"],
    )
    resp = await api.call_api(*params, _preload_content=False)
    raw: aiohttp.ClientResponse = resp.response
    return raw


async def create_or_get(
    api: kclient.ApiClient, body: dict[str, Any], *, field_manager: str = "tandem-agent"
) -> tuple[dict[str, Any], bool]:
    """Create a namespaced object, or return the one of that name that already exists (idempotent dispatch).

    Returns (the object as the server has it, whether this call created it). Another object of the
    same name is returned as is: the caller decides whether it is its own (labels name job and attempt).
    """
    group, version, plural = WRITABLE[body["kind"]]
    meta = body["metadata"]
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    collection = f"{base}/namespaces/{meta['namespace']}/{plural}"
    resp = await _raw(api, "POST", collection, body, [("fieldManager", field_manager)])
    if resp.status in (200, 201, 202):
        try:
            created: dict[str, Any] = orjson.loads(await resp.read())
        finally:
            resp.release()
        return created, True
    if resp.status != 409:
        raise await _error_of(resp)
    resp.release()
    resp = await _raw(api, "GET", f"{collection}/{meta['name']}")
    if resp.status != 200:
        raise await _error_of(resp)  # e.g. 404: deleted between our POST and GET; the caller retries
    try:
        existing: dict[str, Any] = orjson.loads(await resp.read())
    finally:
        resp.release()
    return existing, False
