"""The Kubernetes objects of one attempt of a gang job: reservation ConfigMap, headless Service, DRA claim
templates and one Indexed Job per pod set.

Pure: plain dicts in, plain dicts out; no I/O, no clock (the caller passes `now`). The renderer sits
behind the `WorkloadRenderer` seam (FLEET-NOTES A-24); `IndexedJobRenderer` renders one reservation
ConfigMap, one headless Service, one ResourceClaimTemplate per DRA request and one Indexed Job per pod
set (A-2, A-4, A-22), in that creation order (A-9). Each Job's pod template is `podtemplate`'s; what
the agent does to the pods once they exist (dry run, pin, ungate) is `pods`'.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.agent.config import AgentConfig
from extender.agent.model import Order
from extender.agent.podtemplate import pod_template, rendezvous_host
from extender.podreq import POD_SET_LABEL
from extender.reservations import reservation_configmap
from placement.overlay import Reservation, ReservedPart

__all__ = [
    "DISPATCH_ANNOTATION",
    "ASSIGNMENT_ANNOTATION",
    "DEADLINE_ANNOTATION",
    "POD_SET_INDEX_ANNOTATION",
    "FRAMEWORK_ANNOTATION",
    "MANAGED_BY",
    "WorkloadRenderer",
    "Rendered",
    "IndexedJobRenderer",
]

JSON = dict[str, Any]

DISPATCH_ANNOTATION = "tandem.dev/dispatch"
JOB_SET_ANNOTATION = "tandem.dev/job-set"
QUEUE_ANNOTATION = "tandem.dev/queue"
TENANT_ANNOTATION = "tandem.dev/tenant"
PREEMPTIBLE_LABEL = "tandem.dev/preemptible"
ASSIGNMENT_ANNOTATION = "tandem.dev/assignment"
"""On each Job: JSON list, the node of every replica index (the pins survive an agent restart)."""
DEADLINE_ANNOTATION = "tandem.dev/start-deadline"
"""On each Job: the broker's start deadline (RFC 3339), for the agent's own clean-up without a stream."""
POD_SET_INDEX_ANNOTATION = "tandem.dev/pod-set-index"
"""On each Job: its pod set's position in the order (rank offsets, start order)."""
FRAMEWORK_ANNOTATION = "tandem.dev/framework"
"""On each Job: `<framework>:<rendezvous port>` (start order and rendezvous address after a restart)."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "tandem"}
MAX_INDEXED_COMPLETIONS = 100_000
"""The Job API's cap on completions of an Indexed Job."""
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class WorkloadRenderer(Protocol):
    """A-24: what to create for an attempt, when it has succeeded, and in which order its pod sets start."""

    def render(self, order: Order, namespace: str, *, now: float) -> Rendered: ...

    def success_pod_sets(self, order: Order) -> tuple[str, ...]: ...

    def start_groups(self, order: Order) -> tuple[tuple[str, ...], ...]: ...


@dataclass(frozen=True, slots=True)
class Rendered:
    """The objects of one attempt; `objects()` is the creation order (A-9: reservation, Service, Jobs)."""

    namespace: str
    reservation: JSON
    service: JSON
    claim_templates: tuple[JSON, ...]
    jobs: tuple[JSON, ...]
    rendezvous: str
    """`<replica 0 host>:<port>`, as WorkloadStatus reports it."""

    def objects(self) -> tuple[JSON, ...]:
        return (self.reservation, self.service, *self.claim_templates, *self.jobs)


def _check(order: Order) -> None:
    """Names the API server would refuse, found before anything is created (A-2)."""
    if not order.pod_sets:
        raise ValueError(f"{order.name}: the order has no pod sets")
    if len(order.name) > 63 or not _DNS1035.fullmatch(order.name):
        raise ValueError(f"{order.name!r} is not a DNS-1035 label (Service name)")
    if not 0 < order.rendezvous_port < 65536:
        raise ValueError(f"rendezvous port {order.rendezvous_port} is out of range")
    seen: set[str] = set()
    for ps in order.pod_sets:
        if not _DNS1035.fullmatch(ps.name) or ps.name in seen:
            raise ValueError(f"pod set name {ps.name!r} is not a unique DNS-1035 label")
        seen.add(ps.name)
        if not 0 < ps.count <= MAX_INDEXED_COMPLETIONS:
            raise ValueError(f"pod set {ps.name}: {ps.count} replicas (1..{MAX_INDEXED_COMPLETIONS})")
        if sum(nc.replicas for nc in ps.nodes) != ps.count:
            raise ValueError(
                f"pod set {ps.name}: its nodes hold {sum(nc.replicas for nc in ps.nodes)} replicas, not {ps.count}"
            )
        host = f"{order.job_name(ps.name)}-{ps.count - 1}"
        if len(host) > 63:
            raise ValueError(f"pod hostname {host!r} has {len(host)} characters (limit 63)")
        for req in ps.device_requests:
            if not _DNS1123_LABEL.fullmatch(req.name) or len(req.name) > 63:
                raise ValueError(f"pod set {ps.name}: device request name {req.name!r} is not a DNS label")


