"""An Alibaba openb pod list as a fleet simulator workload: one item per pod, with the trace's own times where it
has them and synthesised ones (said in notes) where it has not."""

from __future__ import annotations

import csv
import math
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleetsim.domains import MIB
from fleetsim.model import WorkItem
from placement.gpuarrays import PodDemand
from sim.trace import parse_demand

__all__ = ["TRACE_INTERARRIVAL_S", "TRACE_MEDIAN_S", "TRACE_SIGMA", "alibaba_workload"]

# Synthetic times for pod lists without them (the multigpu* files): log-normal run times matched to the default
# list's observed lifetimes (p50 540 s, p90 6,574 s, data/traces/alibaba-gpu-v2023/README.md).
TRACE_MEDIAN_S = 540.0
TRACE_SIGMA = math.log(6574.0 / 540.0) / 1.2816
TRACE_INTERARRIVAL_S = 30.0

_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def _dns_label(raw: str, taken: set[str]) -> str:
    """A DNS-1123 label from a trace name, unique among `taken` (which it joins)."""
    base = _NOT_DNS.sub("-", raw.lower()).strip("-")[:56] or "pod"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def _time(row: Mapping[str, str | None], key: str) -> float | None:
    value = (row.get(key) or "").strip()
    return float(value) if value else None


def alibaba_workload(
    pod_csv_path: Path | str,
    *,
    tenants: Sequence[str],
    seed: int,
    limit: int | None = None,
    window_start_s: float | None = None,
    interarrival_s: float = TRACE_INTERARRIVAL_S,
    model_names: Mapping[str, str] | None = None,
) -> tuple[list[WorkItem], list[str]]:
    """One "trace" item per pod of an openb pod list (sorted by arrival), and notes on what was synthesised.

    Shapes come from `sim.trace.parse_demand` (the replay's parser): whole GPUs, the share of fractional pods, CPU,
    memory and the allowed models (`gpu_spec`, renamed through `model_names` when given).

    Times, where the list has them: arrival = `creation_time` − `window_start_s` (default: the earliest creation);
    duration = `deletion_time` − `scheduled_time`. Pods created before `window_start_s` arrive at 0 with the run time
    they have left. Pods the trace never scheduled (Pending) get a run time drawn from the scheduled pods' run times.
    A list without creation times gets Poisson arrivals (mean `interarrival_s`) in a seeded shuffle of its pods, and
    rows without deletion times a log-normal run time (median 540 s, p90 6,574 s: the default list's lifetimes).
    Tenants are assigned by a hash of the pod name over `tenants`. `limit` keeps the first pods by arrival.
    """
    if not tenants:
        raise ValueError("alibaba_workload needs at least one tenant")
    path = Path(pod_csv_path)
    with path.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["name"])
    rng = random.Random(seed)
    notes: list[str] = []
    renames = model_names or {}

    creations = [_time(r, "creation_time") for r in rows]
    origin = 0.0
    real_arrivals = bool(rows) and all(c is not None for c in creations)
    if real_arrivals:
        origin = window_start_s if window_start_s is not None else min(c for c in creations if c is not None)
        order = sorted(range(len(rows)), key=lambda i: (creations[i] or 0.0, rows[i]["name"]))
    else:
        order = list(range(len(rows)))
        rng.shuffle(order)
        notes.append(
            f"{path.name}: no creation times; arrivals synthesised as a Poisson process (mean interarrival "
            f"{interarrival_s:g} s) over a seeded shuffle of the pods (seed {seed})."
        )

    observed = [
        d - s
        for r in rows
        if (s := _time(r, "scheduled_time")) is not None and (d := _time(r, "deletion_time")) is not None and d >= s
    ]
    taken: set[str] = set()
    items: list[WorkItem] = []
    pending = synthetic = censored = started_early = ended_early = 0
    cache: dict[PodDemand, PodDemand] = {}
    arrival_s = 0.0
    for i in order:
        if limit is not None and len(items) >= limit:
            break
        row = rows[i]
        scheduled, deleted = _time(row, "scheduled_time"), _time(row, "deletion_time")
        if real_arrivals:
            arrival_s = (creations[i] or 0.0) - origin
            if deleted is not None and deleted <= origin:
                ended_early += 1  # gone before the window opens
                continue
        else:
            arrival_s += rng.expovariate(1.0 / interarrival_s)
        demand = parse_demand(row, cache)
        if scheduled is not None and deleted is not None and deleted >= scheduled:
            # A pod already running when the window opens only has the rest of its run time left.
            duration_s = deleted - max(scheduled, origin) if real_arrivals else deleted - scheduled
            censored += (row.get("pod_phase") or "") == "Running"
        elif deleted is not None and observed:
            duration_s = rng.choice(observed)
            pending += 1
        else:
            duration_s = rng.lognormvariate(math.log(TRACE_MEDIAN_S), TRACE_SIGMA)
            synthetic += 1
        if arrival_s < 0:
            started_early += 1
            arrival_s = 0.0
        gpu_count = demand.gpu_count
        items.append(
            WorkItem(
                name=_dns_label(row["name"], taken),
                tenant=tenants[zlib.crc32(row["name"].encode()) % len(tenants)],
                kind="trace",
                arrival_s=arrival_s,
                duration_s=max(duration_s, 1.0),
                replicas=1,
                gpus=gpu_count,
                gpu_milli=demand.gpu_milli if gpu_count else 1000,
                cpu_milli=demand.cpu_milli,
                memory_bytes=demand.mem_mib * MIB,
                gpu_models=tuple(sorted(renames.get(m, m) for m in demand.models)),
            )
        )
    items.sort(key=lambda it: (it.arrival_s, it.name))

    if pending:
        notes.append(
            f"{path.name}: {pending} pods were never scheduled in the trace (Pending); their run times were "
            f"drawn from the {len(observed)} scheduled pods' run times (seed {seed})."
        )
    if synthetic:
        notes.append(
            f"{path.name}: {synthetic} pods have no deletion time; durations synthesised as log-normal "
            f"(median {TRACE_MEDIAN_S:g} s, p90 6574 s, as the default list's lifetimes; seed {seed})."
        )
    if censored:
        notes.append(
            f"{path.name}: {censored} pods were still Running when the trace snapshot ends; their "
            f"durations stop there (censored)."
        )
    if started_early:
        notes.append(
            f"{path.name}: {started_early} pods were created before the window start; they arrive at 0 with "
            f"the run time they had left."
        )
    if ended_early:
        notes.append(f"{path.name}: {ended_early} pods ended before the window start and were left out.")
    return items, notes
