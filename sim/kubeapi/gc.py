"""The in-server controllers: the garbage collector and the ResourceQuota status (PodGC is a client, sim/podgc.py).

Like kube-controller-manager they run asynchronously (an asyncio task fed by the store's
events), so a DELETE returns before its dependents go. Owner references are resolved by
kind and name in the dependent's own namespace and must match the owner's uid: a
cross-namespace or vanished owner is absent, and a dependent whose owners are all absent is
deleted. Owners carrying `orphan` lose their references from dependents; owners carrying
`foregroundDeletion` get their dependents deleted first and wait for every dependent with
`blockOwnerDeletion: true` to be gone.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from sim.kubeapi import admission
from sim.kubeapi.deletion import FOREGROUND, ORPHAN, DeleteOptions, Deleter
from sim.kubeapi.objects import Obj, clone
from sim.kubeapi.resources import RESOURCES, ResourceType, by_kind, by_path
from sim.kubeapi.state import ApiState
from sim.kubeapi.store import Event
from sim.kubeapi.writes import finished_deleting

__all__ = ["Controllers"]

log = logging.getLogger("tandem.sim.kubeapi.gc")

Key = tuple[str, str, str]  # (resource key, namespace, name)
_BY_KEY: dict[str, ResourceType] = {r.key: r for r in RESOURCES}


def _rt(key: str) -> ResourceType:
    return _BY_KEY[key]


class Controllers:
    """GC + ResourceQuota status, one work queue, one task."""

    def __init__(self, state: ApiState, deleter: Deleter) -> None:
        self.state = state
        self.deleter = deleter
        self._dependents: dict[str, set[Key]] = collections.defaultdict(set)
        self._queue: collections.deque[tuple[str, Key]] = collections.deque()
        self._queued: set[tuple[str, Key]] = set()
        self._wake = asyncio.Event()
        self._dirty_quota_ns: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        state.store.on_every_write(self._observe)

    # -- event intake (synchronous, inside the write) ------------------------------------

    def _enqueue(self, kind: str, key: Key) -> None:
        item = (kind, key)
        if item not in self._queued:
            self._queued.add(item)
            self._queue.append(item)
            self._wake.set()

    def _observe(self, event: Event) -> None:
        obj, prev = event.obj, event.prev
        meta = obj["metadata"]
        key: Key = (event.key, str(meta.get("namespace") or ""), str(meta["name"]))
        old_owners = {r.get("uid") for r in (prev or {}).get("metadata", {}).get("ownerReferences") or []}
        new_owners = {r.get("uid") for r in meta.get("ownerReferences") or []} if event.type != "DELETED" else set()
        for uid in old_owners - new_owners:
            self._dependents[str(uid)].discard(key)
        for uid in new_owners:
            self._dependents[str(uid)].add(key)
        if new_owners and (event.type == "ADDED" or new_owners != old_owners):
            self._enqueue("dependent", key)
        if event.type == "DELETED":
            for dep in list(self._dependents.get(str(meta.get("uid")), ())):
                self._enqueue("dependent", dep)
            for owner_key in self._owner_keys(obj):
                self._enqueue("owner", owner_key)
        else:
            finalizers = meta.get("finalizers") or []
            if meta.get("deletionTimestamp") and (ORPHAN in finalizers or FOREGROUND in finalizers):
                self._enqueue("owner", key)
            if meta.get("deletionTimestamp"):
                for owner_key in self._owner_keys(obj):
                    self._enqueue("owner", owner_key)
        if key[1] and (event.key in ("/pods", "/resourcequotas") or event.type in ("ADDED", "DELETED")):
            self._dirty_quota_ns.add(key[1])
            self._wake.set()

    def _owner_keys(self, obj: Obj) -> list[Key]:
        out = []
        ns = str(obj["metadata"].get("namespace") or "")
        for ref in obj["metadata"].get("ownerReferences") or []:
            owner_rt = by_kind(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
            if owner_rt is not None:
                out.append((owner_rt.key, ns if owner_rt.namespaced else "", str(ref.get("name"))))
        return out

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kubeapi-controllers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue or self._dirty_quota_ns:
                if self._queue:
                    item = self._queue.popleft()
                    self._queued.discard(item)
                    try:
                        self._process(*item)
                    except Exception:  # a controller never dies on one object; it logs and goes on
                        log.exception("controller item failed", extra={"item": repr(item)})
                else:
                    self._flush_quota()
                await asyncio.sleep(0)

    def _process(self, kind: str, key: Key) -> None:
        obj = self.state.store.get(*key)
        if obj is None:
            return
        if kind == "dependent":
            self._attempt_to_delete(key, obj)
        elif kind == "owner":
            self._process_owner(key, obj)

    # -- garbage collection ---------------------------------------------------------------

    def _classify(self, key: Key, obj: Obj) -> tuple[list[Obj], list[Obj], list[Obj]]:
        solid, dangling, waiting = [], [], []
        dep_ns = key[1]
        for ref in obj["metadata"].get("ownerReferences") or []:
            owner_rt = by_kind(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
            if owner_rt is None:
                solid.append(ref)  # unknown kind: cannot be resolved, so never treated as absent
                continue
            owner_ns = dep_ns if owner_rt.namespaced else ""
            owner = None
            if not (owner_rt.namespaced and not dep_ns):
                owner = self.state.store.get(owner_rt.key, owner_ns, str(ref.get("name")))
            if owner is None or owner["metadata"].get("uid") != ref.get("uid"):
                dangling.append(ref)
            elif owner["metadata"].get("deletionTimestamp") and FOREGROUND in (
                owner["metadata"].get("finalizers") or []
            ):
                waiting.append(ref)
            else:
                solid.append(ref)
        return solid, dangling, waiting

    def _attempt_to_delete(self, key: Key, obj: Obj) -> None:
        meta = obj["metadata"]
        if not meta.get("ownerReferences"):
            return
        if meta.get("deletionTimestamp") and FOREGROUND not in (meta.get("finalizers") or []):
            return
        solid, dangling, waiting = self._classify(key, obj)
        rt = _rt(key[0])
        if solid:
            drop = {r.get("uid") for r in dangling + waiting}
            if drop:
                self._remove_refs(rt, obj, drop)
            return
        if meta.get("deletionTimestamp"):
            return
        finalizers = meta.get("finalizers") or []
        if waiting and self._dependents.get(str(meta.get("uid"))):
            policy = "Foreground"
        elif ORPHAN in finalizers:
            policy = "Orphan"
        elif FOREGROUND in finalizers:
            policy = "Foreground"
        else:
            policy = "Background"
        self.deleter.delete_object(rt, obj, DeleteOptions(propagation=policy, precondition_uid=meta.get("uid")))

    def _remove_refs(self, rt: ResourceType, obj: Obj, uids: set[object]) -> None:
        new = clone(obj)
        refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") not in uids]
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        self.state.store.put(rt.key, new, created=False)

    def _remove_finalizer(self, rt: ResourceType, obj: Obj, finalizer: str) -> None:
        new = clone(obj)
        finalizers = [f for f in new["metadata"].get("finalizers") or [] if f != finalizer]
        if finalizers:
            new["metadata"]["finalizers"] = finalizers
        else:
            new["metadata"].pop("finalizers", None)
        if finished_deleting(new):
            self.state.store.remove(rt.key, new["metadata"].get("namespace") or "", new["metadata"]["name"])
        else:
            self.state.store.put(rt.key, new, created=False)

    def _process_owner(self, key: Key, owner: Obj) -> None:
        meta = owner["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        rt = _rt(key[0])
        uid = str(meta.get("uid"))
        dependents = [(k, self.state.store.get(*k)) for k in sorted(self._dependents.get(uid, ()))]
        present = [(k, d) for k, d in dependents if d is not None]
        finalizers = meta.get("finalizers") or []
        if ORPHAN in finalizers:
            for dep_key, dep in present:
                self._remove_refs(_rt(dep_key[0]), dep, {uid})
            owner = self.state.store.get(*key) or owner
            self._remove_finalizer(rt, owner, ORPHAN)
            return
        if FOREGROUND in finalizers:
            blocking = False
            for dep_key, dep in present:
                refs = [r for r in dep["metadata"].get("ownerReferences") or [] if r.get("uid") == uid]
                if any(r.get("blockOwnerDeletion") for r in refs):
                    blocking = True
                if not dep["metadata"].get("deletionTimestamp"):
                    self._attempt_to_delete(dep_key, dep)
            if not blocking:
                self._remove_finalizer(rt, self.state.store.get(*key) or owner, FOREGROUND)

    # -- quota status ---------------------------------------------------------------------

    def _flush_quota(self) -> None:
        namespaces, self._dirty_quota_ns = self._dirty_quota_ns, set()
        quota_rt = by_path("", "v1", "resourcequotas")
        assert quota_rt is not None
        for ns in sorted(namespaces):
            for quota in self.state.store.items(quota_rt.key, ns):
                status = admission.quota_status(self.state.store, quota)
                if status != quota.get("status"):
                    new = dict(quota)
                    new["metadata"] = dict(quota["metadata"])
                    new["status"] = status
                    self.state.store.put(quota_rt.key, new, created=False)
