"""Workloads for the fleet simulator: a synthetic training mix shaped to a fleet, and a flood of preemptible work
before it.

`training_mix` offers, per GPU-hour, what the fleet's hardware can carry (the shapes: `fleetsim.mix_shapes`): gangs
of whole 8-GPU pods that require one rack (or, when too large for any rack, one block); on clusters with NVLink
cliques (GB200-style 4-GPU trays), gangs of whole trays that require one clique; elastic gangs; MIG inference pods on
MIG nodes; and small batch pods. Every gang shape it emits fits, at its required level, in one domain of some empty
cluster. `flood_then_mix` puts one tenant's flood of long preemptible work before it.

The Alibaba openb pod lists are read by `fleetsim.openb_workload`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Collection, Sequence

from fleetsim.mix_shapes import mix_kinds
from fleetsim.model import FleetSpec, WorkItem

__all__ = ["MIN_DURATION_S", "PREEMPTIBLE_KINDS", "expected_gpu_hours", "flood_then_mix", "training_mix"]

MIN_DURATION_S = 60.0
"""Shorter draws are raised to this (≈ 0.15 % of batch draws, fewer of the others)."""

PREEMPTIBLE_KINDS = frozenset({"elastic", "batch"})
"""The kinds that checkpoint or are short: what a flood is made of (`flood_then_mix`), and what `training_mix`
submits preemptible when asked to (they may then borrow beyond quota, and be preempted)."""


def expected_gpu_hours(items: Sequence[WorkItem]) -> float:
    """Offered GPU-hours of a workload: each item's GPU cost times its duration."""
    return sum(i.gpu_cost * i.duration_s for i in items) / 3600.0


def training_mix(
    fleet: FleetSpec, *, hours: float, load: float, seed: int, preemptible_kinds: Collection[str] = ()
) -> list[WorkItem]:
    """A synthetic training workload for `fleet`, arriving over `hours` simulated hours, sorted by arrival.

    Kinds (`WorkItem.kind`):
    - "gang": 2–64 pods x 8 GPUs, requiring one rack, or one block when no rack of any cluster holds them;
      on clusters with an NVLink clique level (named "clique" or "nvlink", or keyed `nvidia.com/gpu.clique`; the item
      asks for that name), gangs of 2–18 whole trays (e.g. 4-GPU GB200 trays) requiring one clique, limited to that
      model; shapes no empty cluster's domain holds are never emitted;
    - "elastic": 4–32 such pods that may start with half (`min_replicas` = replicas // 2);
    - "inference": one pod with 1–2 MIG `1g.10gb` slices on the A100 MIG models (only when the fleet has MIG nodes);
    - "batch": one pod with 1–2 whole GPUs of any model.
    Items of `preemptible_kinds` (e.g. `PREEMPTIBLE_KINDS`) are submitted preemptible; by default none is.
    Every item declares a max runtime (`declared_max_runtime`: 1.5 x its run, in quarter hours).

    Shares of the offered GPU-hours: inference gets the MIG GPUs' fraction of the fleet (so MIG nodes are as loaded as
    the rest); of the remainder batch gets 15 % and gangs 85 %, split between clique gangs and rack/block gangs in
    proportion to the GPUs that can run each, and the rack/block part 70 : 30 between fixed and elastic gangs. A kind
    the fleet cannot run gives its share to the others. Per-pod CPU and memory are 75 % (training) or 50 % (small
    pods, at most 8 cores and 64 GiB per GPU) of the per-GPU share of the smallest node that can run the shape.

    Durations are log-normal: training median 30 min (sigma 0.6, mean ≈ 36 min), inference median 12 min (sigma 0.5),
    batch median 8 min (sigma 0.7), never under 1 min. Arrivals are one Poisson process whose rate makes the expected
    offered GPU-hours `load` x fleet GPUs x `hours` (MIG slices count 1/7 GPU); the kind of each arrival is drawn in
    proportion to its rate, the tenant in proportion to its weight. Deterministic per `seed`.
    """
    if hours <= 0 or load <= 0:
        raise ValueError("hours and load must be positive")
    tenants = [t for t in fleet.tenants if t.weight > 0]
    if not tenants:
        raise ValueError(f"fleet {fleet.name!r} has no tenant with a positive weight")
    kinds = mix_kinds(fleet) if fleet.gpus > 0 else []
    if not kinds:
        raise ValueError(f"fleet {fleet.name!r} can run none of the mix's shapes")
    # The share that kinds the fleet cannot run would have had goes to the others in proportion.
    total_share = sum(k.share for k in kinds)
    rates = [load * fleet.gpus * k.share / total_share / k.mean_gpu_seconds for k in kinds]
    rate = sum(rates)

    rng = random.Random(seed)
    tenant_names = [t.name for t in tenants]
    tenant_weights = [t.weight for t in tenants]
    horizon_s = hours * 3600.0
    items: list[WorkItem] = []
    arrival_s = rng.expovariate(rate)
    while arrival_s < horizon_s:
        kind = rng.choices(kinds, weights=rates)[0]
        template = rng.choices(kind.templates, weights=[t.weight for t in kind.templates])[0]
        tenant = rng.choices(tenant_names, weights=tenant_weights)[0]
        duration_s = max(rng.lognormvariate(math.log(kind.median_s), kind.sigma), MIN_DURATION_S)
        name = f"{template.kind}-{len(items):06d}"
        items.append(
            template.item(
                name, tenant, round(arrival_s, 3), round(duration_s, 3), preemptible=template.kind in preemptible_kinds
            )
        )
        arrival_s += rng.expovariate(rate)
    return items


