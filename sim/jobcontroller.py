"""The ``batch/v1`` Job controller stand-in: an ordinary API client (list+watch Jobs and Pods, write pods and status).

The decisions are ``sim.jobsync.plan_job``; this shell keeps client-go's bookkeeping around it:
expectations (no second round of creates before the first is seen, no sync while deletions are
unobserved), finalizer removals not yet seen, the last status it wrote (so a stale cache never
undoes a count), per-Job pod-failure back-off, slow-start batched creation, and the
controller-manager's client limits (``--kube-api-qps`` 20, ``--kube-api-burst`` 30) on writes.
Runs with whatever identity its client carries; ``sim.cluster`` gives it the
``kube-system/job-controller`` ServiceAccount and upstream's RBAC for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from sim import jobpods as jp
from sim import kuberesources as kr
from sim.events import EventRecorder
from sim.informer import Informer, WorkQueue, object_key
from sim.jobsync import condition, plan_job
from sim.kubeclient import KubeApiError, KubeClient, TokenBucket

__all__ = ["JobController"]

log = logging.getLogger("tandem.sim.jobcontroller")

JSON = dict[str, Any]
_IO_ERRORS = (KubeApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
_REMOVE_FINALIZER = {"metadata": {"$deleteFromPrimitiveList/finalizers": [jp.TRACKING_FINALIZER]}}


def _normalised(status: JSON) -> JSON:
    """A status without empty values, so a server that drops ``{}`` or ``0`` never looks changed."""
    return {k: v for k, v in status.items() if v not in (None, {}, [], 0, "")}


def owner_job_key(pod: JSON) -> tuple[str, str] | None:
    """(``ns/name``, uid) of the Job that controls the pod, from its controller ownerReference."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return f"{meta.get('namespace')}/{ref.get('name')}", str(ref.get("uid"))
    return None


@dataclasses.dataclass
class _Expectations:
    """Creations not yet seen in the pod cache, and UIDs whose deletion is not yet seen."""

    creates: int = 0
    deletes: set[str] = dataclasses.field(default_factory=set)
    since: float = 0.0

    def satisfied(self, now: float, timeout_s: float) -> bool:
        return (self.creates <= 0 and not self.deletes) or now - self.since > timeout_s


@dataclasses.dataclass
class _Backoff:
    failures: int = 0
    last_failure: float = 0.0
    seen_failed: int = 0
    seen_succeeded: int = 0


