"""Loading the Alibaba GPU trace (FGD's openb CSVs) and FGD's workload tuning to a target load."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placement.gpuarrays import GPU_MILLI, GpuArrays, PodDemand

TRACE_DIR_NAME = "alibaba-gpu-v2023"
NODE_LIST = "openb_node_list_gpu_node.csv"
EXPECTED_RESULTS = "fgd-expected-results/analysis_allo_discrete.csv"
TUNE_RATIO = 1.3


def trace_dir() -> Path:
    """The trace as committed in the repository: `data/traces/alibaba-gpu-v2023/` (source and
    licence in its README). Found from this file, so it needs a checkout (an editable install);
    with an installed wheel, pass the CSV paths to `tandem-replay` instead."""
    return Path(__file__).resolve().parents[1] / "data" / "traces" / TRACE_DIR_NAME


@dataclass(frozen=True)
class NodeTable:
    """The cluster as loaded: nodes sorted by name."""

    names: tuple[str, ...]
    cpu_milli: tuple[int, ...]
    mem_mib: tuple[int, ...]
    gpus: tuple[int, ...]
    models: tuple[str, ...]

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus)

    def arrays(self, order: np.ndarray | None = None) -> GpuArrays:
        """Empty-cluster arrays, rows in `order` (default: name order)."""
        idx = range(len(self.names)) if order is None else [int(i) for i in order]
        return GpuArrays.from_nodes(
            [self.names[i] for i in idx],
            [self.cpu_milli[i] for i in idx],
            [self.mem_mib[i] for i in idx],
            [self.gpus[i] for i in idx],
            [self.models[i] for i in idx],
        )


@dataclass(frozen=True)
class PodList:
    """A pod list sorted by name (FGD's `W`); demands are interned so equal pods share one object."""

    name: str
    names: tuple[str, ...]
    demands: tuple[PodDemand, ...]


def load_nodes(path: Path) -> NodeTable:
    with path.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["sn"])
    return NodeTable(
        tuple(r["sn"] for r in rows),
        tuple(int(r["cpu_milli"]) for r in rows),
        tuple(int(r["memory_mib"]) for r in rows),
        tuple(int(r["gpu"]) for r in rows),
        tuple(r.get("model") or "" for r in rows),
    )


def parse_demand(row: dict[str, str], cache: dict[PodDemand, PodDemand]) -> PodDemand:
    k = int(row.get("num_gpu") or 0)
    g = min(int(row.get("gpu_milli") or 0), GPU_MILLI) if k > 0 else 0
    spec = (row.get("gpu_spec") or "").strip()
    demand = PodDemand(
        cpu_milli=int(row["cpu_milli"]),
        mem_mib=int(row.get("memory_mib") or 0),
        gpu_count=k if g > 0 else 0,
        gpu_milli=g,
        models=frozenset(s for s in spec.split("|") if s) if k > 0 else frozenset(),
    )
    return cache.setdefault(demand, demand)


def load_pods(path: Path) -> PodList:
    cache: dict[PodDemand, PodDemand] = {}
    with path.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["name"])
    name = path.stem.removeprefix("openb_pod_list_")
    return PodList(name, tuple(r["name"] for r in rows), tuple(parse_demand(r, cache) for r in rows))


def arrival_order(
    pods: PodList, capacity_milli: int, rng: np.random.Generator, ratio: float = TUNE_RATIO
) -> list[PodDemand]:
    """Shuffle, then tune the list to `ratio` x capacity of GPU request, as FGD does.

    Down: drop random pods from the shuffled list (survivors keep their order).
    Up: append clones drawn with replacement from the name-sorted list until the
    next clone's per-GPU milli would cross the target.
    """
    base = pods.demands
    shuffled = [base[int(i)] for i in rng.permutation(len(base))]
    total = sum(d.total_gpu_milli for d in shuffled)
    target = ratio * capacity_milli
    if total > target:
        while total > target:
            total -= shuffled.pop(int(rng.integers(len(shuffled)))).total_gpu_milli
        return shuffled
    if not any(d.gpu_milli for d in base):
        return shuffled  # nothing could ever reach the target
    while True:
        clone = base[int(rng.integers(len(base)))]
        if total + clone.gpu_milli > target:
            return shuffled
        total += clone.total_gpu_milli
        shuffled.append(clone)
