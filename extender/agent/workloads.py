"""The agent's writes to its cluster: create an attempt's objects atomically, pin, ungate, tear down.

Creation (FLEET-NOTES A-8, A-9): the admitted pod is checked first with a server-side dry run (admission
may change requests: LimitRange, sidecar injectors; Pod Security or quota may refuse it); the namespace
quota must cover the whole gang (quota is charged per pod at creation, gated or not, so half a gang must
never be created); then reservation, Service, claim templates and Jobs are created in that order, each
carrying `tandem.dev/dispatch`. An existing object with our dispatch id is adopted (a retried or duplicate
dispatch, an agent restart mid-create); one with another id is a stranger's (STALE_ATTEMPT), never
adopted. Any failure deletes what this call created and rejects the dispatch with the reason.

Teardown (A-6): pods are deleted first when the cancel's grace is shorter than theirs; Jobs are deleted
with propagationPolicy Background (the REST default for Jobs orphans their pods); the Service, claim
templates and reservation go only once every pod is gone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from extender.agent import render
from extender.agent.config import AgentConfig
from extender.agent.model import AttemptKey, Order, PodSetOrder
from extender.agent.pods import admitted_shape_problem, pin_patch, pod_for_dry_run, ungate_patch
from extender.agent.render import (
    ASSIGNMENT_ANNOTATION,
    DEADLINE_ANNOTATION,
    DISPATCH_ANNOTATION,
    FRAMEWORK_ANNOTATION,
    MANAGED_BY,
    POD_SET_INDEX_ANNOTATION,
)
from extender.agent.wire import Rejection
from extender.kube import KubeClient, KubeError, NotLeader, api_path
from extender.reservations import reservation_configmap
from placement.overlay import Reservation, ReservedPart
from placement.podspec import GPU_RESOURCE
from placement.quantity import QuantityError, cpu_milli, to_int_bytes

__all__ = ["Workloads"]

log = logging.getLogger("tandem.agent.workloads")

HOLD_ANNOTATION = "tandem.dev/hold-for"
"""On a hold's reservation: the dispatch id the attempt it keeps nodes for will carry."""


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Refused(Exception):
    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


def _rejection_for(e: KubeError, what: str) -> Rejection:
    """The API server's refusal as a dispatch rejection, quoting its message."""
    msg = f"{what}: {e}"
    text = str(e)
    if e.status == 403 and "exceeded quota" in text:
        return Rejection("NAMESPACE_QUOTA", msg)
    if e.status == 403 and ("PriorityClass" in text or "PodSecurity" in text or "violates" in text):
        return Rejection("TEMPLATE_INVALID", msg)
    if e.status == 403:
        return Rejection("TENANT_NOT_ALLOWED", msg)
    if e.status == 404 and "namespaces" in text:
        return Rejection("TENANT_NOT_ALLOWED", msg)
    if e.status in (400, 422):
        return Rejection("TEMPLATE_INVALID", msg)
    return Rejection("API_ERROR", msg)


@dataclass(frozen=True, slots=True)
class _Created:
    path: str
    kind: str


def _quota_needs(order: Order) -> dict[str, int]:
    """What the whole gang charges to a namespace ResourceQuota (milli-CPU, bytes, counts)."""
    need: dict[str, int] = {"pods": order.total_replicas, "count/pods": order.total_replicas}
    for ps in order.pod_sets:
        s = ps.shape
        for key, per in (
            ("requests.cpu", s.cpu_milli),
            ("cpu", s.cpu_milli),
            ("requests.memory", s.memory),
            ("memory", s.memory),
        ):
            need[key] = need.get(key, 0) + per * ps.count
        gpus = {GPU_RESOURCE: s.gpus} if s.gpus and s.gpu_milli >= 1000 else {}
        if s.mig_profile and s.mig_count:
            gpus[f"nvidia.com/mig-{s.mig_profile}"] = s.mig_count
        for name, per in [*gpus.items(), *s.extended]:
            need[f"requests.{name}"] = need.get(f"requests.{name}", 0) + per * ps.count
    return need


def _amount(key: str, value: Any) -> int:
    return cpu_milli(value) if key.endswith("cpu") else to_int_bytes(value)


