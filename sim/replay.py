"""Placement-quality replay of a pod list on a cluster, per FGD's published protocol.

Arrivals only, no departures; a pod that fits nowhere is dropped (never
retried) but counts as arrived. After every pod the GPU allocation is logged and
summarised with FGD's discrete-column method (allocation vs arrived load, 0..130 %).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from placement.frag import TargetWorkload, typical_pods
from placement.gpuarrays import GPU_MILLI
from placement.scoring import choose_node, make_policy
from sim.trace import NodeTable, PodList, arrival_order

MAX_COLUMN = 130
SEEDS = tuple(range(42, 52))


@dataclass(frozen=True)
class RunResult:
    """One replay: per-event arrived/used GPU milli and the discrete allocation columns."""

    workload: str
    policy: str
    seed: int
    total_gpus: int
    pods: int
    failed: int
    seconds: float
    arrived: tuple[int, ...]
    used: tuple[int, ...]
    allocation: tuple[float | None, ...]  # column x = 0..130, GPU allocation ratio in %

    def column(self, x: int) -> float | None:
        return self.allocation[x]

    def unallocated_gpus(self, x: int = MAX_COLUMN) -> float | None:
        a = self.allocation[x]
        return None if a is None else self.total_gpus * (1 - a / 100)


def discrete_allocation(arrived: Sequence[int], used: Sequence[int], total_gpus: int) -> tuple[float | None, ...]:
    """FGD's merge_alloc_discrete: mean allocation of the events whose arrived load rounds to x."""
    a = [round(v / total_gpus / 10) for v in arrived]
    u = [round(v / total_gpus / 10, 2) for v in used]
    by_col: dict[int, list[float]] = {}
    for ai, ui in zip(a, u):
        by_col.setdefault(ai, []).append(ui)
    out: list[float | None] = []
    for x in range(MAX_COLUMN + 1):
        vals = by_col.get(x)
        if not vals:
            vals = [v for c in (x - 1, x, x + 1) for v in by_col.get(c, [])]
        out.append(round(sum(vals) / len(vals), 2) if vals else None)
    return tuple(out)


def replay(
    nodes: NodeTable,
    pods: PodList,
    policy_name: str,
    seed: int,
    workload: TargetWorkload | None = None,
) -> RunResult:
    """One run: seeded shuffle + tuning, node priority permutation, then place pods in order."""
    rng = np.random.default_rng(seed)
    rng.integers(2**62)  # FGD draws and discards one number before shuffling
    total_gpus = nodes.total_gpus
    order = arrival_order(pods, total_gpus * GPU_MILLI, rng)
    perm = rng.permutation(len(nodes.names))
    arrays = nodes.arrays(np.argsort(perm, kind="stable"))  # row = tie-break priority
    if workload is None:
        workload = typical_pods(pods.demands, with_memory=True)
    policy = make_policy(policy_name, workload=workload, rng=rng)
    arrived_log: list[int] = []
    used_log: list[int] = []
    arrived = used = failed = 0
    start = time.perf_counter()
    for demand in order:
        arrived += demand.total_gpu_milli
        row = choose_node(policy, arrays, demand, arrays.feasible(demand))
        if row is None:
            failed += 1
        else:
            arrays.place(row, demand, policy.select_gpus(arrays, row, demand))
            used += demand.total_gpu_milli
        arrived_log.append(arrived)
        used_log.append(used)
    seconds = time.perf_counter() - start
    return RunResult(
        pods.name,
        policy_name,
        seed,
        total_gpus,
        len(order),
        failed,
        seconds,
        tuple(arrived_log),
        tuple(used_log),
        discrete_allocation(arrived_log, used_log, total_gpus),
    )


def _run(args: tuple[NodeTable, PodList, str, int]) -> RunResult:
    nodes, pods, policy, seed = args
    return replay(nodes, pods, policy, seed)


def replay_many(
    nodes: NodeTable,
    pods: PodList,
    policies: Sequence[str],
    seeds: Sequence[int] = SEEDS,
    processes: int | None = None,
) -> list[RunResult]:
    """Every (policy, seed) pair, in parallel over processes; results in input order."""
    jobs = [(nodes, pods, p, s) for p in policies for s in seeds]
    workers = processes if processes is not None else min(len(jobs), multiprocessing.cpu_count())
    if workers <= 1 or len(jobs) == 1:
        return [_run(j) for j in jobs]
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return list(pool.map(_run, jobs))
