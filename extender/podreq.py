"""Pod JSON -> what it asks of a node (core PodShape) and what it holds once bound (PodRecord).

Written in the extender while the core's podspec module is not available; requests follow
kube-scheduler's rules (init containers: max, sidecars: summed, pod overhead added).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from extender.config import ExtenderConfig
from extender.errors import BadRequest
from placement.model import WHOLE_GPU_MILLI, DraRequest, LabelRequirement, PodShape
from placement.quantity import QuantityError, cpu_milli, to_int_bytes

__all__ = ["Requests", "PodRecord", "GangRef", "pod_requests", "pod_record", "holds_resources", "gang_of"]

_TERMINAL = ("Succeeded", "Failed")


@dataclass(slots=True)
class Requests:
    """Effective requests of one pod: CPU millicores, memory bytes, and extended resources."""

    cpu_milli: int = 0
    memory: int = 0
    extended: dict[str, int] = field(default_factory=dict)


def _container_requests(c: Any, path: str) -> Requests:
    if not isinstance(c, dict):
        raise BadRequest(f"{path} must be an object")
    res = c.get("resources") or {}
    req = res.get("requests")
    lim = res.get("limits") or {}
    if req is None:
        req = {}
    if not isinstance(req, dict) or not isinstance(lim, dict):
        raise BadRequest(f"{path}.resources must hold maps")
    merged = dict(lim)  # kube defaults requests to limits when only limits are set
    merged.update(req)
    out = Requests()
    for k, v in merged.items():
        try:
            if k == "cpu":
                out.cpu_milli = cpu_milli(v)
            elif k == "memory":
                out.memory = to_int_bytes(v)
            elif "/" in k or k.startswith("hugepages-"):
                out.extended[k] = to_int_bytes(v)
        except (QuantityError, ValueError, TypeError) as e:
            raise BadRequest(f"{path}.resources[{k}]: {e}") from e
    return out


def _add(a: Requests, b: Requests) -> None:
    a.cpu_milli += b.cpu_milli
    a.memory += b.memory
    for k, v in b.extended.items():
        a.extended[k] = a.extended.get(k, 0) + v


def _max_into(a: Requests, b: Requests) -> None:
    a.cpu_milli = max(a.cpu_milli, b.cpu_milli)
    a.memory = max(a.memory, b.memory)
    for k, v in b.extended.items():
        a.extended[k] = max(a.extended.get(k, 0), v)


def pod_requests(pod: dict[str, Any]) -> Requests:
    """kube-scheduler's computePodResourceRequest: sum(containers) + sidecars, max with each
    init container (plus the sidecars started before it), plus spec.overhead."""
    spec = pod.get("spec") or {}
    total = Requests()
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise BadRequest("Pod.spec.containers must be a list")
    for i, c in enumerate(containers):
        _add(total, _container_requests(c, f"Pod.spec.containers[{i}]"))
    inits = spec.get("initContainers") or []
    if not isinstance(inits, list):
        raise BadRequest("Pod.spec.initContainers must be a list")
    sidecars = Requests()
    init_peak = Requests()
    for i, c in enumerate(inits):
        r = _container_requests(c, f"Pod.spec.initContainers[{i}]")
        if isinstance(c, dict) and c.get("restartPolicy") == "Always":
            _add(sidecars, r)
            _max_into(init_peak, Requests(sidecars.cpu_milli, sidecars.memory, dict(sidecars.extended)))
        else:
            step = Requests(sidecars.cpu_milli, sidecars.memory, dict(sidecars.extended))
            _add(step, r)
            _max_into(init_peak, step)
    _add(total, sidecars)
    _max_into(total, init_peak)
    overhead = spec.get("overhead")
    if isinstance(overhead, dict):
        _add(total, _container_requests({"resources": {"requests": overhead}}, "Pod.spec.overhead"))
    return total


def holds_resources(pod: dict[str, Any]) -> bool:
    """Bound to a node and not finished: its requests count against the node."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return bool(spec.get("nodeName")) and status.get("phase") not in _TERMINAL


@dataclass(frozen=True, slots=True)
class GangRef:
    """A gang pod's identity and the node it was pinned to (None when not pinned yet)."""

    job: str
    attempt: str
    node: str | None


