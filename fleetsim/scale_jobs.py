"""Scale mode's jobs: the job mix, its specs and steady submission to the broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from broker.launcher.client import BrokerClient, SubmitItem
from fleetsim.model import WorkItem
from fleetsim.scale_inventory import REPLICA_CPU_MILLI, REPLICA_GPUS, REPLICA_MEMORY
from fleetsim.wire_jobs import job_spec
from tandem.v1 import job_pb2

__all__ = [
    "DEFAULT_MIX",
    "JobKind",
    "Submission",
    "job_specs",
    "submit_steady",
]

# ----------------------------------------------------------------------------- jobs


@dataclass(frozen=True, slots=True)
class JobKind:
    label: str
    replicas: int
    level: str
    """Topology level every replica must share ("" = none)."""
    weight: float


DEFAULT_MIX = (
    JobKind("1 x 8 GPUs", 1, "", 0.6),
    JobKind("8 x 8 GPUs, one rack", 8, "rack", 0.3),
    JobKind("32 x 8 GPUs, one block", 32, "block", 0.1),
)


def job_specs(n: int, mix: Sequence[JobKind], tenant: str) -> list[tuple[JobKind, job_pb2.JobSpec]]:
    """`n` jobs in the mix's proportions, interleaved by smooth weighted round-robin (deterministic: the
    kinds arrive evenly spread, every kind early)."""
    total = sum(k.weight for k in mix)
    credit = [0.0] * len(mix)
    out = []
    for i in range(n):
        for j, k in enumerate(mix):
            credit[j] += k.weight
        j = max(range(len(mix)), key=lambda x: credit[x])
        credit[j] -= total
        kind = mix[j]
        item = WorkItem(
            f"scale-{i}",
            tenant,
            "gang" if kind.replicas > 1 else "batch",
            arrival_s=0.0,
            duration_s=0.0,
            replicas=kind.replicas,
            gpus=REPLICA_GPUS,
            cpu_milli=REPLICA_CPU_MILLI,
            memory_bytes=REPLICA_MEMORY,
            required_level=kind.level,
        )
        out.append((kind, job_spec(item)))
    return out


@dataclass(frozen=True, slots=True)
class Submission:
    index: int
    """Position in the submitted list."""
    job_id: str
    sent: float
    """time.monotonic() when its SubmitJobs call went out."""


async def submit_steady(
    client: BrokerClient, specs: Sequence[job_pb2.JobSpec], rate_per_s: float, job_set: str, tick_s: float = 0.05
) -> tuple[list[Submission], list[str]]:
    """Submit at `rate_per_s`: every tick one SubmitJobs call with the jobs whose time has come (calls overlap
    when the broker is slow, so the offered rate holds). Returns the accepted submissions and the refusals."""
    accepted: list[Submission] = []
    refused: list[str] = []
    calls: list[asyncio.Task[None]] = []

    async def call(first: int, batch: Sequence[job_pb2.JobSpec]) -> None:
        t = time.monotonic()
        items = [SubmitItem(f"{job_set}-{first + j}", s) for j, s in enumerate(batch)]
        for r in await client.submit(job_set, items):
            if r.job_id:
                accepted.append(Submission(first + r.index, r.job_id, t))
            else:
                refused.append(f"{r.key}: {r.error_message}")

    t0 = time.monotonic()
    done = 0
    loop = asyncio.get_running_loop()
    while done < len(specs):
        due = min(len(specs), int((time.monotonic() - t0) * rate_per_s) + 1)
        if due > done:
            calls.append(loop.create_task(call(done, specs[done:due])))
            done = due
        await asyncio.sleep(tick_s)
    await asyncio.gather(*calls)
    accepted.sort(key=lambda x: x.index)
    return accepted, refused
