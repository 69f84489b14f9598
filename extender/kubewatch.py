"""The list+watch loop behind kube.Watcher: paged lists, resumable watches, relists on 410, backoff on errors."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import aiohttp
import orjson

from extender.config import ExtenderConfig
from extender.kubecommon import Backoff, KubeError, ResourceVersionTooOld, error_from_reply

__all__ = ["INVENTORY_KINDS", "InventorySink", "Kind", "KubeSettings", "WatchLoop", "WatchSource"]

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
        return cls(
            reservation_namespace=config.reservation_namespace,
            reservation_label=config.reservation_label,
            gang_job_label=config.gang_job_label,
        )


ListFn = Callable[..., Awaitable[aiohttp.ClientResponse]]


@dataclasses.dataclass(frozen=True)
class WatchSource:
    """One kind to list and watch: the call that lists it, with the arguments that narrow it."""

    kind: Kind
    list_fn: ListFn  # a generated ``list_*_without_preload_content`` method: raw JSON, no model validation
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class WatchLoop:
    """Every source listed then watched into the inventory (kube.Watcher builds the sources and this state)."""

    _inventory: InventorySink
    _settings: KubeSettings
    _sleep: Callable[[float], Awaitable[None]]
    _clock: Callable[[], float]
    _rand: Callable[[], float]
    _on_synced: Callable[[], None] | None
    _on_reservations_loaded: Callable[[], None] | None
    _sources: list[WatchSource]
    _pending: set[Kind]
    synced: asyncio.Event
    reservations_loaded: asyncio.Event
    resource_versions: dict[Kind, str | None]

    async def run(self) -> None:
        """Watch every kind until cancelled."""
        async with asyncio.TaskGroup() as group:
            for source in self._sources:
                group.create_task(self._run_source(source), name=f"watch-{source.kind.value}")

    async def _run_source(self, source: WatchSource) -> None:
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
            except ResourceVersionTooOld as e:
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
            except (TimeoutError, aiohttp.ClientError, ValueError) as e:
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

    async def _fail(self, source: WatchSource, backoff: Backoff, error: BaseException) -> None:
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

    async def _list(self, source: WatchSource) -> str:
        """Fetch every page of the list, hand the items to replace(), return the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            resp = await source.list_fn(
                *source.args, limit=self._settings.list_page_size, _continue=token, **source.kwargs
            )
            if resp.status != 200:
                raise await error_from_reply(resp)
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

    async def _watch(self, source: WatchSource, rv: str, backoff: Backoff) -> tuple[str, bool]:
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
            raise await error_from_reply(resp)
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
            raise ResourceVersionTooOld(code, message) if code == 410 else KubeError(code, message)
        new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or rv
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self._inventory.apply(kind.value, etype, obj)
            except Exception as e:
                raise _InventoryError(0, repr(e)) from e
        elif etype != "BOOKMARK":
            raise ValueError(f"unknown watch event type {etype!r}")
        return new_rv
