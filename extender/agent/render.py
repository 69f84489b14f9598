"""The Kubernetes objects of one attempt of a gang job, and the JSON Patches that pin and start its pods.

Pure: plain dicts in, plain dicts out; no I/O, no clock (the caller passes `now`). The renderer sits
behind the `WorkloadRenderer` seam (FLEET-NOTES A-24); `IndexedJobRenderer` renders one reservation
ConfigMap, one headless Service, one ResourceClaimTemplate per DRA request and one Indexed Job per pod
set (A-2, A-4, A-22), in that creation order (A-9).

Environment (A-15, "a contract for the job across attempts"): Tandem's variables come first in every
container's `env`, so a template's own variables may use `$(TANDEM_RANK_OFFSET)` and the like; a
template variable of the same name is dropped (Tandem owns those names). Main containers and regular
init containers get everything; native sidecars (init containers with `restartPolicy: Always`) get only
the `TANDEM_*` variables: a sidecar is not a rank, and a sidecar that happens to use `env://` must not
join the world. `PET_NODE_RANK` is set only in the first pod set (rank offset 0): env vars cannot add,
so a later pod set's command computes its node rank as `$((JOB_COMPLETION_INDEX + TANDEM_RANK_OFFSET))`
(or uses torchrun's c10d rendezvous, which needs no rank). `WORLD_SIZE` counts processes, one per GPU of
every replica (what torchrun itself computes); `PET_NPROC_PER_NODE` is this pod set's GPUs per replica.
MPI gets the workers' DNS names (`TANDEM_MPI_HOSTS`, and `host:slots` in `TANDEM_MPI_HOSTS_SLOTS` for
`mpirun --host`); Ray gets `RAY_ADDRESS=<head>:<port>`.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.agent.config import AgentConfig
from extender.agent.model import Order, PodSetOrder
from extender.podreq import INDEX_LABEL, POD_SET_LABEL
from extender.reservations import reservation_configmap
from placement.errors import PodSpecError
from placement.model import PodShape
from placement.overlay import Reservation, ReservedPart
from placement.podspec import shape_from_pod

__all__ = [
    "GATE",
    "DISPATCH_ANNOTATION",
    "RESERVED_DOMAINS",
    "is_reserved_key",
    "WorkloadRenderer",
    "Rendered",
    "IndexedJobRenderer",
    "rendezvous_host",
    "replica_host",
    "json_pointer",
    "pin_patch",
    "ungate_patch",
    "pod_for_dry_run",
    "admitted_shape_problem",
]

JSON = dict[str, Any]

GATE = "tandem.dev/gang"
DISPATCH_ANNOTATION = "tandem.dev/dispatch"
JOB_SET_ANNOTATION = "tandem.dev/job-set"
QUEUE_ANNOTATION = "tandem.dev/queue"
TENANT_ANNOTATION = "tandem.dev/tenant"
PREEMPTIBLE_LABEL = "tandem.dev/preemptible"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tandem"}
RESERVED_DOMAINS = ("tandem.dev", "kubernetes.io", "k8s.io", "kueue.x-k8s.io", "jobset.sigs.k8s.io")
"""H-4: label and annotation key domains a template or user may not set (dropped whatever they say). A
subdomain is reserved too (`node.kubernetes.io/x`, `batch.kubernetes.io/x`); `app.kubernetes.io/*` is left
to users (the recommended labels) except `managed-by`, which Tandem sets. The broker refuses these keys at
submission; the agent drops them again because it must not trust the broker's version to be its own."""
_USER_DOMAIN = "app.kubernetes.io"
USER_SETTABLE_KEYS = frozenset(
    {"kubectl.kubernetes.io/default-container", "kubectl.kubernetes.io/default-logs-container"}
)
"""Keys under a reserved domain that users are meant to set (kubectl's hints of which container to use)."""
INDEX_ENV = "JOB_COMPLETION_INDEX"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
MAX_INDEXED_COMPLETIONS = 100_000
"""The Job API's cap on completions of an Indexed Job."""
_OWNED_SPEC = ("hostname", "activeDeadlineSeconds", "nodeName", "priority", "preemptionPolicy", "overhead")
"""H-4 fields removed from the template: the Job controller, priority and RuntimeClass admission set them."""
_TERMS = ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_INDEX_FIELD = {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}}


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


def replica_host(order: Order, pod_set: str, index: int) -> str:
    """DNS name of a replica relative to the namespace (the pods' search path supplies the rest, A-2)."""
    return f"{order.job_name(pod_set)}-{index}.{order.name}"


