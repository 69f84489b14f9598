"""Per-node facts precomputed once per node change, so a request only looks them up.

A NodeFacts object is rebuilt only when its node, a pod bound to it, its ResourceSlices, a claim
allocated on it or a reservation naming it changes; its identity is the memo token of every
per-shape verdict, so unchanged nodes keep their cached verdicts across inventory versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from extender.config import ExtenderConfig
from extender.podreq import PodRecord
from extender.reservations import Reservation
from placement.model import WHOLE_GPU_MILLI, DraDevice, DraVersion
from placement.quantity import QuantityError, cpu_milli, to_int_bytes

__all__ = ["Hold", "NodeFacts", "build_facts", "parse_slice_devices", "DeviceKey"]

DeviceKey = tuple[str, str, str]
"""(driver, pool, device), as in a claim's allocation results."""


@dataclass(frozen=True, slots=True)
class Hold:
    """What one gang reservation still holds on one node (replicas not yet bound)."""

    job: str
    attempt: str
    replicas: int
    gpus: int
    cpu_milli: int
    memory: int
    mig: tuple[tuple[str, int], ...]
    domain: str


@dataclass(frozen=True, slots=True, eq=False)
class NodeFacts:
    """Everything the filter and the scores need about one node, with usage already subtracted."""

    name: str
    name_json: bytes
    host_prefix: bytes
    labels: Mapping[str, str]
    ready: bool
    cordoned: bool
    cpu_free: int
    memory_free: int
    pods_free: int
    extended_free: Mapping[str, int]
    gpu_model: str | None
    gpu_memory_mib: int
    gpu_total: int
    gpu_milli_used: tuple[int, ...]
    mig_total: Mapping[str, int]
    mig_free: Mapping[str, int]
    dra_devices: tuple[DraDevice, ...]
    dra_consumers: Mapping[DeviceKey, frozenset[str]]
    holds: tuple[Hold, ...]
    pods: tuple[PodRecord, ...]
    topology: tuple[str | None, ...]

    @property
    def whole_free(self) -> int:
        return sum(1 for u in self.gpu_milli_used if u == 0)

    @property
    def best_share_free(self) -> int:
        return max((WHOLE_GPU_MILLI - u for u in self.gpu_milli_used), default=0)

    def held_gpus(self, exempt: tuple[str, str] | None) -> int:
        return sum(h.replicas * h.gpus for h in self.holds if (h.job, h.attempt) != exempt)

    def held_mig(self, profile: str, exempt: tuple[str, str] | None) -> int:
        return sum(h.replicas * c for h in self.holds if (h.job, h.attempt) != exempt
                   for p, c in h.mig if p == profile)


def _int(v: Any) -> int:
    try:
        return to_int_bytes(v)
    except (QuantityError, ValueError, TypeError):
        return 0


def _attr_value(v: Any) -> Any:
    if not isinstance(v, dict):
        return None
    for k in ("string", "int", "bool"):
        if k in v:
            return v[k]
    if "version" in v:
        return DraVersion(str(v["version"]))
    return None


def parse_slice_devices(slice_obj: dict[str, Any]) -> tuple[str, list[DraDevice]]:
    """(node name, devices) of one ResourceSlice (resource.k8s.io/v1 layout)."""
    spec = slice_obj.get("spec") or {}
    driver = str(spec.get("driver", ""))
    pool = str((spec.get("pool") or {}).get("name", ""))
    out = []
    for d in spec.get("devices") or []:
        attrs = {str(k): val for k, v in (d.get("attributes") or {}).items() if (val := _attr_value(v)) is not None}
        caps = {str(k): _int((v or {}).get("value")) for k, v in (d.get("capacity") or {}).items()}
        out.append(DraDevice(driver=driver, pool=pool, name=str(d.get("name", "")), attributes=attrs, capacity=caps))
    return str(spec.get("nodeName", "")), out


def _ready(node: dict[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def build_facts(
    node: dict[str, Any],
    pods: Iterable[PodRecord],
    devices: Iterable[DraDevice],
    consumers: Mapping[DeviceKey, frozenset[str]],
    reservations: Iterable[Reservation],
    config: ExtenderConfig,
) -> NodeFacts:
    """Facts of one node from its object, the pods holding resources on it, its DRA devices (with
    the pod UIDs each allocated device serves) and the reservations naming it."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    labels = dict(meta.get("labels") or {})
    spec = node.get("spec") or {}
    alloc = (node.get("status") or {}).get("allocatable") or {}
    pods = tuple(pods)
    try:
        cpu = cpu_milli(alloc.get("cpu", 0))
    except (QuantityError, ValueError):
        cpu = 0
    mem = _int(alloc.get("memory", 0))
    npods = _int(alloc.get("pods", 110))
    gpu_total = _int(alloc[config.gpu_resource]) if config.gpu_resource in alloc else _int(labels.get("nvidia.com/gpu.count", 0))
    prefix = config.mig_resource_prefix
    mig_total = {k[len(prefix):]: _int(v) for k, v in alloc.items() if k.startswith(prefix) and _int(v) > 0}
    extended = {k: _int(v) for k, v in alloc.items() if "/" in k and k != config.gpu_resource and not k.startswith(prefix)}
    cpu_used = mem_used = whole_used = 0
    shares: list[int] = []
    mig_used: dict[str, int] = {}
    for p in pods:
        cpu_used += p.cpu_milli
        mem_used += p.memory
        whole_used += p.gpus
        if p.gpu_milli:
            shares.append(p.gpu_milli)
        for prof, c in p.mig:
            mig_used[prof] = mig_used.get(prof, 0) + c
    used = [WHOLE_GPU_MILLI if i < whole_used else 0 for i in range(gpu_total)]
    for s in sorted(shares, reverse=True):  # best fit, as the sharing device plugin would
        fits = [i for i, u in enumerate(used) if u + s <= WHOLE_GPU_MILLI]
        if fits:
            i = max(fits, key=lambda j: used[j])
            used[i] += s
    bound = {}
    for p in pods:
        if p.gang is not None:
            g = (p.gang.job, p.gang.attempt)
            bound[g] = bound.get(g, 0) + 1
    holds = []
    for r in reservations:
        left = r.nodes.get(name, 0) - bound.get(r.gang, 0)
        if left > 0:
            holds.append(Hold(r.job, r.attempt, left, r.gpus, r.cpu_milli, r.memory, r.mig, r.domain))
    devs = tuple(
        DraDevice(d.driver, d.pool, d.name, d.attributes, d.capacity, allocated=d.key in consumers)
        for d in devices
    )
    gpu_mem = _int(labels.get("nvidia.com/gpu.memory", 0))
    return NodeFacts(
        name=name,
        name_json=orjson.dumps(name),
        host_prefix=b'{"Host":' + orjson.dumps(name) + b',"Score":',
        labels=labels,
        ready=_ready(node),
        cordoned=bool(spec.get("unschedulable")),
        cpu_free=cpu - cpu_used,
        memory_free=mem - mem_used,
        pods_free=npods - len(pods),
        extended_free=extended,
        gpu_model=labels.get("nvidia.com/gpu.product"),
        gpu_memory_mib=gpu_mem,
        gpu_total=gpu_total,
        gpu_milli_used=tuple(used),
        mig_total=mig_total,
        mig_free={k: v - mig_used.get(k, 0) for k, v in mig_total.items()},
        dra_devices=devs,
        dra_consumers={k: v for k, v in consumers.items()},
        holds=tuple(holds),
        pods=pods,
        topology=tuple(labels.get(k) for k in config.topology.keys),
    )
