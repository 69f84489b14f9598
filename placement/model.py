"""The immutable inventory and request model that the extender, the broker and the simulator share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "Taint",
    "Toleration",
    "LabelRequirement",
    "MigInstance",
    "Gpu",
    "DraDevice",
    "DraVersion",
    "AttributeValue",
    "Node",
    "DraRequest",
    "PodShape",
    "PodSet",
    "JobRequest",
    "TopologyLevels",
    "WHOLE_GPU_MILLI",
    "GPU_PRODUCT_LABEL",
    "GPU_MEMORY_LABEL",
    "HOSTNAME_LABEL",
    "ZONE_LABEL",
    "CLIQUE_LABEL",
    "DEFAULT_BLOCK_LABEL",
    "DEFAULT_RACK_LABEL",
]

WHOLE_GPU_MILLI = 1000
"""A GPU's share in thousandths: 1000 = the whole device."""

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
DEFAULT_BLOCK_LABEL = "network.example.com/block"
DEFAULT_RACK_LABEL = "network.example.com/rack"


# --------------------------------------------------------------------------- taints


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint (spec.taints[]). effect: NoSchedule, PreferNoSchedule or NoExecute."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration. operator: "Equal" or "Exists"; empty key with Exists tolerates all;
    empty effect matches every effect."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Same rule as k8s.io/api/core/v1 Toleration.ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One node-affinity match expression: operator In, NotIn, Exists, DoesNotExist, Gt, Lt."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels satisfies the expression (as kube's labels.Selector)."""
        op = self.operator
        if op == "In":
            return labels.get(self.key) in self.values
        if op == "NotIn":
            return labels.get(self.key) not in self.values
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        if op in ("Gt", "Lt"):
            have = labels.get(self.key)
            if have is None or len(self.values) != 1:
                return False
            try:
                a, b = int(have), int(self.values[0])
            except ValueError:
                return False
            return a > b if op == "Gt" else a < b
        return False


# --------------------------------------------------------------------------- devices


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One existing MIG GPU instance: profile name (e.g. "3g.40gb"), NVML GI profile id when known,
    placement as memory slices [start, start+size), and whether a pod holds it."""

    profile: str
    gi_profile_id: int | None
    start: int
    size: int
    used: bool = False


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU of a node.

    milli_used: share in use, 0..1000 (fractional sharing); 1000 = wholly taken.
    mig: the GPU's MIG instances; empty means MIG mode is off (then it can be given whole or shared).
    A MIG-enabled GPU is only ever handed out as MIG instances.
    """

    index: int
    model: str
    memory_mib: int
    milli_used: int = 0
    mig: tuple[MigInstance, ...] = ()
    healthy: bool = True

    @property
    def is_free(self) -> bool:
        """Healthy, MIG off and nothing running on it: can be given whole."""
        return self.healthy and not self.mig and self.milli_used == 0

    @property
    def milli_free(self) -> int:
        """Share still free for fractional requests (0 when unhealthy or in MIG mode)."""
        if not self.healthy or self.mig:
            return 0
        return WHOLE_GPU_MILLI - self.milli_used


@dataclass(frozen=True, slots=True)
class DraVersion:
    """A DRA attribute of kind "version" (semver text such as "580.95.5"); CEL sees it as semver()."""

    text: str


AttributeValue = str | int | bool | DraVersion
"""A DRA attribute value: string, int, bool, or a DraVersion."""


@dataclass(frozen=True, slots=True, eq=True)
class DraDevice:
    """One device of a ResourceSlice (resource.k8s.io/v1).

    attributes: keys are qualified ("gpu.nvidia.com/productName") or unqualified ("productName",
    meaning the driver's own domain); `attribute()` resolves both. Versions are kept as strings.
    capacity: integer values (bytes for memory; 1 for "memorySlice<i>" markers of static MIG).
    allocated: some ResourceClaim holds it.
    """

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)
    allocated: bool = False

    def attribute(self, qualified_or_short: str) -> AttributeValue | None:
        """Attribute by qualified name, or by short name within the driver's domain."""
        attrs = self.attributes
        if qualified_or_short in attrs:
            return attrs[qualified_or_short]
        domain, sep, short = qualified_or_short.rpartition("/")
        if sep and domain == self.driver:
            return attrs.get(short)
        if not sep:
            return attrs.get(f"{self.driver}/{qualified_or_short}")
        return None

    @property
    def key(self) -> tuple[str, str, str]:
        """(driver, pool, name): unique within a cluster, as in a claim's allocation results."""
        return (self.driver, self.pool, self.name)


# --------------------------------------------------------------------------- node