class Workloads:
    """Executes the agent's decisions against the API server (the one place the agent writes workloads)."""

    def __init__(
        self,
        kube: KubeClient,
        config: AgentConfig,
        *,
        identity: str = "tandem-agent",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.config = config
        self.renderer = render.IndexedJobRenderer(config)
        self.identity = identity
        self.clock = clock
        self._gate_slots = asyncio.Semaphore(config.ungate_concurrency)

    # ------------------------------------------------------------------ create

    async def create(self, order: Order, namespace: str, *, resuming: bool = False) -> Rejection | None:
        """Create (or adopt) every object of the attempt; None when it all exists now. `resuming`: some of
        it exists already (its pods are charged to the quota: the gang's room is not checked again)."""
        rendered = self.renderer.render(order, namespace, now=self.clock())
        for job, ps in zip(rendered.jobs, order.pod_sets):
            ann = job["metadata"].setdefault("annotations", {})
            ann[ASSIGNMENT_ANNOTATION] = orjson.dumps([ps.node_of(i) for i in range(ps.count)]).decode()
            ann[DEADLINE_ANNOTATION] = _rfc3339(order.start_deadline)
            ann[FRAMEWORK_ANNOTATION] = f"{order.framework}:{order.rendezvous_port}"
            ann[POD_SET_INDEX_ANNOTATION] = str(order.pod_sets.index(ps))
        try:
            await self._admission_check(order, namespace, rendered.jobs)
            if not resuming:
                await self._quota_check(order, namespace)
        except _Refused as r:
            return r.rejection
        created: list[_Created] = []
        ext = self.config.extender
        plan: list[tuple[str, dict[str, Any]]] = [
            (api_path("", "v1", "configmaps", ext.reservation_namespace), rendered.reservation),
            (api_path("", "v1", "services", namespace), rendered.service),
            *(
                (api_path("resource.k8s.io", "v1", "resourceclaimtemplates", namespace), t)
                for t in rendered.claim_templates
            ),
            *((api_path("batch", "v1", "jobs", namespace), j) for j in rendered.jobs),
        ]
        try:
            jobs: list[dict[str, Any]] = []
            for collection, obj in plan:
                stored, fresh = await self._create_or_adopt(collection, obj, order.dispatch_id)
                if fresh:
                    created.append(_Created(f"{collection}/{obj['metadata']['name']}", obj["kind"]))
                if obj["kind"] == "Job":
                    jobs.append(stored)
            for job in jobs:
                if (job.get("spec") or {}).get("suspend"):
                    raise _Refused(
                        Rejection(
                            "TEMPLATE_INVALID",
                            f"Job {job['metadata']['name']} was suspended at admission: Kueue (or "
                            "another queue controller) manages namespace " + namespace + "; exclude Tandem's tenant "
                            "namespaces from it",
                        )
                    )
            await self._own_service(namespace, rendered.service, jobs[0] if jobs else None)
        except _Refused as r:
            await self._undo(created)
            return r.rejection
        except KubeError as e:
            await self._undo(created)
            if isinstance(e, NotLeader):
                return Rejection("AGENT_NOT_READY", "this agent lost its leadership while creating the workload")
            return _rejection_for(e, "creating the workload")
        if created:
            await self.event(
                jobs[0] if jobs else None,
                "TandemDispatchAccepted",
                f"attempt {order.attempt} of {order.job_id} created on {len(order.pod_sets)} pod set(s)",
            )
        return None

    async def _create_or_adopt(
        self, collection: str, obj: dict[str, Any], dispatch_id: str
    ) -> tuple[dict[str, Any], bool]:
        try:
            return await self.kube.create(collection, obj), True
        except KubeError as e:
            if e.status != 409:
                raise
        existing = await self.kube.get(f"{collection}/{obj['metadata']['name']}")
        if existing is None:  # deleted between our create and get: try once more
            return await self.kube.create(collection, obj), True
        theirs = ((existing.get("metadata") or {}).get("annotations") or {}).get(DISPATCH_ANNOTATION, "")
        if theirs != dispatch_id:
            raise _Refused(
                Rejection(
                    "STALE_ATTEMPT",
                    f"{obj['kind']} {obj['metadata']['name']} already exists for dispatch "
                    f"{theirs or '(none)'}, not {dispatch_id}: not adopted",
                )
            )
        return existing, False

    async def _undo(self, created: Sequence[_Created]) -> None:
        for c in reversed(created):
            try:
                await self.kube.delete(c.path, propagation_policy="Background")
            except KubeError:
                log.warning("undo of a partial create failed", extra={"detail": c.path}, exc_info=True)

    async def _own_service(self, namespace: str, service: Mapping[str, Any], job: Mapping[str, Any] | None) -> None:
        """Make the first Job own the Service, so the garbage collector removes it with the Jobs even if
        the agent never gets to (a JSON Patch: never a merge patch on a list)."""
        if job is None:
            return
        path = api_path("", "v1", "services", namespace, service["metadata"]["name"])
        current = await self.kube.get(path)
        if current is None or (current.get("metadata") or {}).get("ownerReferences"):
            return
        ref = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }
        await self.kube.patch(
            path,
            [{"op": "add", "path": "/metadata/ownerReferences", "value": [ref]}],
            content_type="application/json-patch+json",
        )

    async def _admission_check(self, order: Order, namespace: str, jobs: Sequence[dict[str, Any]]) -> None:
        """One pod per pod set created with dryRun=All: what admission makes of it must still be the shape
        the broker planned (A-8)."""
        for job, ps in zip(jobs, order.pod_sets):
            pod = pod_for_dry_run(job, 0)
            try:
                admitted = await self.kube.create(api_path("", "v1", "pods", namespace), pod, dry_run=True)
            except KubeError as e:
                if isinstance(e, NotLeader):
                    raise _Refused(Rejection("AGENT_NOT_READY", "not the leader")) from e
                raise _Refused(_rejection_for(e, f"pod set {ps.name}: admission (dry run)")) from e
            problem = admitted_shape_problem(admitted, ps.shape)
            if problem:
                raise _Refused(Rejection("TEMPLATE_INVALID", f"pod set {ps.name}: {problem}"))

    async def _quota_check(self, order: Order, namespace: str) -> None:
        """Every ResourceQuota of the namespace must have room for the whole gang (hard - used >= need)."""
        try:
            quotas = await self.kube.list(api_path("", "v1", "resourcequotas", namespace))
        except KubeError as e:
            raise _Refused(_rejection_for(e, "reading the namespace's quotas")) from e
        need = _quota_needs(order)
        for q in quotas:
            status = q.get("status") or {}
            hard = status.get("hard") or (q.get("spec") or {}).get("hard") or {}
            used = status.get("used") or {}
            for key, limit in hard.items():
                if key not in need:
                    continue
                try:
                    room = _amount(key, limit) - _amount(key, used.get(key, 0))
                except QuantityError:
                    continue
                if need[key] > room:
                    raise _Refused(
                        Rejection(
                            "NAMESPACE_QUOTA",
                            f"ResourceQuota {q['metadata']['name']} in {namespace}: {key} has room "
                            f"for {room}, the gang needs {need[key]} (a half-created gang would hold it)",
                        )
                    )

    # ------------------------------------------------------------------ pin and ungate

    async def _pod_patch(self, pod: Mapping[str, Any], patch: list[dict[str, Any]]) -> str | None:
        meta = pod.get("metadata") or {}
        path = api_path("", "v1", "pods", str(meta.get("namespace")), str(meta.get("name")))
        async with self._gate_slots:
            try:
                await self.kube.patch(path, patch, content_type="application/json-patch+json")
            except KubeError as e:
                return f"pod {meta.get('name')}: {e}"
        return None

    async def pin(self, pods: Iterable[tuple[Mapping[str, Any], str]]) -> list[str]:
        """Pin each gated pod to its node (one JSON Patch per pod); the errors, per pod."""
        results = await asyncio.gather(*(self._pod_patch(p, pin_patch(dict(p), node)) for p, node in pods))
        return [r for r in results if r]

    async def ungate(self, pods: Iterable[Mapping[str, Any]]) -> list[str]:
        """Lift Tandem's gate from each pod (other controllers' gates stay); the errors, per pod."""
        patches = [(p, ungate_patch(dict(p))) for p in pods]
        results = await asyncio.gather(*(self._pod_patch(p, patch) for p, patch in patches if patch))
        return [r for r in results if r]

    # ------------------------------------------------------------------ teardown

    async def teardown(
        self,
        key: AttemptKey,
        namespace: str,
        jobs: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        grace_s: float | None,
    ) -> None:
        """Start deleting an attempt: short-grace pods first when asked, then the Jobs (Background)."""
        ext = self.config.extender
        selector = f"{ext.gang_job_label}={key[0]},{ext.gang_attempt_label}={key[1]}"
        pod_grace = max(
            (int((p.get("spec") or {}).get("terminationGracePeriodSeconds", 30) or 0) for p in pods), default=0
        )
        if grace_s is not None and grace_s < pod_grace:
            await self.kube.delete_collection(
                api_path("", "v1", "pods", namespace),
                label_selector=selector,
                propagation_policy="Background",
                grace_period_s=int(grace_s),
            )
        for job in jobs:
            name = job["metadata"]["name"]
            await self.kube.delete(api_path("batch", "v1", "jobs", namespace, name), propagation_policy="Background")

    async def finish(self, key: AttemptKey, namespace: str, claim_templates: Iterable[str] = ()) -> None:
        """Every pod is gone: delete the Service, claim templates and the reservation."""
        name = f"{key[0]}-{key[1]}"
        if namespace:
            await self.kube.delete(api_path("", "v1", "services", namespace, name), propagation_policy="Background")
            for t in claim_templates:
                await self.kube.delete(
                    api_path("resource.k8s.io", "v1", "resourceclaimtemplates", namespace, t),
                    propagation_policy="Background",
                )
        await self.delete_reservation(key)

    # ------------------------------------------------------------------ holds (FLEET-NOTES F-5)

    @staticmethod
    def hold_name(key: AttemptKey, drain: bool = False) -> str:
        return f"{key[0]}-{key[1]}-{'drain' if drain else 'hold'}"

    async def write_hold(
        self,
        key: AttemptKey,
        pod_sets: Sequence[PodSetOrder],
        expires_at: float,
        dispatch_id: str,
        *,
        drain: bool = False,
    ) -> None:
        """Write (or rewrite) the reservation that keeps nodes for an attempt not dispatched yet. It is the
        attempt's own gang's, so its pods are not kept off; it carries no dispatch id the attempt's objects
        could be adopted by."""
        ext = self.config.extender
        parts = tuple(
            ReservedPart(ps.name, node, n, ps.shape) for ps in pod_sets for node, n in ps.per_node().items() if n > 0
        )
        labels = {ext.gang_job_label: key[0], ext.gang_attempt_label: str(key[1]), **MANAGED_BY}
        cm = reservation_configmap(
            Reservation(key[0], key[1], parts),
            {ps.name: ps.shape for ps in pod_sets},
            namespace=ext.reservation_namespace,
            name=self.hold_name(key, drain),
            label=ext.reservation_label,
            expires_at=expires_at,
            labels=labels,
            annotations={HOLD_ANNOTATION: dispatch_id},
            hold=True,
        )
        collection = api_path("", "v1", "configmaps", ext.reservation_namespace)
        try:
            await self.kube.create(collection, cm)
        except KubeError as e:
            if e.status != 409:
                raise
            current = await self.kube.get(f"{collection}/{cm['metadata']['name']}")
            if current is None:
                await self.kube.create(collection, cm)
                return
            cm["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await self.kube.replace(f"{collection}/{cm['metadata']['name']}", cm)

    async def delete_hold(self, key: AttemptKey, *, drain: bool = False) -> None:
        await self._delete_reservation_configmap(self.hold_name(key, drain))

    async def delete_reservation(self, key: AttemptKey) -> None:
        await self._delete_reservation_configmap(f"{key[0]}-{key[1]}")

    async def _delete_reservation_configmap(self, name: str) -> None:
        await self.kube.delete(
            api_path("", "v1", "configmaps", self.config.extender.reservation_namespace, name),
            propagation_policy="Background",
        )

    # ------------------------------------------------------------------ events

    async def event(self, obj: Mapping[str, Any] | None, reason: str, message: str, kind: str = "Normal") -> None:
        """A Kubernetes Event on a Tandem Job or pod, for `kubectl describe` (best effort)."""
        if obj is None:
            return
        meta = obj.get("metadata") or {}
        now = dt.datetime.now(dt.UTC)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", ""),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "count": 1,
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": {"component": "tandem-agent"},
            "reportingComponent": "tandem-agent",
            "reportingInstance": self.identity[:128],
        }
        try:
            await self.kube.create(api_path("", "v1", "events", str(meta.get("namespace"))), event)
        except KubeError:
            log.info("event not recorded", extra={"detail": reason}, exc_info=True)