def rendezvous_host(order: Order) -> str:
    return replica_host(order, order.pod_sets[0].name, 0)


def is_reserved_key(key: str) -> bool:
    """Whether a label / annotation key falls under RESERVED_DOMAINS (domain or subdomain)."""
    prefix, slash, name = key.rpartition("/")
    if not slash or key in USER_SETTABLE_KEYS:
        return False
    domain = prefix.lower()
    if domain == _USER_DOMAIN:
        return name == "managed-by"
    return any(domain == reserved or domain.endswith("." + reserved) for reserved in RESERVED_DOMAINS)


def _user(values: Any) -> dict[str, str]:
    """Labels or annotations from an untrusted source, without the reserved keys."""
    if not isinstance(values, Mapping):
        return {}
    return {str(k): str(v) for k, v in values.items() if not is_reserved_key(str(k))}


def _procs(ps: PodSetOrder) -> int:
    """Processes torchrun starts per replica: one per GPU (whole, MIG instance or DRA device), at least 1."""
    shape = ps.shape
    devices = shape.gpus or shape.mig_count or sum(r.count for r in ps.device_requests if not r.all_devices)
    return max(1, devices)


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
        spec["template"] = self._pod_template(order, i, pod_labels, annotations)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta(order.job_name(ps.name), namespace, labels, annotations),
            "spec": spec,
        }

    def _pod_template(self, order: Order, i: int, labels: Mapping[str, str], annotations: Mapping[str, str]) -> JSON:
        """The submitted template with everything the agent owns overwritten (H-4)."""
        ps = order.pod_sets[i]
        tpl = ps.template
        tmeta = tpl.get("metadata") if isinstance(tpl, Mapping) else None
        given = tpl.get("spec") if isinstance(tpl, Mapping) else None
        if not isinstance(given, Mapping) or not isinstance(given.get("containers"), list) or not given["containers"]:
            raise ValueError(f"pod set {ps.name}: the pod template has no containers")
        spec: JSON = copy.deepcopy(dict(given))
        for key in _OWNED_SPEC:
            spec.pop(key, None)
        grace = order.grace_s if order.grace_s is not None else self._config.default_grace_s
        spec.update(
            subdomain=order.name,
            restartPolicy="Never",
            schedulerName=self._config.extender.scheduler_name,
            priorityClassName=self._config.priority_class(order.priority_band, order.preemptible),
            schedulingGates=[{"name": GATE}],
            terminationGracePeriodSeconds=math.ceil(grace),
        )
        _and_domain(spec, self._domain_requirements(order.domain))
        spec.pop("resourceClaims", None)
        if ps.device_requests:
            spec["resourceClaims"] = [
                {"name": r.name, "resourceClaimTemplateName": f"{order.job_name(ps.name)}-{r.name}"}
                for r in ps.device_requests
            ]
        everything, identity = self._env(order, i)
        owned = {e["name"] for e in everything} | ({"PET_NODE_RANK"} if order.framework == "TORCHRUN" else set())
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or []:
                if not isinstance(c, dict):
                    raise ValueError(f"pod set {ps.name}: spec.{kind} holds a non-object")
                if kind == "initContainers" and c.get("restartPolicy") == "Always":
                    _set_env(c, identity, {e["name"] for e in identity})
                else:
                    _set_env(c, everything, owned)
        meta = tmeta if isinstance(tmeta, Mapping) else {}
        return {
            "metadata": {
                "labels": {**_user(meta.get("labels")), **_user(order.labels), **labels},
                "annotations": {**_user(meta.get("annotations")), **_user(order.annotations), **annotations},
            },
            "spec": spec,
        }

    def _domain_requirements(self, domain: Sequence[str]) -> list[JSON]:
        """One requirement per level of the domain path: `In [value]`, or `DoesNotExist` for an absent label."""
        return [
            {"key": key, "operator": "In", "values": [value]} if value else {"key": key, "operator": "DoesNotExist"}
            for key, value in zip(self._config.extender.topology.keys, domain)
        ]

    def _env(self, order: Order, i: int) -> tuple[list[JSON], list[JSON]]:
        """(env of main and init containers, env of native sidecars): see the module docstring."""
        ps = order.pod_sets[i]
        offset = sum(p.count for p in order.pod_sets[:i])
        host, port = rendezvous_host(order), str(order.rendezvous_port)
        identity = _vars(
            TANDEM_JOB_ID=order.job_id,
            TANDEM_ATTEMPT=str(order.attempt),
            TANDEM_POD_SET=ps.name,
            TANDEM_POD_SET_REPLICAS=str(ps.count),
            TANDEM_RANK_OFFSET=str(offset),
            TANDEM_REPLICAS=str(order.total_replicas),
            TANDEM_RENDEZVOUS_HOST=host,
            TANDEM_RENDEZVOUS_PORT=port,
            TANDEM_RESTART_REASON=order.restart_reason,
            TANDEM_PREVIOUS_CLUSTER=order.previous_cluster,
            TANDEM_CLUSTER=self._config.cluster_name,
        )
        framework: list[JSON] = []
        if order.framework == "TORCHRUN":
            world = sum(p.count * _procs(p) for p in order.pod_sets)
            framework = _vars(
                PET_NNODES=str(order.total_replicas),
                PET_NPROC_PER_NODE=str(_procs(ps)),
                PET_MASTER_ADDR=host,
                PET_MASTER_PORT=port,
            )
            if offset == 0:
                framework.append({"name": "PET_NODE_RANK", "valueFrom": copy.deepcopy(_INDEX_FIELD)})
            framework += _vars(MASTER_ADDR=host, MASTER_PORT=port, WORLD_SIZE=str(world))
        elif order.framework == "MPI":
            workers = [(replica_host(order, p.name, j), _procs(p)) for p in order.pod_sets[1:] for j in range(p.count)]
            framework = _vars(
                TANDEM_MPI_HOSTS=",".join(h for h, _ in workers),
                TANDEM_MPI_HOSTS_SLOTS=",".join(f"{h}:{n}" for h, n in workers),
            )
        elif order.framework == "RAY":
            framework = _vars(RAY_ADDRESS=f"{host}:{port}")
        return identity + framework, identity