class IndexedJobRenderer:
    """N Indexed Jobs + one headless Service (A-4, A-24); the only renderer for now."""

    def __init__(self, config: AgentConfig) -> None:
        self._config = config

    def success_pod_sets(self, order: Order) -> tuple[str, ...]:
        """A-4: MPI's launcher / Ray's head (the first pod set) decides; otherwise every pod set must complete."""
        if order.framework in ("MPI", "RAY"):
            return (order.pod_sets[0].name,)
        return tuple(ps.name for ps in order.pod_sets)

    def start_groups(self, order: Order) -> tuple[tuple[str, ...], ...]:
        """MPI: workers first, the launcher once they run (A-15); others: all at once."""
        names = tuple(ps.name for ps in order.pod_sets)
        if order.framework == "MPI" and len(names) > 1:
            return (names[1:], names[:1])
        return (names,)

    def domain_text(self, order: Order) -> str:
        """ "key=value" of the narrowest level of the domain that has a value (for messages)."""
        keys = self._config.extender.topology.keys
        for key, value in reversed(list(zip(keys, order.domain))):
            if value:
                return f"{key}={value}"
        return ""

    def render(self, order: Order, namespace: str, *, now: float) -> Rendered:
        _check(order)
        ext = self._config.extender
        if len(order.domain) > len(ext.topology.keys):
            raise ValueError(f"domain has {len(order.domain)} levels, the cluster {len(ext.topology.keys)}")
        labels = {ext.gang_job_label: order.job_id, ext.gang_attempt_label: str(order.attempt), **MANAGED_BY}
        annotations = {DISPATCH_ANNOTATION: order.dispatch_id}
        for key, value in (
            (TENANT_ANNOTATION, order.tenant),
            (JOB_SET_ANNOTATION, order.job_set),
            (QUEUE_ANNOTATION, order.queue),
        ):
            if value:
                annotations[key] = value
        parts = tuple(
            ReservedPart(ps.name, node, n, ps.shape)
            for ps in order.pod_sets
            for node, n in ps.per_node().items()
            if n > 0
        )
        deadline = order.start_deadline or now + order.start_timeout_s
        reservation = reservation_configmap(
            Reservation(order.job_id, order.attempt, parts),
            {ps.name: ps.shape for ps in order.pod_sets},
            namespace=ext.reservation_namespace,
            name=order.name,
            label=ext.reservation_label,
            domain=self.domain_text(order),
            expires_at=deadline + self._config.reservation_grace_s,
            dispatch_id=order.dispatch_id,
            labels=labels,
            annotations=annotations,
        )
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(order.name, namespace, labels, annotations),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {ext.gang_job_label: order.job_id, ext.gang_attempt_label: str(order.attempt)},
                "ports": [
                    {
                        "name": "rendezvous",
                        "protocol": "TCP",
                        "port": order.rendezvous_port,
                        "targetPort": order.rendezvous_port,
                    }
                ],
            },
        }
        claims: list[JSON] = []
        jobs: list[JSON] = []
        for i, ps in enumerate(order.pod_sets):
            set_labels = {**labels, POD_SET_LABEL: ps.name}
            for req in ps.device_requests:
                claims.append(
                    _claim_template(
                        f"{order.job_name(ps.name)}-{req.name}",
                        namespace,
                        set_labels,
                        annotations,
                        req.name,
                        req.device_class,
                        req.selectors,
                        None if req.all_devices else req.count,
                    )
                )
            jobs.append(self._job(order, i, namespace, set_labels, annotations))
        return Rendered(
            namespace,
            reservation,
            service,
            tuple(claims),
            tuple(jobs),
            f"{rendezvous_host(order)}:{order.rendezvous_port}",
        )

    def _job(
        self, order: Order, i: int, namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> JSON:
        """A-4, exactly: Indexed, no retries, replacement only of Failed pods, unsuspended, no selector."""
        ps = order.pod_sets[i]
        spec: JSON = {
            "completionMode": "Indexed",
            "completions": ps.count,
            "parallelism": ps.count,
            "backoffLimit": 0,
            "podReplacementPolicy": "Failed",
            "suspend": False,
            "ttlSecondsAfterFinished": self._config.ttl_seconds_after_finished,
        }
        if order.max_runtime_s is not None:
            spec["activeDeadlineSeconds"] = max(1, math.ceil(order.max_runtime_s + order.start_timeout_s))
        pod_labels = dict(labels)
        if order.preemptible:
            pod_labels[PREEMPTIBLE_LABEL] = "true"
        spec["template"] = pod_template(self._config, order, i, pod_labels, annotations)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta(order.job_name(ps.name), namespace, labels, annotations),
            "spec": spec,
        }


def _meta(name: str, namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> JSON:
    return {"name": name, "namespace": namespace, "labels": dict(labels), "annotations": dict(annotations)}


def _claim_template(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    request: str,
    device_class: str,
    selectors: Sequence[str],
    count: int | None,
) -> JSON:
    """A-22: one resource.k8s.io/v1 ResourceClaimTemplate of one request (`count` None = allocationMode All)."""
    exactly: JSON = {"deviceClassName": device_class}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if count is None:
        exactly["allocationMode"] = "All"
    else:
        exactly.update(allocationMode="ExactCount", count=count)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(name, namespace, labels, annotations),
        "spec": {
            "metadata": {"labels": dict(labels)},
            "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
        },
    }
