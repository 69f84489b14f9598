"""NodeInventory protobuf -> core Node: the broker's one decoder of an agent's node facts.

The exact inverse of the agent's encoder (`extender.agent.encode.node_inventory`) for every field
of the core Node; what the core cannot represent is read conservatively (an unknown taint effect
is NoSchedule, a GPU whose MIG mode is pending or enabled without instances is unusable).
"""

from __future__ import annotations

from placement.errors import QuantityError
from placement.model import AttributeValue, DraDevice, DraVersion, Gpu, MigInstance, Node, Taint
from placement.podspec import GPU_RESOURCE
from placement.quantity import to_int_bytes
from tandem.v1 import inventory_pb2 as inv

__all__ = ["node_from_proto", "InventoryDecodeError"]

_EFFECT = {
    inv.TAINT_EFFECT_NO_SCHEDULE: "NoSchedule",
    inv.TAINT_EFFECT_PREFER_NO_SCHEDULE: "PreferNoSchedule",
    inv.TAINT_EFFECT_NO_EXECUTE: "NoExecute",
}


class InventoryDecodeError(ValueError):
    """A node record the core cannot take (e.g. a DRA capacity that is not a quantity)."""


def _gpus(n: inv.NodeInventory) -> tuple[Gpu, ...]:
    gpus = []
    for g in n.gpus:
        mig: tuple[MigInstance, ...] = ()
        if g.mig_mode == inv.MIG_MODE_ENABLED:
            mig = tuple(
                MigInstance(
                    m.profile,
                    m.gi_profile_id if m.HasField("gi_profile_id") else None,
                    m.placement_start,
                    m.placement_size,
                    m.in_use,
                )
                for m in g.mig_instances
            )
        healthy = (
            g.health != inv.GPU_HEALTH_UNHEALTHY
            and g.mig_mode != inv.MIG_MODE_PENDING_CHANGE
            and not (g.mig_mode == inv.MIG_MODE_ENABLED and not mig)
        )
        gpus.append(
            Gpu(
                index=g.index,
                model=g.model or n.gpu_model,
                memory_mib=g.memory_mib or n.gpu_memory_mib,
                milli_used=min(g.milli_in_use, 1000),
                mig=mig,
                healthy=healthy,
            )
        )
    if not gpus:
        # Count-only report: synthesise whole GPUs from the extended resource counts.
        total = int(n.extended_allocatable.get(GPU_RESOURCE, 0))
        free = int(n.extended_free.get(GPU_RESOURCE, 0))
        gpus = [
            Gpu(index=i, model=n.gpu_model, memory_mib=n.gpu_memory_mib, milli_used=0 if i < free else 1000)
            for i in range(total)
        ]
    return tuple(gpus)


def _attribute(v: inv.DeviceAttributeValue) -> AttributeValue | None:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "version_value":
        return DraVersion(v.version_value)
    return None  # unknown type: left out, so selectors reading it do not match (conservative)


def _dra(node: str, d: inv.DraDevice) -> DraDevice:
    attrs = {}
    for k, v in d.attributes.items():
        value = _attribute(v)
        if value is not None:
            attrs[k] = value
    try:
        caps = {k: to_int_bytes(q) for k, q in d.capacity.items()}
    except QuantityError as exc:
        raise InventoryDecodeError(f"node {node}: DRA device {d.driver}/{d.pool}/{d.name}: {exc}") from exc
    return DraDevice(d.driver, d.pool, d.name, attrs, caps, d.allocated)


def node_from_proto(n: inv.NodeInventory) -> Node:
    """The core Node of one reported node (raises InventoryDecodeError on a malformed record)."""
    return Node(
        name=n.name,
        labels=dict(n.labels),
        taints=tuple(Taint(t.key, t.value, _EFFECT.get(t.effect, "NoSchedule")) for t in n.taints),
        ready=n.ready,
        cordoned=n.unschedulable,
        cpu_milli_allocatable=n.allocatable.cpu_milli,
        cpu_milli_free=n.free.cpu_milli,
        memory_allocatable=n.allocatable.memory_bytes,
        memory_free=n.free.memory_bytes,
        pods_free=int(n.free.pods) if n.HasField("free") else 110,
        gpus=_gpus(n),
        extended_free={k: int(v) for k, v in n.extended_free.items() if k != GPU_RESOURCE},
        dra_devices=tuple(_dra(n.name, d) for d in n.dra_devices),
        topology=tuple(s.value if s.HasField("value") else None for s in n.topology_path.segments),
    )
