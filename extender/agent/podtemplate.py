"""The pod template of one pod set's Job: the submitted template with everything the agent owns overwritten (H-4).

Pure: plain dicts in, plain dicts out. The agent owns the scheduling fields (scheduler, priority class, the
gang's scheduling gate, the domain's node affinity), the label and annotation keys under RESERVED_DOMAINS,
the DRA claims and the environment.

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
from collections.abc import Mapping, Sequence
from typing import Any

from extender.agent.config import AgentConfig
from extender.agent.model import Order, PodSetOrder
from extender.podreq import INDEX_LABEL

__all__ = [
    "GATE",
    "RESERVED_DOMAINS",
    "INDEX_FIELD",
    "is_reserved_key",
    "user_keys",
    "replica_host",
    "rendezvous_host",
    "pod_template",
]

JSON = dict[str, Any]

GATE = "tandem.dev/gang"
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
_OWNED_SPEC = ("hostname", "activeDeadlineSeconds", "nodeName", "priority", "preemptionPolicy", "overhead")
"""H-4 fields removed from the template: the Job controller, priority and RuntimeClass admission set them."""
INDEX_FIELD = {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}}
"""The downward-API source of a pod's completion index (the Job controller's annotation)."""


def is_reserved_key(key: str) -> bool:
    """Whether a label / annotation key falls under RESERVED_DOMAINS (domain or subdomain)."""
    prefix, slash, name = key.rpartition("/")
    if not slash or key in USER_SETTABLE_KEYS:
        return False
    domain = prefix.lower()
    if domain == _USER_DOMAIN:
        return name == "managed-by"
    return any(domain == reserved or domain.endswith("." + reserved) for reserved in RESERVED_DOMAINS)


def user_keys(values: Any) -> dict[str, str]:
    """Labels or annotations from an untrusted source, without the reserved keys."""
    if not isinstance(values, Mapping):
        return {}
    return {str(k): str(v) for k, v in values.items() if not is_reserved_key(str(k))}


def replica_host(order: Order, pod_set: str, index: int) -> str:
    """DNS name of a replica relative to the namespace (the pods' search path supplies the rest, A-2)."""
    return f"{order.job_name(pod_set)}-{index}.{order.name}"


def rendezvous_host(order: Order) -> str:
    return replica_host(order, order.pod_sets[0].name, 0)


def pod_template(
    config: AgentConfig, order: Order, i: int, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> JSON:
    """The submitted template of pod set `i` with everything the agent owns overwritten (H-4)."""
    ps = order.pod_sets[i]
    tpl = ps.template
    tmeta = tpl.get("metadata") if isinstance(tpl, Mapping) else None
    given = tpl.get("spec") if isinstance(tpl, Mapping) else None
    if not isinstance(given, Mapping) or not isinstance(given.get("containers"), list) or not given["containers"]:
        raise ValueError(f"pod set {ps.name}: the pod template has no containers")
    spec: JSON = copy.deepcopy(dict(given))
    for key in _OWNED_SPEC:
        spec.pop(key, None)
    grace = order.grace_s if order.grace_s is not None else config.default_grace_s
    spec.update(
        subdomain=order.name,
        restartPolicy="Never",
        schedulerName=config.extender.scheduler_name,
        priorityClassName=config.priority_class(order.priority_band, order.preemptible),
        schedulingGates=[{"name": GATE}],
        terminationGracePeriodSeconds=math.ceil(grace),
    )
    _and_domain(spec, _domain_requirements(config.extender.topology.keys, order.domain))
    spec.pop("resourceClaims", None)
    if ps.device_requests:
        spec["resourceClaims"] = [
            {"name": r.name, "resourceClaimTemplateName": f"{order.job_name(ps.name)}-{r.name}"}
            for r in ps.device_requests
        ]
    everything, identity = _env(config, order, i)
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
            "labels": {**user_keys(meta.get("labels")), **user_keys(order.labels), **labels},
            "annotations": {**user_keys(meta.get("annotations")), **user_keys(order.annotations), **annotations},
        },
        "spec": spec,
    }


# ----------------------------------------------------------------------------------------- the domain (A-2)


def _domain_requirements(keys: Sequence[str], domain: Sequence[str]) -> list[JSON]:
    """One requirement per level of the domain path: `In [value]`, or `DoesNotExist` for an absent label."""
    return [
        {"key": key, "operator": "In", "values": [value]} if value else {"key": key, "operator": "DoesNotExist"}
        for key, value in zip(keys, domain)
    ]


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


# ----------------------------------------------------------------------------------------- the environment (A-15)


def _procs(ps: PodSetOrder) -> int:
    """Processes torchrun starts per replica: one per GPU (whole, MIG instance or DRA device), at least 1."""
    shape = ps.shape
    devices = shape.gpus or shape.mig_count or sum(r.count for r in ps.device_requests if not r.all_devices)
    return max(1, devices)


def _env(config: AgentConfig, order: Order, i: int) -> tuple[list[JSON], list[JSON]]:
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
        TANDEM_CLUSTER=config.cluster_name,
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
            framework.append({"name": "PET_NODE_RANK", "valueFrom": copy.deepcopy(INDEX_FIELD)})
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
