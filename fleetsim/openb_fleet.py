"""A fleet built from the Alibaba openb node list: its GPU nodes split by model into plausible clusters, with
made-up zones, blocks and racks (the trace has no topology)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetplan.catalog import Level
from fleetsim.fleet_schema import DEFAULT_LEVEL_KEYS
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, TenantSpec
from fleetsim.spec import check_fleet
from sim.trace import load_nodes

__all__ = ["alibaba_fleet"]

_OPENB_FAMILIES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("g2", ("G2",), "training"),
    ("g3", ("G3",), "training"),
    ("v100", ("V100M16", "V100M32"), "batch"),
    ("p100", ("P100",), "batch"),
    ("t4", ("T4", "A10"), "inference"),
)
"""Models that plausibly share a cluster, in an order where neighbours are alike (8-GPU G2/G3 nodes, then V100,
then the older P100, then the small inference boards): fewer clusters merge neighbours."""
_OPENB_GPU_MEMORY_MIB = {"P100": 16384, "V100M16": 16384, "V100M32": 32768, "T4": 15360, "A10": 23028}
"""The trace gives no GPU memory: the boards' nominal sizes (G1/G2/G3 are undisclosed: 0, unknown)."""
_OPENB_REGION = "openb"
_OPENB_TENANTS = (TenantSpec("research", 2.0), TenantSpec("product", 1.0), TenantSpec("analytics", 1.0))
_OPENB_LEVELS = tuple(Level(n, DEFAULT_LEVEL_KEYS[n]) for n in ("zone", "block", "rack"))


@dataclass
class _Part:
    """Nodes (trace row indices) bound for one cluster."""

    base: str
    role: str
    rows: list[int]
    gpus: int


def _dns(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def _rack_size(gpus_per_node: int) -> int:
    """Synthesised racks: about 32 GPUs each (power and cooling), at most 16 nodes."""
    return max(1, min(16, 32 // gpus_per_node))


def alibaba_fleet(node_csv_path: str | os.PathLike[str], clusters: int = 4, seed: int = 0) -> FleetSpec:
    """A fleet of `clusters` clusters from the openb node list (`sim.trace.load_nodes`), split by GPU model so
    each cluster is plausible; nodes without GPUs are skipped. The trace has no topology: zones, blocks and racks
    are made up (`synthesised_topology`). `seed` deals the nodes of a cluster that must be split in two."""
    path = Path(node_csv_path)
    table = load_nodes(path)
    rows = [i for i, n in enumerate(table.gpus) if n > 0]
    if not 1 <= clusters <= len(rows):
        raise ValueError(f"clusters must be 1..{len(rows)} (GPU nodes in {path}), not {clusters}")
    families = list(_OPENB_FAMILIES)
    known = {m for _, models, _ in families for m in models}
    for model in sorted({table.models[i] for i in rows} - known):  # another trace's models: one family each
        families.append((_dns(model), (model,), "batch"))
    parts: list[_Part] = []
    for base, models, role in families:
        mine = [i for i in rows if table.models[i] in models]
        if mine:
            parts.append(_Part(base, role, mine, sum(table.gpus[i] for i in mine)))
    while len(parts) > clusters:
        # the smallest merges into its smaller neighbour, which keeps the role of the bigger of the two
        i = min(range(len(parts)), key=lambda k: parts[k].gpus)
        j = min((k for k in (i - 1, i + 1) if 0 <= k < len(parts)), key=lambda k: parts[k].gpus)
        a, b = sorted((i, j))
        left, right = parts[a], parts[b]
        role = left.role if left.gpus >= right.gpus else right.role
        parts[a : b + 1] = [_Part(f"{left.base}-{right.base}", role, left.rows + right.rows, left.gpus + right.gpus)]
    rng = np.random.default_rng(seed)
    while len(parts) < clusters:
        i = max((k for k in range(len(parts)) if len(parts[k].rows) > 1), key=lambda k: parts[k].gpus)
        dealt = [parts[i].rows[int(k)] for k in rng.permutation(len(parts[i].rows))]
        halves = [sorted(dealt[: len(dealt) // 2]), sorted(dealt[len(dealt) // 2 :])]
        parts[i : i + 1] = [_Part(parts[i].base, parts[i].role, h, sum(table.gpus[r] for r in h)) for h in halves]
    specs = []
    bases = [p.base for p in parts]
    for p in parts:
        name = f"openb-{p.base}"
        if bases.count(p.base) > 1:
            name += f"-{bases[: parts.index(p)].count(p.base) + 1}"
        shapes: dict[tuple[str, int, int, int], int] = {}
        for r in p.rows:
            shape = (table.models[r], table.gpus[r], table.cpu_milli[r], table.mem_mib[r])
            shapes[shape] = shapes.get(shape, 0) + 1
        groups = tuple(
            NodeGroup(
                # the openb nodes hold whole cores and whole GiB
                name=_dns(f"{model}-{gpus}gpu-{cpu // 1000}c-{mem // 1024}g"),
                gpu_model=model,
                nodes=count,
                gpus_per_node=gpus,
                gpu_memory_mib=_OPENB_GPU_MEMORY_MIB.get(model, 0),
                cpu_cores=cpu // 1000,
                memory_gib=mem // 1024,
                nodes_per_rack=_rack_size(gpus),
                racks_per_block=8,
            )
            for (model, gpus, cpu, mem), count in sorted(shapes.items(), key=lambda s: (s[0][0], -s[0][1], s[0][2:]))
        )
        specs.append(ClusterSpec(name, _OPENB_REGION, p.role, _OPENB_LEVELS, groups))
    fleet = FleetSpec(f"alibaba-openb-{clusters}", tuple(specs), _OPENB_TENANTS, synthesised_topology=True)
    check_fleet(fleet, str(path))
    return fleet