class JobController:
    """Runs until cancelled: ``await JobController(client).run()``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        qps: float = 20.0,
        burst: int = 30,
        workers: int = 5,
        pod_failure_backoff_s: float = 10.0,
        pod_failure_backoff_cap_s: float = 360.0,
        expectations_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.jobs = Informer(client, kr.JOBS)
        self.pods = Informer(client, kr.PODS)
        self.queue = WorkQueue()
        self.events = EventRecorder(client, "job-controller", clock=clock)
        self._limiter = TokenBucket(qps, burst)
        self._workers = workers
        self._backoff_base = pod_failure_backoff_s
        self._backoff_cap = pod_failure_backoff_cap_s
        self._expect_timeout = expectations_timeout_s
        self._clock = clock
        self._expect: dict[str, _Expectations] = {}
        self._rm_finalizers: set[str] = set()
        self._written: dict[str, tuple[str, JSON]] = {}
        self._backoff: dict[str, _Backoff] = {}
        self._pods_by_job: dict[str, set[str]] = {}
        self.jobs.add_handler(self._on_job)
        self.pods.add_handler(self._on_pod)

    # ---- event handlers ------------------------------------------------------------------------

    def _on_job(self, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        if new is None:
            uid = str(obj["metadata"].get("uid"))
            for records in (self._expect, self._written, self._backoff):
                records.pop(uid, None)
        self.queue.add(object_key(obj))

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        owner = owner_job_key(obj)
        pod_key, uid = object_key(obj), str(obj["metadata"].get("uid"))
        if owner is None:
            return
        job_key, job_uid = owner
        if new is None:
            self._pods_by_job.get(job_key, set()).discard(pod_key)
        else:
            self._pods_by_job.setdefault(job_key, set()).add(pod_key)
        exp = self._expect.get(job_uid)
        if exp is not None:
            if old is None and new is not None:
                exp.creates -= 1
            if new is None or (new.get("metadata") or {}).get("deletionTimestamp"):
                exp.deletes.discard(uid)
        if new is None or not jp.has_finalizer(new):
            self._rm_finalizers.discard(uid)
        self.queue.add(job_key)

    # ---- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.jobs.run())
            tg.create_task(self.pods.run())
            await self.jobs.synced.wait()
            await self.pods.synced.wait()
            for _ in range(self._workers):
                tg.create_task(self._worker())

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.sync(key)
            except _IO_ERRORS as e:
                log.warning("job sync failed", extra={"job": key, "error": str(e)})
                self.queue.add_after(key, 0.5)
            except Exception:
                log.exception("job sync crashed", extra={"job": key})
                self.queue.add_after(key, 1.0)
            finally:
                self.queue.done(key)

    def _job_view(self, key: str) -> JSON | None:
        """The cached Job, or what we last wrote if the cache still shows the version before that write."""
        job = self.jobs.get(key)
        if job is None:
            return None
        uid = str(job["metadata"]["uid"])
        written = self._written.get(uid)
        if written is not None:
            if written[0] == job["metadata"].get("resourceVersion"):
                return written[1]
            del self._written[uid]
        return job

    async def sync(self, key: str) -> None:
        """Reconcile one Job (``ns/name``)."""
        now = self._clock()
        job = self._job_view(key)
        pods = [p for k in sorted(self._pods_by_job.get(key, ())) if (p := self.pods.get(k)) is not None]
        uid = str(job["metadata"]["uid"]) if job is not None else None
        orphans = [p for p in pods if (owner_job_key(p) or ("", ""))[1] != uid and jp.has_finalizer(p)]
        if orphans:
            await self._remove_finalizers(orphans)
        if job is None or uid is None:
            return
        exp = self._expect.get(uid)
        if exp is not None and not exp.satisfied(now, self._expect_timeout):
            self.queue.add_after(key, self._expect_timeout)
            return
        owned = [p for p in pods if (owner_job_key(p) or ("", ""))[1] == uid]
        plan = plan_job(
            job, owned, now, finalizers_removed=self._rm_finalizers, backoff_remaining_s=self._backoff_remaining(uid)
        )
        await self._delete_pods(job, plan.delete)
        created = await self._create_pods(job, plan.create)
        status = plan.status
        if created < len(plan.create):
            status["active"] = max(0, int(status.get("active") or 0) - (len(plan.create) - created))
            self.queue.add_after(key, 1.0)
        if _normalised(status) != _normalised(job.get("status") or {}):
            if not await self._write_status(job, status):
                self.queue.add_after(key, 0.05)
                return
            await self._record_finish(job, status)
        if plan.remove_finalizers:
            await self._remove_finalizers(plan.remove_finalizers)
            self.queue.add(key)
        self._note_counts(uid, status, now)
        if plan.requeue_after_s is not None:
            self.queue.add_after(key, plan.requeue_after_s)

    # ---- writes --------------------------------------------------------------------------------

    async def _create_pods(self, job: JSON, indexes: Sequence[int | None]) -> int:
        """Slow start (batches of 1, 2, 4, ...); a failed batch skips the rest. Returns how many were created."""
        if not indexes:
            return 0
        uid = str(job["metadata"]["uid"])
        exp = self._expect.setdefault(uid, _Expectations())
        exp.creates += len(indexes)
        exp.since = self._clock()
        done, batch, pos = 0, 1, 0
        while pos < len(indexes):
            chunk = indexes[pos : pos + batch]
            results = await asyncio.gather(*(self._create_one(job, ix) for ix in chunk))
            ok = sum(results)
            done += ok
            pos += len(chunk)
            if ok < len(chunk):
                break
            batch *= 2
        exp.creates -= len(indexes) - done  # never-made pods will never be observed
        return done

    async def _create_one(self, job: JSON, index: int | None) -> bool:
        await self._limiter.acquire()
        pod = jp.render_pod(job, index)
        try:
            made = await self.client.create(kr.PODS, pod, job["metadata"]["namespace"])
        except KubeApiError as e:
            log.warning("pod create failed", extra={"job": object_key(job), "error": e.message})
            await self.events.record(job, "Warning", "FailedCreate", f"Error creating: {e.message}")
            return False
        await self.events.record(job, "Normal", "SuccessfulCreate", f"Created pod: {made['metadata']['name']}")
        return True

    async def _delete_pods(self, job: JSON, pods: Sequence[JSON]) -> None:
        if not pods:
            return
        exp = self._expect.setdefault(str(job["metadata"]["uid"]), _Expectations())
        exp.since = self._clock()
        for p in pods:
            exp.deletes.add(str(p["metadata"]["uid"]))

        async def one(p: JSON) -> None:
            await self._limiter.acquire()
            uid = str(p["metadata"]["uid"])
            try:
                await self.client.delete(
                    kr.PODS, p["metadata"]["name"], p["metadata"]["namespace"], preconditions={"uid": uid}
                )
            except KubeApiError as e:
                if e.not_found or e.conflict:
                    exp.deletes.discard(uid)
                    return
                exp.deletes.discard(uid)
                raise
            await self.events.record(job, "Normal", "SuccessfulDelete", f"Deleted pod: {p['metadata']['name']}")

        await asyncio.gather(*(one(p) for p in pods))

    async def _write_status(self, job: JSON, status: JSON) -> bool:
        """PUT ``jobs/<name>/status`` at the cached resourceVersion; False on a conflict (stale cache)."""
        await self._limiter.acquire()
        body = dict(job)
        body["status"] = status
        try:
            written = await self.client.replace(kr.JOBS, body, subresource="status")
        except KubeApiError as e:
            if e.conflict or e.not_found:
                return False
            raise
        self._written[str(job["metadata"]["uid"])] = (str(job["metadata"].get("resourceVersion")), written)
        return True

    async def _remove_finalizers(self, pods: Sequence[JSON]) -> None:
        """Strategic merge ``$deleteFromPrimitiveList/finalizers`` (the controller may patch, not get, pods)."""

        async def one(p: JSON) -> None:
            uid = str(p["metadata"]["uid"])
            if uid in self._rm_finalizers:
                return
            await self._limiter.acquire()
            try:
                await self.client.patch(
                    kr.PODS,
                    p["metadata"]["name"],
                    _REMOVE_FINALIZER,
                    patch_type="strategic",
                    namespace=p["metadata"]["namespace"],
                )
            except KubeApiError as e:
                if not e.not_found:
                    raise
            cached = self.pods.get(object_key(p))
            if cached is not None and cached["metadata"].get("uid") == uid and jp.has_finalizer(cached):
                self._rm_finalizers.add(uid)  # until the cache shows the pod without it (see _on_pod)

        await asyncio.gather(*(one(p) for p in pods))

    async def _record_finish(self, job: JSON, status: JSON) -> None:
        before = job.get("status") or {}
        for ctype in ("Complete", "Failed"):
            c = condition(status, ctype)
            if c is not None and condition(before, ctype) is None:
                if ctype == "Complete":
                    await self.events.record(job, "Normal", "Completed", "Job completed")
                else:
                    await self.events.record(job, "Warning", str(c.get("reason")), str(c.get("message")))

    # ---- pod failure back-off ------------------------------------------------------------------

    def _note_counts(self, uid: str, status: JSON, now: float) -> None:
        rec = self._backoff.setdefault(uid, _Backoff())
        unc = status.get("uncountedTerminatedPods") or {}
        failed = int(status.get("failed") or 0) + len(unc.get("failed") or [])
        succeeded = int(status.get("succeeded") or 0) + len(unc.get("succeeded") or [])
        if succeeded > rec.seen_succeeded:
            rec.failures = 0
        if failed > rec.seen_failed:
            rec.failures += failed - rec.seen_failed
            rec.last_failure = now
        rec.seen_failed, rec.seen_succeeded = failed, succeeded

    def _backoff_remaining(self, uid: str) -> float:
        rec = self._backoff.get(uid)
        if rec is None or rec.failures == 0:
            return 0.0
        delay = min(self._backoff_cap, self._backoff_base * 2.0 ** (rec.failures - 1))
        return max(0.0, rec.last_failure + delay - self._clock())
