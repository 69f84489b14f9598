"""Every refusal the placement core can give, as one enum that knows its code, message and fixability."""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["Reason"]


class Reason(enum.Enum):
    """Why a node, a domain or a cluster cannot take a request.

    Each member carries:
    * ``value`` / ``code``: a stable CamelCase code (safe for metrics, protobuf and APIs);
    * ``preemptible``: True when evicting lower-priority pods could make the request fit
      (the extender reports those nodes in ``FailedNodes``; the others go in
      ``FailedAndUnresolvableNodes`` so kube-scheduler does not try to preempt there);
    * ``template``: a human message, formatted with ``str.format`` keywords by ``message()``.
      Templates name only what they need; missing keywords render as ``?``.
    """

    # --- node state -----------------------------------------------------------
    NOT_READY = ("NotReady", False, "node {node} is not Ready")
    CORDONED = ("Cordoned", False, "node {node} is cordoned (unschedulable)")
    TAINT_NOT_TOLERATED = ("TaintNotTolerated", False, "node {node} has taint {taint} that the pod does not tolerate")
    NODE_SELECTOR_MISMATCH = (
        "NodeSelectorMismatch",
        False,
        "node {node} does not match the pod's node selector/affinity ({detail})",
    )
    # --- GPUs -----------------------------------------------------------------
    NO_GPU = ("NoGpu", False, "node {node} has no GPU")
    GPU_MODEL_MISMATCH = ("GpuModelMismatch", False, "node {node} has GPU model {have}, pod wants {want}")
    GPU_MEMORY_TOO_SMALL = (
        "GpuMemoryTooSmall",
        False,
        "node {node} GPUs have {have} MiB, pod needs {want} MiB per GPU",
    )
    GPU_COUNT_TOO_LARGE = ("GpuCountTooLarge", False, "node {node} has {have} GPUs in all, pod needs {want}")
    INSUFFICIENT_GPUS = ("InsufficientGpus", True, "node {node} has {have} free GPUs, pod needs {want}")
    INSUFFICIENT_GPU_SHARE = (
        "InsufficientGpuShare",
        True,
        "node {node} has no GPU with {want}/1000 share free (best {have}/1000)",
    )
    NO_MIG_PROFILE = ("NoMigProfile", False, "node {node} offers no MIG instances of profile {want}")
    INSUFFICIENT_MIG = (
        "InsufficientMig",
        True,
        "node {node} has {have} free MIG {profile} instances, pod needs {want}",
    )
    # --- DRA ------------------------------------------------------------------
    DRA_CLASS_UNKNOWN = ("DraClassUnknown", False, "device class {want} is not known")
    NO_DRA_DEVICES = ("NoDraDevices", False, "node {node} has no DRA device matching class {want}")
    INSUFFICIENT_DRA_DEVICES = (
        "InsufficientDraDevices",
        True,
        "node {node} has {have} free DRA devices matching {want}, pod needs {need}",
    )
    DRA_SELECTOR_ERROR = ("DraSelectorError", False, "node {node}: device selector failed to evaluate ({detail})")
    # --- plain resources ------------------------------------------------------
    INSUFFICIENT_CPU = ("InsufficientCpu", True, "node {node} has {have}m CPU free, pod needs {want}m")
    INSUFFICIENT_MEMORY = ("InsufficientMemory", True, "node {node} has {have} memory free, pod needs {want}")
    INSUFFICIENT_EXTENDED = (
        "InsufficientExtendedResource",
        True,
        "node {node} has {have} {resource} free, pod needs {want}",
    )
    TOO_MANY_PODS = ("TooManyPods", True, "node {node} has room for no more pods")
    # --- reservations, gangs, topology ----------------------------------------
    RESERVED_FOR_GANG = ("ReservedForGang", False, "node {node} capacity is reserved for gang {gang}")
    NOT_ASSIGNED_TO_GANG = ("NotAssignedToGang", False, "node {node} is not among the nodes assigned to gang {gang}")
    DOMAIN_TOO_SMALL = (
        "DomainTooSmall",
        True,
        "{level} {domain} holds room for {have} replicas of gang {gang}, needs {want} ({gpus} GPUs free there)",
    )
    NO_FEASIBLE_NODE = ("NoFeasibleNode", True, "no node can hold any replica of gang {gang} ({detail})")
    UNKNOWN_TOPOLOGY_LEVEL = (
        "UnknownTopologyLevel",
        False,
        "topology level {level} is not configured (levels: {detail})",
    )
    INVALID_REQUEST = ("InvalidRequest", False, "request is invalid: {detail}")
    # --- clusters (broker ranking) --------------------------------------------
    CLUSTER_NOT_ALLOWED = ("ClusterNotAllowed", False, "cluster {cluster} is not allowed for this job")
    REGION_NOT_ALLOWED = (
        "RegionNotAllowed",
        False,
        "cluster {cluster} is in region {region}, not allowed for this job",
    )
    ROLE_NOT_ALLOWED = ("RoleNotAllowed", False, "cluster {cluster} has role {role}, not allowed for this job")
    CLUSTER_STALE = ("ClusterStale", False, "cluster {cluster} has not reported recently")
    CLUSTER_CORDONED = ("ClusterCordoned", False, "cluster {cluster} is cordoned")

    def __init__(self, code: str, preemptible: bool, template: str) -> None:
        self.code = code
        self.preemptible = preemptible
        self.template = template

    def __repr__(self) -> str:
        return f"<Reason.{self.name}>"

    def message(self, **fields: object) -> str:
        """The human message with ``fields`` filled in (unknown keywords are shown as '?')."""
        return self.template.format_map(_Lenient(fields))

    @classmethod
    def from_code(cls, code: str) -> Reason:
        """Look a member up by its stable code (raises KeyError when unknown)."""
        return _BY_CODE[code]


class _Lenient(dict[str, object]):
    """Format map that renders a missing keyword as '?' instead of raising."""

    def __missing__(self, key: str) -> object:
        return "?"


_BY_CODE: Mapping[str, Reason] = {r.code: r for r in Reason}