def _vars(**values: str) -> list[JSON]:
    return [{"name": k, "value": v} for k, v in values.items()]


def _set_env(container: JSON, env: list[JSON], owned: set[str]) -> None:
    """Tandem's variables first (so template variables may refer to them), then the template's own minus
    those whose names Tandem owns."""
    own = [e for e in container.get("env") or [] if not (isinstance(e, Mapping) and e.get("name") in owned)]
    container["env"] = copy.deepcopy(env) + own


def _and_domain(spec: JSON, requirements: list[JSON]) -> None:
    """AND the domain requirements into every required term (terms stay ORed), or make the one term."""
    if not requirements:
        return
    affinity = spec.get("affinity") or {}
    node_affinity = (affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None) or {}
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    ) or {}
    if not isinstance(affinity, Mapping) or not isinstance(node_affinity, Mapping) or not isinstance(required, Mapping):
        raise ValueError("spec.affinity of the pod template is not an object")
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)] or [{}]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), *copy.deepcopy(requirements)]
    spec["affinity"] = {
        **affinity,
        "nodeAffinity": {
            **node_affinity,
            "requiredDuringSchedulingIgnoredDuringExecution": {**required, "nodeSelectorTerms": terms},
        },
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


# ----------------------------------------------------------------------------------------- patches (A-7)


def json_pointer(*parts: str | int) -> str:
    """RFC 6901 pointer: `~` is written `~0` and `/` is written `~1` within a key."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def pin_patch(pod: Mapping[str, Any], node: str) -> list[JSON]:
    """JSON Patch pinning a gated pod to `node` (A-1, A-3): a `metadata.name In [node]` field requirement
    appended to every existing required term (never a new term, which would widen), or a one-term
    affinity when the pod has none. The `test` on resourceVersion makes a concurrent change a 409/422."""
    version = (pod.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise ValueError("pin_patch needs the pod as the API server returned it (no metadata.resourceVersion)")
    ops: list[JSON] = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    at: Any = pod
    depth = 0
    for key in _TERMS:
        nxt = at.get(key) if isinstance(at, Mapping) else None
        if nxt is None or (key == _TERMS[-1] and not nxt):
            break
        at, depth = nxt, depth + 1
    if depth == len(_TERMS) and isinstance(at, list):
        for i, term in enumerate(at):
            fields = term.get("matchFields") if isinstance(term, Mapping) else None
            if isinstance(fields, list) and pin in fields:
                continue
            if isinstance(fields, list):
                ops.append({"op": "add", "path": json_pointer(*_TERMS, i, "matchFields", "-"), "value": pin})
            else:
                ops.append({"op": "add", "path": json_pointer(*_TERMS, i, "matchFields"), "value": [pin]})
        return ops
    value: Any = [{"matchFields": [pin]}]
    for key in reversed(_TERMS[depth + 1 :]):
        value = {key: value}
    ops.append({"op": "add", "path": json_pointer(*_TERMS[: depth + 1]), "value": value})
    return ops


def ungate_patch(pod: Mapping[str, Any], gate: str = GATE) -> list[JSON] | None:
    """JSON Patch removing only `gate` (a merge patch would drop other controllers' gates too); None when absent."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for i, g in enumerate(gates):
        if isinstance(g, Mapping) and g.get("name") == gate:
            path = json_pointer("spec", "schedulingGates", i)
            return [{"op": "test", "path": f"{path}/name", "value": gate}, {"op": "remove", "path": path}]
    return None


# ----------------------------------------------------------------------------------------- admission (A-8)


def _generate_name(job: str, index: int) -> str:
    """The Job controller's `<job>-<index>-`, the job part cut so it fits 58 characters (5 are appended)."""
    suffix = f"-{index}-"
    return job[: 58 - len(suffix)] + suffix


def pod_for_dry_run(job: Mapping[str, Any], index: int) -> JSON:
    """The pod the Job controller would create for `index`, to create with dryRun=All so admission
    (LimitRange, injectors, PSA, quota) shows what kube-scheduler will see. The controller-uid labels and
    the ownerReference need the Job's uid, which does not exist yet: they are left out."""
    meta, spec = job["metadata"], job["spec"]
    if not 0 <= index < int(spec.get("completions") or 0):
        raise ValueError(f"index {index} is outside the Job's completions")
    name = str(meta["name"])
    template = copy.deepcopy(spec["template"])
    tmeta = template.get("metadata") or {}
    labels = {
        **(tmeta.get("labels") or {}),
        "batch.kubernetes.io/job-name": name,
        "job-name": name,
        INDEX_LABEL: str(index),
    }
    annotations = {**(tmeta.get("annotations") or {}), INDEX_LABEL: str(index)}
    pod_spec = template["spec"]
    pod_spec["hostname"] = f"{name}-{index}"
    for kind in ("initContainers", "containers"):
        for c in pod_spec.get(kind) or []:
            if not any(e.get("name") == INDEX_ENV for e in c.get("env") or []):
                c["env"] = [*(c.get("env") or []), {"name": INDEX_ENV, "valueFrom": copy.deepcopy(_INDEX_FIELD)}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": _generate_name(name, index),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "finalizers": [TRACKING_FINALIZER],
        },
        "spec": pod_spec,
    }


def _cpu(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _bytes(n: int) -> str:
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _mig(shape: PodShape) -> str:
    return f"{shape.mig_count} x {shape.mig_profile}" if shape.mig_count else "none"


def _names(pod: Mapping[str, Any]) -> set[str]:
    spec = pod.get("spec") or {}
    return {str(c.get("name")) for kind in ("initContainers", "containers") for c in spec.get(kind) or []}


def admitted_shape_problem(
    admitted_pod: Mapping[str, Any], expected: PodShape, *, rendered: Mapping[str, Any] | None = None
) -> str | None:
    """What admission changed that the fit depends on (None: nothing). DRA requests live in the claim
    templates, which admission of the pod cannot change, so they are not compared. `rendered` (the pod
    sent to the dry run) lets the message name the containers admission added."""
    try:
        got = shape_from_pod(admitted_pod, claims=lambda _claim: ())
    except PodSpecError as e:
        return f"admission left a pod whose requests cannot be read: {e}"
    changes = [
        f"{what} {was} -> {now}"
        for what, was, now in (
            ("GPUs", str(expected.gpus), str(got.gpus)),
            (
                "GPU share (milli)",
                str(expected.gpu_milli if expected.gpus else "-"),
                str(got.gpu_milli if got.gpus else "-"),
            ),
            ("MIG", _mig(expected), _mig(got)),
            ("cpu", _cpu(expected.cpu_milli), _cpu(got.cpu_milli)),
            ("memory", _bytes(expected.memory), _bytes(got.memory)),
        )
        if was != now
    ]
    want, have = dict(expected.extended), dict(got.extended)
    changes += [
        f"{name} {want.get(name, 0)} -> {have.get(name, 0)}"
        for name in sorted(want.keys() | have.keys())
        if want.get(name, 0) != have.get(name, 0)
    ]
    if not changes:
        return None
    hint = ""
    added = sorted(_names(admitted_pod) - _names(rendered)) if rendered is not None else []
    if added:
        hint = f" (containers added by admission: {', '.join(added)})"
    elif got.cpu_milli > expected.cpu_milli or got.memory > expected.memory:
        hint = " (a sidecar injector or a LimitRange default?)"
    return "admission changed the pod's requests: " + ", ".join(changes) + hint
