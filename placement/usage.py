"""GPU cost of an allocation per GPU model (MIG as fractions), so quotas charge the model a job really got."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from placement import mig
from placement.allocation import Allocation
from placement.model import WHOLE_GPU_MILLI, DraDevice, Node, PodShape
from placement.podspec import mig_profile_of

__all__ = ["UNKNOWN_MODEL", "mig_fraction", "mig_gpus", "shape_gpus", "allocation_usage", "merge_usage"]

UNKNOWN_MODEL = "unknown"
"""Model name charged when the inventory does not say which GPU it is."""


def mig_fraction(profile: str, model: str | None) -> float:
    """Share of a whole GPU that one MIG instance is: compute slices / slices of the GPU.

    Falls back to the "<g>g." prefix over 7 when the profile cannot be resolved for the model.
    """
    return mig_gpus(profile, model, 1)


def mig_gpus(profile: str, model: str | None, count: float) -> float:
    """GPUs that `count` instances of `profile` on a `model` GPU amount to: count x compute slices /
    slices of the GPU (7, or 4 on A30-class GPUs), as `mig_fraction` for one instance.

    `count` x slices is divided once, so N instances cost exactly N/7 of a GPU per compute slice.
    Unresolved profiles: the "<g>g." prefix over 7, else a whole GPU each.
    """
    cls = mig.profile_class(profile, model)
    if cls is not None:
        return count * cls.compute / (4 if cls.total_slices == 4 else 7)
    head = profile.split("g.", 1)[0]
    return count * int(head) / 7 if head.isascii() and head.isdigit() else float(count)


def shape_gpus(shape: PodShape) -> float:
    """GPUs one replica of `shape` holds: whole GPUs, shares as fractions, MIG instances as `mig_gpus` counts them
    (on the shape's GPU model when it names exactly one); DRA devices are not included."""
    mig_part = 0.0
    if shape.mig_profile and shape.mig_count:
        model = next(iter(shape.gpu_models)) if len(shape.gpu_models) == 1 else None
        mig_part = mig_gpus(shape.mig_profile, model, shape.mig_count)
    return shape.gpu_cost + mig_part


def _dra_cost(device: DraDevice) -> tuple[str, float]:
    model = device.attribute("productName")
    name = str(model) if model is not None else UNKNOWN_MODEL
    if device.attribute("type") == "mig":
        profile = device.attribute("profile")
        return name, mig_fraction(str(profile), name) if profile is not None else 1.0
    return name, 1.0


def allocation_usage(node: Node, allocation: Allocation) -> dict[str, float]:
    """GPUs taken by `allocation` on `node` (the node BEFORE the allocation or after: device
    identities do not change), per model: whole GPUs as 1, shares as milli/1000, MIG instances
    as fractions, DRA devices by their productName."""
    out: dict[str, float] = {}
    by_index = {g.index: g for g in node.gpus}
    default_model = node.gpu_model or UNKNOWN_MODEL
    for idx, milli in allocation.gpus:
        g = by_index.get(idx)
        model = g.model if g is not None else default_model
        out[model] = out.get(model, 0.0) + milli / WHOLE_GPU_MILLI
    for idx, start in allocation.mig:
        g = by_index.get(idx)
        if g is None:
            continue
        for inst in g.mig:
            if inst.start == start:
                out[g.model] = out.get(g.model, 0.0) + mig_fraction(inst.profile, g.model)
                break
    for name, amount in allocation.extended:
        profile = mig_profile_of(name)
        if profile is not None:
            out[default_model] = out.get(default_model, 0.0) + amount * mig_fraction(profile, node.gpu_model)
    if allocation.dra:
        devices = {d.key: d for d in node.dra_devices}
        for key in allocation.dra:
            dev = devices.get(key)
            if dev is None:
                continue
            model, cost = _dra_cost(dev)
            out[model] = out.get(model, 0.0) + cost
    return out


def merge_usage(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Sum several per-model usages."""
    out: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out