def gang_of(pod: dict[str, Any], config: ExtenderConfig) -> GangRef | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    job = labels.get(config.gang_job_label) if isinstance(labels, dict) else None
    if not isinstance(job, str) or not job:
        return None
    attempt = str(labels.get(config.gang_attempt_label, ""))
    sel = (pod.get("spec") or {}).get("nodeSelector") or {}
    node = sel.get(config.topology.hostname) if isinstance(sel, dict) else None
    return GangRef(job, attempt, node if isinstance(node, str) else None)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A bound pod reduced to what it holds on its node (parsed once per watch event)."""

    uid: str
    namespace: str
    name: str
    node: str
    cpu_milli: int
    memory: int
    gpus: int
    gpu_milli: int
    mig: tuple[tuple[str, int], ...]
    gang: GangRef | None
    running: bool


def pod_record(pod: dict[str, Any], config: ExtenderConfig) -> PodRecord | None:
    """The record of a pod that holds resources, None for pods that hold nothing."""
    if not holds_resources(pod):
        return None
    meta = pod.get("metadata") or {}
    try:
        req = pod_requests(pod)
    except BadRequest:
        return None
    gpus = req.extended.get(config.gpu_resource, 0)
    share = req.extended.get(config.gpu_share_resource, 0)
    mig = tuple(
        sorted((k[len(config.mig_resource_prefix):], v) for k, v in req.extended.items()
               if k.startswith(config.mig_resource_prefix) and v > 0)
    )
    return PodRecord(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=str(pod["spec"]["nodeName"]),
        cpu_milli=req.cpu_milli,
        memory=req.memory,
        gpus=gpus,
        gpu_milli=share,
        mig=mig,
        gang=gang_of(pod, config),
        running=(pod.get("status") or {}).get("phase") == "Running",
    )


def _affinity(spec: dict[str, Any]) -> tuple[tuple[LabelRequirement, ...], ...]:
    aff = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = aff.get("nodeSelectorTerms") or []
    out = []
    for t in terms:
        exprs = tuple(
            LabelRequirement(str(e.get("key", "")), str(e.get("operator", "")), tuple(str(v) for v in e.get("values") or ()))
            for e in (t.get("matchExpressions") or [])
        )
        fields = tuple(
            LabelRequirement("metadata.name", str(e.get("operator", "")), tuple(str(v) for v in e.get("values") or ()))
            for e in (t.get("matchFields") or [])
        )
        out.append(exprs + fields)
    return tuple(out)


def shape_from_pod(
    pod: dict[str, Any], config: ExtenderConfig, claim_requests: tuple[DraRequest, ...]
) -> PodShape:
    """What one replica asks of a node. claim_requests come from the pod's ResourceClaims
    (resolved by the inventory, which knows the claims)."""
    spec = pod["spec"]
    req = pod_requests(pod)
    ext = req.extended
    gpus = ext.get(config.gpu_resource, 0)
    share = ext.get(config.gpu_share_resource, 0)
    gpu_milli = WHOLE_GPU_MILLI
    if share:
        if gpus:
            raise BadRequest(f"pod asks for both {config.gpu_resource} and {config.gpu_share_resource}")
        if share > WHOLE_GPU_MILLI:
            raise BadRequest(f"{config.gpu_share_resource} must be at most {WHOLE_GPU_MILLI}")
        gpus, gpu_milli = 1, share
    migs = [(k[len(config.mig_resource_prefix):], v) for k, v in ext.items()
            if k.startswith(config.mig_resource_prefix) and v > 0]
    if len(migs) > 1:
        raise BadRequest("pod asks for more than one MIG profile")
    sel = spec.get("nodeSelector") or {}
    if not isinstance(sel, dict):
        raise BadRequest("Pod.spec.nodeSelector must be a map")
    affinity = _affinity(spec)
    models: set[str] = set()
    product = "nvidia.com/gpu.product"
    if product in sel:
        models.add(str(sel[product]))
    min_mem = 0
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    raw_mem = ann.get("tandem.dev/min-gpu-memory-mib") if isinstance(ann, dict) else None
    if raw_mem is not None:
        try:
            min_mem = int(raw_mem)
        except ValueError as e:
            raise BadRequest(f"annotation tandem.dev/min-gpu-memory-mib is not an integer: {raw_mem!r}") from e
    other = tuple(sorted(
        (k, v) for k, v in ext.items()
        if k not in (config.gpu_resource, config.gpu_share_resource) and not k.startswith(config.mig_resource_prefix)
    ))
    return PodShape(
        gpus=gpus,
        gpu_milli=gpu_milli,
        gpu_models=frozenset(models),
        min_gpu_memory_mib=min_mem,
        mig_profile=migs[0][0] if migs else None,
        mig_count=migs[0][1] if migs else 0,
        dra=claim_requests,
        cpu_milli=req.cpu_milli,
        memory=req.memory,
        extended=other,
        node_selector=tuple(sorted((str(k), str(v)) for k, v in sel.items())),
        affinity=affinity,
    )