@dataclass(frozen=True, slots=True, eq=True)
class Node:
    """A node as the core sees it: state, free resources, devices and topology path.

    Quantities: CPU in millicores, memory in bytes, pods as a count. `*_free` already
    subtracts the requests of every pod that holds resources on the node.
    extended_free: free counts of other extended resources, e.g. "nvidia.com/mig-1g.10gb"
    when the device plugin's mixed strategy publishes MIG instances (counts, no positions).
    topology: one value per configured TopologyLevels key (None = label missing).
    Not hashable when built with dict fields (it is compared by value, identified by name).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    cordoned: bool = False
    cpu_milli_allocatable: int = 0
    cpu_milli_free: int = 0
    memory_allocatable: int = 0
    memory_free: int = 0
    pods_free: int = 110
    gpus: tuple[Gpu, ...] = ()
    extended_free: Mapping[str, int] = field(default_factory=dict)
    dra_devices: tuple[DraDevice, ...] = ()
    topology: tuple[str | None, ...] = ()

    @property
    def gpu_model(self) -> str | None:
        """Product name of the node's GPUs (first GPU, else the GFD label), None without GPUs."""
        if self.gpus:
            return self.gpus[0].model
        return self.labels.get(GPU_PRODUCT_LABEL)

    @property
    def gpu_memory_mib(self) -> int:
        """Memory of the node's smallest GPU in MiB (0 without GPUs)."""
        return min((g.memory_mib for g in self.gpus), default=0)

    @property
    def free_whole_gpus(self) -> int:
        """GPUs that can be given whole right now."""
        return sum(1 for g in self.gpus if g.is_free)

    @property
    def total_gpus(self) -> int:
        return len(self.gpus)

    def extended(self, resource: str) -> int:
        """Free count of an extended resource (0 when the node does not publish it)."""
        return self.extended_free.get(resource, 0)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class DraRequest:
    """One request of a ResourceClaim: `count` devices of `device_class`, each passing every
    CEL `selectors` expression (the class's own selectors are added by the caller's class map)."""

    device_class: str
    selectors: tuple[str, ...] = ()
    count: int = 1


@dataclass(frozen=True, slots=True)
class PodShape:
    """What one replica needs. Hashable, so callers may cache fit results per shape.

    gpus: number of GPU devices; gpu_milli: share needed on EACH of them (1000 = whole GPU,
      < 1000 = fractional sharing on `gpus` distinct devices, normally 1).
    gpu_models: allowed `nvidia.com/gpu.product` values (empty = any).
    mig_profile: a MIG profile name like "3g.40gb"; then `mig_count` instances of it and gpus = 0.
    dra: device requests of the pod's ResourceClaims.
    cpu_milli / memory (bytes): kube-scheduler's effective requests (see podspec).
    extended: other extended resources requested, as sorted (name, count) pairs.
    node_selector: spec.nodeSelector as sorted (key, value) pairs.
    affinity: required node affinity: OR over terms, AND within a term (empty = none).
    """

    gpus: int = 0
    gpu_milli: int = WHOLE_GPU_MILLI
    gpu_models: frozenset[str] = frozenset()
    min_gpu_memory_mib: int = 0
    mig_profile: str | None = None
    mig_count: int = 0
    dra: tuple[DraRequest, ...] = ()
    cpu_milli: int = 0
    memory: int = 0
    extended: tuple[tuple[str, int], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[tuple[LabelRequirement, ...], ...] = ()

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.mig_count > 0 or bool(self.dra)

    @property
    def gpu_cost(self) -> float:
        """GPUs this replica consumes, counting a share as a fraction (MIG/DRA: not included)."""
        return self.gpus * self.gpu_milli / WHOLE_GPU_MILLI


@dataclass(frozen=True, slots=True)
class PodSet:
    """A group of identical replicas of a job (e.g. "workers", or a Ray "head")."""

    name: str
    count: int
    shape: PodShape


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A gang job as the placement core sees it.

    min_available: elastic gang: total replicas it may start with (None = all, gang is all-or-nothing).
      Shrinking removes replicas from the LAST pod set first, then earlier ones, never below 1 per set.
    required_level / preferred_level: TopologyLevels keys; required = all replicas in ONE domain of
      that level; preferred = span as few domains of that level as possible.
    allowed_*: empty = any. locality: data-locality hints (cluster or region names, best first).
    """

    job_id: str
    pod_sets: tuple[PodSet, ...]
    tenant: str = ""
    queue: str = ""
    priority: int = 0
    preemptible: bool = False
    min_available: int | None = None
    required_level: str | None = None
    preferred_level: str | None = None
    allowed_clusters: frozenset[str] = frozenset()
    allowed_regions: frozenset[str] = frozenset()
    allowed_roles: frozenset[str] = frozenset()
    locality: tuple[str, ...] = ()
    max_runtime_s: int | None = None

    @property
    def total_replicas(self) -> int:
        return sum(ps.count for ps in self.pod_sets)

    @property
    def min_replicas(self) -> int:
        """Fewest replicas the gang may start with."""
        if self.min_available is None:
            return self.total_replicas
        return max(min(self.min_available, self.total_replicas), len(self.pod_sets))


@dataclass(frozen=True, slots=True)
class TopologyLevels:
    """Ordered node label keys, broad to narrow, that define topology domains.

    The default: zone -> block -> rack -> NVLink clique -> hostname. Block and rack label keys
    differ per site; build with `TopologyLevels.default(block_label=..., rack_label=...)`.
    """

    keys: tuple[str, ...] = (ZONE_LABEL, DEFAULT_BLOCK_LABEL, DEFAULT_RACK_LABEL, CLIQUE_LABEL, HOSTNAME_LABEL)

    @classmethod
    def default(cls, *, block_label: str = DEFAULT_BLOCK_LABEL, rack_label: str = DEFAULT_RACK_LABEL) -> TopologyLevels:
        return cls((ZONE_LABEL, block_label, rack_label, CLIQUE_LABEL, HOSTNAME_LABEL))

    def index(self, level: str) -> int:
        """Position of a level key (raises ValueError when it is not configured)."""
        return self.keys.index(level)

    def path(self, labels: Mapping[str, str]) -> tuple[str | None, ...]:
        """A node's topology path from its labels: one value per level, None when missing."""
        return tuple(labels.get(k) for k in self.keys)
