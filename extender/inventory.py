"""The cluster's GPU inventory, fed by the watcher (or a file), served as versioned snapshots.

The watcher calls `replace(kind, objects)` after each full list and `apply(kind, event, obj)` for
each watch event. Changes only mark the affected nodes dirty; `snapshot()` rebuilds the facts of
dirty nodes and the per-version index once, so a request does O(candidate nodes) lookups.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from extender.config import ExtenderConfig
from extender.errors import InventoryError
from extender.facts import DeviceKey, NodeFacts, build_facts
from extender.podreq import PodRecord, pod_record
from extender.reservations import HeldReservation, parse_reservation
from extender.snapshot import Snapshot
from placement.errors import PlacementError

__all__ = ["Inventory", "KINDS", "normalise_kind"]

log = logging.getLogger("tandem.extender.inventory")

_SIG_TABLE_LIMIT = 100_000

KINDS = ("Node", "Pod", "ResourceSlice", "ResourceClaim", "DeviceClass", "ConfigMap")
"""Kinds the inventory understands; ConfigMaps are reservation ConfigMaps."""

_ALIASES = (
    {k.lower(): k for k in KINDS}
    | {k.lower() + "s": k for k in KINDS}
    | {"deviceclasses": "DeviceClass"}
    | {"reservation": "ConfigMap", "reservations": "ConfigMap"}  # the watcher's name for them
)


def normalise_kind(kind: str) -> str:
    """'nodes', 'Node', 'node' -> 'Node' (raises InventoryError on anything else)."""
    k = _ALIASES.get(kind.lower())
    if k is None:
        raise InventoryError(f"unknown kind {kind!r}")
    return k


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _uid(obj: dict[str, Any]) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else None


class Inventory:
    """Raw objects by kind, derived per-node facts, and a snapshot per version.

    Thread-safe for one writer and many readers (the watcher and the app share an event loop in
    practice; the lock only guards the file-mode reload and tests that use threads).
    """

    def __init__(
        self,
        config: ExtenderConfig,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.RLock()
        self._objs: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in KINDS}
        self._synced: set[str] = set()
        self._records: dict[tuple[str, str], PodRecord] = {}
        self._pods_on: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self._pods_by_uid: dict[str, dict[str, Any]] = {}
        self._slices_on: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self._reservations: dict[tuple[str, str], HeldReservation] = {}
        self._expired: dict[tuple[str, str], HeldReservation] = {}
        """Reservations past their `expires_at`: kept out of every decision (their attempt never started)."""
        self._facts: dict[str, NodeFacts] = {}
        self._sorted_names: list[str] | None = None  # node names, sorted; None after a node comes or goes
        self._allocated: frozenset[DeviceKey] | None = None  # allocated DRA devices; None after a claim event
        self._relevant = False  # the last event changed something a decision reads
        self._sig_ids: dict[tuple[object, ...], int] = {}  # fit signatures -> ids (see facts.fit_signature)
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._version = 0
        self._snapshot: Snapshot | None = None
        self.last_change = clock()
        self.errors: list[str] = []
        self.query_cache: dict[tuple[str, str, int], Any] = {}
        """Parsed pod questions by (uid, resourceVersion, claims_version); owned by extender.decide."""
        self.claims_version = 0
        """Bumped by every ResourceClaim or DeviceClass event (a pod's question depends on its claims)."""

    # ------------------------------------------------------------------ readiness

    @property
    def synced(self) -> bool:
        """Every watched kind has had its first full list."""
        return all(k in self._synced for k in KINDS if k != "ConfigMap")

    @property
    def reservations_loaded(self) -> bool:
        return "ConfigMap" in self._synced

    @property
    def ready(self) -> bool:
        """Decisions can be trusted: first full sync done and reservations loaded."""
        return self.synced and self.reservations_loaded

    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ feeding

    def replace(self, kind: str, objects: Iterable[dict[str, Any]]) -> None:
        """A full list of one kind: replaces every object of that kind and marks it synced."""
        kind = normalise_kind(kind)
        with self._lock:
            if kind == "Node":
                self._sorted_names = None
            for obj in list(self._objs[kind].values()):
                self._remove(kind, obj)
            for obj in objects:
                self._put(kind, obj)
            self._synced.add(kind)
            self._relevant = True
            self._touch()

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED (BOOKMARK and others are ignored)."""
        kind = normalise_kind(kind)
        ev = event_type.upper()
        if ev not in ("ADDED", "MODIFIED", "DELETED"):
            return
        with self._lock:
            old = self._objs[kind].get(_key(obj))
            if old is not None:
                self._remove(kind, old)
            if ev != "DELETED":
                self._put(kind, obj)
            if kind == "Node" and (old is None) == (ev != "DELETED"):
                self._sorted_names = None  # a node came or went
            self._touch()

    def load_list(self, list_obj: dict[str, Any]) -> None:
        """File mode: a `kubectl get ... -o json` List; every kind counts as synced afterwards."""
        by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        items = list_obj.get("items") if list_obj.get("kind", "List").endswith("List") else [list_obj]
        for obj in items or []:
            kind = obj.get("kind")
            if not isinstance(kind, str):
                continue
            try:
                k = normalise_kind(kind)
            except InventoryError:
                continue
            if k == "ConfigMap" and not self._is_reservation(obj):
                continue
            by_kind[k].append(obj)
        for k, objs in by_kind.items():
            self.replace(k, objs)

    def _is_reservation(self, cm: dict[str, Any]) -> bool:
        meta = cm.get("metadata") or {}
        return meta.get("namespace") == self.config.reservation_namespace and self.config.reservation_label in (
            meta.get("labels") or {}
        )

    def _touch(self) -> None:
        """Bump the version if the events since the last bump changed anything decisions read
        (a pod that is only pending, unbound, changes nothing and keeps every cache)."""
        if self._relevant or self._dirty:
            self._version += 1
            self.last_change = self._clock()
        self._relevant = False

    def _put(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        if kind == "ConfigMap":
            if not self._is_reservation(obj):
                return
            try:
                res = parse_reservation(obj)
            except InventoryError as e:
                self._error(str(e))
                return
            if res.expired(self._wall()):
                self._expired[key] = res
            else:
                self._reservations[key] = res
                self._dirty.update(res.nodes)
        elif kind == "Node":
            self._dirty.add(key[1])
        elif kind == "Pod":
            self._put_pod(key, obj)
        elif kind == "ResourceSlice":
            node = str((obj.get("spec") or {}).get("nodeName") or "")
            self._slices_on.setdefault(node, {})[key] = obj
            self._dirty.add(node)
        elif kind in ("ResourceClaim", "DeviceClass"):
            self._claims_changed()
        self._objs[kind][key] = obj

    def _put_pod(self, key: tuple[str, str], obj: dict[str, Any]) -> None:
        uid = _uid(obj)
        if uid is not None:
            self._pods_by_uid[uid] = obj
        rec = pod_record(obj, self.config)
        if rec is not None:
            self._records[key] = rec
            self._pods_on.setdefault(rec.node, {})[key] = obj
            self._dirty.add(rec.node)

    def _remove(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        self._objs[kind].pop(key, None)
        if kind == "ConfigMap":
            self._expired.pop(key, None)
            res = self._reservations.pop(key, None)
            if res is not None:
                self._dirty.update(res.nodes)
        elif kind == "Node":
            self._dirty.add(key[1])
        elif kind == "Pod":
            self._remove_pod(key, obj)
        elif kind == "ResourceSlice":
            for node, slices in self._slices_on.items():
                if slices.pop(key, None) is not None:
                    self._dirty.add(node)
        elif kind in ("ResourceClaim", "DeviceClass"):
            self._claims_changed()

    def _remove_pod(self, key: tuple[str, str], obj: dict[str, Any]) -> None:
        uid = _uid(obj)
        if uid is not None:
            self._pods_by_uid.pop(uid, None)
        rec = self._records.pop(key, None)
        if rec is not None:
            self._pods_on.get(rec.node, {}).pop(key, None)
            self._dirty.add(rec.node)

    def _claims_changed(self) -> None:
        """A claim or device class changed: allocations are recomputed and every node with DRA devices is rebuilt."""
        self._allocated = None
        self._relevant = True
        self.claims_version += 1
        self._dirty.update(n for n, s in self._slices_on.items() if s)

    def _error(self, message: str) -> None:
        log.warning("inventory object skipped", extra={"detail": message})
        self.errors = (self.errors + [message])[-20:]

    def expire_reservations(self) -> int:
        """Drop reservations whose `expires_at` has passed (called periodically: expiry is a time, not an
        event); returns how many went. Their nodes' facts are rebuilt at the next snapshot."""
        now = self._wall()
        with self._lock:
            gone = [k for k, r in self._reservations.items() if r.expired(now)]
            for k in gone:
                res = self._reservations.pop(k)
                self._expired[k] = res
                self._dirty.update(res.nodes)
            if gone:
                self._touch()
        return len(gone)

    # ------------------------------------------------------------------ lookups

    def reservations(self) -> list[HeldReservation]:
        """Every reservation that holds something now (not expired)."""
        return list(self._reservations.values())

    def reservations_of(self, job: str, attempt: str) -> list[HeldReservation]:
        """The reservations recorded for one gang attempt."""
        return [r for r in self._reservations.values() if r.job == job and r.attempt == attempt]

    def pod_by_uid(self, uid: str) -> dict[str, Any] | None:
        return self._pods_by_uid.get(uid)

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objs["ResourceClaim"].get((namespace, name))

    def device_classes(self) -> dict[str, tuple[str, ...]]:
        """DeviceClass name -> CEL selectors; the config's fallbacks fill in missing classes."""
        out = {k: tuple(v) for k, v in self.config.fallback_device_classes.items()}
        for (_, name), dc in self._objs["DeviceClass"].items():
            sels = ((dc.get("spec") or {}).get("selectors")) or []
            out[name] = tuple(str((s.get("cel") or {}).get("expression", "true")) for s in sels)
        return out

    def objects(self, kind: str) -> list[dict[str, Any]]:
        return list(self._objs[normalise_kind(kind)].values())

    def _consumers(self) -> dict[DeviceKey, frozenset[str]]:
        """Allocated DRA devices -> UIDs of the pods their claim is reserved for."""
        out: dict[DeviceKey, frozenset[str]] = {}
        for claim in self._objs["ResourceClaim"].values():
            status = claim.get("status") or {}
            alloc = status.get("allocation") or {}
            uids = frozenset(str(r.get("uid", "")) for r in status.get("reservedFor") or [])
            for r in (alloc.get("devices") or {}).get("results") or []:
                out[(str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))] = uids
        return out

    # ------------------------------------------------------------------ snapshots

    def _build(
        self,
        name: str,
        allocated: frozenset[DeviceKey],
        without: frozenset[str] = frozenset(),
        reservations: Iterable[HeldReservation] | None = None,
    ) -> NodeFacts | None:
        node = self._objs["Node"].get(("", name))
        if node is None:
            return None
        pods = [
            (k, p)
            for k, p in self._pods_on.get(name, {}).items()
            if not without or str((p.get("metadata") or {}).get("uid")) not in without
        ]
        records = [self._records[k] for k, _ in pods if k in self._records]
        if reservations is None:
            reservations = [r for r in self._reservations.values() if name in r.nodes]
        if len(self._sig_ids) > _SIG_TABLE_LIMIT:
            self._sig_ids = {}
        try:
            return build_facts(
                node,
                [p for _, p in pods],
                records,
                self._slices_on.get(name, {}).values(),
                allocated,
                reservations,
                self.config,
                None if without else self._sig_ids,
            )
        except PlacementError as e:
            self._error(f"node {name}: {e}")
            return None

    def facts_for(self, name: str, *, without: frozenset[str] = frozenset()) -> NodeFacts | None:
        """Fresh facts of one node, optionally as if the pods with UIDs `without` were gone
        (their DRA devices too, when no other pod shares the claim)."""
        consumers = self._consumers()
        allocated = frozenset(k for k, uids in consumers.items() if not (without and uids and uids <= without))
        return self._build(name, allocated, without)

    def snapshot(self) -> Snapshot:
        """The snapshot of the current version. Only dirty nodes are rebuilt; when the node list
        is unchanged the new snapshot shares the index and carries verdicts of untouched rows."""
        snap = self._snapshot
        if snap is not None and snap.version == self._version:
            return snap
        with self._lock:
            same_nodes = self._sorted_names is not None and snap is not None
            if self._sorted_names is None:
                self._sorted_names = sorted(n for _, n in self._objs["Node"])
            if self._all_dirty:
                dirty = set(self._sorted_names)
                self._all_dirty = False
            else:
                dirty = self._dirty
            self._dirty = set()
            if self._allocated is None:
                self._allocated = frozenset(self._consumers()) if self._objs["ResourceClaim"] else frozenset()
            by_node: dict[str, list[HeldReservation]] = {}
            for r in self._reservations.values():
                for n in r.nodes:
                    by_node.setdefault(n, []).append(r)
            facts = self._facts
            for n in dirty:
                f = self._build(n, self._allocated, reservations=by_node.get(n, ()))
                if f is None:
                    facts.pop(n, None)
                else:
                    facts[n] = f
            changed: list[int] | None = None
            if same_nodes and snap is not None and all((n in facts) == (n in snap.index) for n in dirty):
                # The usual event (a pod bound, a node updated): same rows, a few replaced.
                names = snap.names
                rows = snap.facts.copy()
                changed = sorted(snap.index[n] for n in dirty if n in snap.index)
                for i in changed:
                    rows[i] = facts[names[i]]
            else:
                names = [n for n in self._sorted_names if n in facts]
                if len(facts) > len(names):
                    for n in set(facts) - set(names):
                        del facts[n]
                rows = [facts[n] for n in names]
                if snap is not None and snap.names == names:
                    changed = sorted(snap.index[n] for n in dirty if n in snap.index)
            snap = Snapshot.build(
                self._version, names, rows, self.device_classes(), previous=snap, changed=changed, config=self.config
            )
            self._snapshot = snap
            return snap
