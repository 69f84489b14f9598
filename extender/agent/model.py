"""The agent's domain types: a broker order as plain data (protobuf stays in `wire`), and names derived from it.

Names (FLEET-NOTES A-2): the Service is `<job>-<attempt>`, the Indexed Job of a pod set is
`<job>-<attempt>-<pod set>`, the reservation ConfigMap is `<reservation namespace>/<job>-<attempt>`.
Replica i of pod set s is reachable as `<job>-<attempt>-<s>-<i>.<job>-<attempt>` (the cluster domain
comes from the pods' DNS search path, never hard-coded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from placement.model import PodShape

__all__ = [
    "AttemptKey",
    "NodeCount",
    "DeviceRequestSpec",
    "PodSetOrder",
    "Order",
    "JOB_ID_MAX",
    "POD_SET_MAX",
    "ATTEMPT_MAX",
    "INDEX_MAX",
    "check_name_budget",
]

AttemptKey = tuple[str, int]
"""(job id, attempt number)."""

JOB_ID_MAX = 40
"""Job ids are DNS-1035 labels of at most 40 characters (the broker's contract)."""
POD_SET_MAX = 12
"""Pod set names are DNS-1035 labels of at most 12 characters."""
ATTEMPT_MAX = 99
"""Attempts a job may have (the broker's hard cap is below this)."""
INDEX_MAX = 999_999
"""Largest replica index the hostname budget allows."""


def check_name_budget(
    job_max: int = JOB_ID_MAX,
    attempt_max: int = ATTEMPT_MAX,
    pod_set_max: int = POD_SET_MAX,
    index_max: int = INDEX_MAX,
) -> None:
    """The Job controller sets each pod's hostname to `<job>-<attempt>-<pod set>-<index>` and never shortens
    it; over 63 characters the pod cannot be created and the gang never exists. Checked at start."""
    longest = job_max + 1 + len(str(attempt_max)) + 1 + pod_set_max + 1 + len(str(index_max))
    if longest > 63:
        raise ValueError(f"pod hostnames could reach {longest} characters (limit 63): lower the name limits")


@dataclass(frozen=True, slots=True)
class NodeCount:
    node: str
    replicas: int


@dataclass(frozen=True, slots=True)
class DeviceRequestSpec:
    """One DRA request of a replica (becomes one ResourceClaimTemplate, A-22)."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    count: int = 1
    all_devices: bool = False


@dataclass(frozen=True, slots=True)
class PodSetOrder:
    """What to create for one pod set: `count` replicas, replica indexes contiguous per node in list order."""

    name: str
    count: int
    shape: PodShape
    template: Mapping[str, Any]
    """The submitted PodTemplateSpec (untrusted: the renderer overwrites what the agent owns)."""
    nodes: tuple[NodeCount, ...]
    device_requests: tuple[DeviceRequestSpec, ...] = ()
    fixed_count: bool = False

    def node_of(self, index: int) -> str | None:
        """The node replica `index` is assigned to (first node gets 0..r-1, and so on)."""
        for nc in self.nodes:
            if index < nc.replicas:
                return nc.node
            index -= nc.replicas
        return None

    def per_node(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for nc in self.nodes:
            out[nc.node] = out.get(nc.node, 0) + nc.replicas
        return out


@dataclass(frozen=True, slots=True)
class Order:
    """A Dispatch as plain data."""

    job_id: str
    attempt: int
    tenant: str
    pod_sets: tuple[PodSetOrder, ...]
    domain: tuple[str, ...] = ()
    """Domain path values, broad to narrow (one per topology level from the broadest; "" = label absent)."""
    namespace_hint: str = ""
    framework: str = "PLAIN"
    """Framework name without its prefix: PLAIN, TORCHRUN, RAY, MPI."""
    rendezvous_port: int = 29400
    start_deadline: float = 0.0
    """Broker clock (seconds since the epoch)."""
    start_timeout_s: float = 600.0
    max_runtime_s: float | None = None
    job_set: str = ""
    queue: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    priority_band: str = "default"
    grace_s: float | None = None
    preemptible: bool = False
    dispatch_id: str = ""
    inventory_sequence: int = 0
    restart_reason: str = ""
    previous_cluster: str = ""

    @property
    def key(self) -> AttemptKey:
        return (self.job_id, self.attempt)

    @property
    def name(self) -> str:
        """`<job>-<attempt>`: the Service, the reservation ConfigMap, the prefix of every object."""
        return f"{self.job_id}-{self.attempt}"

    def job_name(self, pod_set: str) -> str:
        return f"{self.name}-{pod_set}"

    @property
    def total_replicas(self) -> int:
        return sum(ps.count for ps in self.pod_sets)