def flood_then_mix(
    fleet: FleetSpec,
    *,
    hours: float,
    load: float,
    seed: int,
    flood_tenant: str = "",
    flood_hours: float = 0.25,
    flood_median_s: float = 3 * 3600.0,
) -> list[WorkItem]:
    """The case preemption exists for: one tenant fills the fleet with long preemptible work, then everyone's
    usual work arrives (`training_mix` over the other tenants, `hours` at `load`).

    The flood: the mix's preemptible kinds (elastic gangs and batch pods, sizes and shares as in the mix) from
    `flood_tenant` (default: the lowest-weight tenant, first by name), all preemptible, arriving as a Poisson process over the first
    `flood_hours` with enough offered GPU-seconds to hold every GPU for the flood's median duration
    (log-normal, median `flood_median_s`, sigma 0.3). Names start with "flood-". The others' work is not
    preemptible: they are the owners coming back. Deterministic per `seed`."""
    tenants = sorted(fleet.tenants, key=lambda t: (t.weight, t.name))
    if len(tenants) < 2:
        raise ValueError("a flood needs another tenant to arrive after it")
    flooder = flood_tenant or tenants[0].name
    if flooder not in {t.name for t in tenants}:
        raise ValueError(f"unknown flood tenant {flooder!r}")
    kinds = [k for k in mix_kinds(fleet) if k.templates and k.templates[0].kind in PREEMPTIBLE_KINDS]
    if not kinds:
        raise ValueError(f"fleet {fleet.name!r} runs none of the preemptible kinds")
    rng = random.Random(seed * 7919 + 1)
    shares = [k.share for k in kinds]
    mean_cost = sum(
        sh * sum(t.weight * t.gpu_cost for t in k.templates) / sum(t.weight for t in k.templates)
        for sh, k in zip(shares, kinds)
    ) / sum(shares)
    count = max(1, round(fleet.gpus / mean_cost))
    items: list[WorkItem] = []
    for n in range(count):
        kind = rng.choices(kinds, weights=shares)[0]
        template = rng.choices(kind.templates, weights=[t.weight for t in kind.templates])[0]
        arrival = rng.uniform(0.0, flood_hours * 3600.0)
        duration = max(rng.lognormvariate(math.log(flood_median_s), 0.3), MIN_DURATION_S)
        items.append(
            template.item(
                f"flood-{template.kind}-{n:05d}", flooder, round(arrival, 3), round(duration, 3), preemptible=True
            )
        )
    others = dataclasses.replace(fleet, tenants=tuple(t for t in fleet.tenants if t.name != flooder))
    rest = [
        dataclasses.replace(i, arrival_s=round(i.arrival_s + flood_hours * 3600.0, 3))
        for i in training_mix(others, hours=hours, load=load, seed=seed)
    ]
    return sorted(items + rest, key=lambda i: (i.arrival_s, i.name))
