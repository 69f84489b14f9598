"""Scale mode (FLEET-NOTES S-5): many clusters as synthetic agents in one process, the real broker in its own.

No API servers and no extenders. Each synthetic agent speaks `ClusterService.Connect` over mutual TLS with
the real agent's stream (`extender.agent.stream`) and message builders (`extender.agent.wire`): a Hello with
its cluster name, region, role, topology levels and tenant namespaces; a full inventory snapshot; deltas
when pods bind or finish; heartbeats. It accepts every Dispatch, reports the pods gated, then bound and
running after the broker's Start, and after a while succeeded, so capacity frees again.

Inventories are recorded, not invented: real-format Node objects (the HGX H100 node of
tests/fixtures/cluster.json, renamed, with rack and block labels) go once through the extender's own
`Inventory` and the agent's encoder with the default label allow-list (A-21). The encoded NodeInventory
bytes, free and with one 8-GPU pod bound, are replayed for every cluster with only the cluster part of the
node names rewritten.

Measured on the broker process: CPU (/proc/<pid>/stat), RSS (/proc/<pid>/status VmRSS) and the Prometheus
histograms it serves (`tandem_broker_decision_seconds`, `tandem_broker_time_to_placement_seconds`).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.launcher.client import BrokerClient
from fleetsim.broker_process import BrokerEndpoint, BrokerProcess, tenancy_policy
from fleetsim.model import TenantSpec
from fleetsim.processes import free_port, wait_for
from fleetsim.scale_agent import AGENT_VERSION, FleetTally, Placement, SyntheticAgent
from fleetsim.scale_inventory import FIXTURE, REPLICA_CPU_MILLI, FleetLayout, RecordedInventory, record_inventory
from fleetsim.scale_jobs import DEFAULT_MIX, JobKind, Submission, job_specs, submit_steady
from fleetsim.scale_metrics import (
    EMPTY_HISTOGRAM,
    Histogram,
    histogram,
    machine_busy_s,
    percentile,
    process_cpu_s,
    process_peak_rss_bytes,
    process_rss_bytes,
    scrape_metrics,
)
from tandem.v1 import job_pb2

__all__ = [
    "AGENT_VERSION",
    "DEFAULT_MIX",
    "FIXTURE",
    "FleetLayout",
    "FleetTally",
    "Histogram",
    "JobKind",
    "Phase",
    "PhaseResult",
    "Placement",
    "REPLICA_CPU_MILLI",
    "RecordedInventory",
    "ScaleBroker",
    "ScaleResult",
    "Submission",
    "SyntheticAgent",
    "SyntheticFleet",
    "connect_fleet",
    "histogram",
    "job_specs",
    "machine_busy_s",
    "percentile",
    "process_cpu_s",
    "process_peak_rss_bytes",
    "process_rss_bytes",
    "record_inventory",
    "run_scale",
    "scrape_metrics",
    "start_broker",
    "submit_steady",
]

ADMIN = "scale-admin"
DECISION_METRIC = "tandem_broker_decision_seconds"
PLACEMENT_METRIC = "tandem_broker_time_to_placement_seconds"


@dataclass
class SyntheticFleet:
    agents: list[SyntheticAgent]
    tally: FleetTally
    connect_s: float
    """First Hello until the broker listed every cluster connected with all its nodes."""

    async def close(self) -> None:
        await asyncio.gather(*(a.close() for a in self.agents))


async def _until_listed(admin: BrokerClient, layout: FleetLayout, timeout_s: float, every_s: float = 0.2) -> None:
    """Until ListClusters shows every cluster connected, fresh, with all its nodes (polled gently: each call
    is broker work inside the measured connect)."""
    wanted = set(layout.cluster_names())
    deadline = time.monotonic() + timeout_s
    while True:
        listed = await admin.list_clusters()
        if {c.name for c in listed.clusters if c.connected and not c.stale and c.nodes == layout.nodes} >= wanted:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every cluster was listed with its {layout.nodes} nodes in {timeout_s:g} s")
        await asyncio.sleep(every_s)


async def connect_fleet(
    recorded: RecordedInventory,
    broker: BrokerEndpoint,
    admin: BrokerClient,
    *,
    run_seconds: tuple[float, float] = (10.0, 20.0),
    parallel: int = 16,
    coalesce_s: float = 0.15,
    seed: int = 0,
    timeout_s: float = 300.0,
) -> SyntheticFleet:
    """Connect one synthetic agent per cluster of the layout (`parallel` handshakes and snapshots at a time),
    each with a client certificate naming its cluster; returns once the broker (asked through `admin`) lists
    every cluster connected, fresh, with all its nodes."""
    layout = recorded.layout
    tally = FleetTally()
    rng = random.Random(seed)
    agents = [
        SyntheticAgent(
            name, recorded, tally, run_seconds=run_seconds, coalesce_s=coalesce_s, rng=random.Random(rng.random())
        )
        for name in layout.cluster_names()
    ]
    certs = {a.name: broker.pki.issue(a.name) for a in agents}  # outside the timed part
    gate = asyncio.Semaphore(parallel)

    async def one(agent: SyntheticAgent) -> None:
        async with gate:
            cert, key = certs[agent.name]
            await agent.connect(broker.agent_addr, cert, key, broker.pki.ca_file)

    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(one(a) for a in agents)), timeout_s)
        await _until_listed(admin, layout, timeout_s)
    except BaseException:
        await asyncio.gather(*(a.close() for a in agents))
        raise
    return SyntheticFleet(agents, tally, time.perf_counter() - t0)


# ----------------------------------------------------------------------------- the broker and the run


@dataclass
class ScaleBroker:
    process: BrokerProcess
    metrics_url: str
    token: str

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    async def metrics(self) -> str:
        return await asyncio.to_thread(scrape_metrics, self.metrics_url)


async def start_broker(tmp: Path, layout: FleetLayout, **config: Any) -> ScaleBroker:
    """The real broker as its own process (`python -m broker.main --config broker.yaml`): agents' mutual-TLS
    listener, SQLite store, metrics on a free port, one tenant for the scale jobs."""
    tokens = {layout.tenant: f"{layout.tenant}-token", ADMIN: "admin-token"}
    policy = tenancy_policy([TenantSpec(layout.tenant, namespace=layout.namespace)], tokens, tokens[ADMIN])
    for t in policy["tenants"]:  # submissions come in bursts of a tick's worth
        t["rate_limit"] = {"rate_per_s": 100_000, "burst": 100_000}
    port = free_port()
    process = BrokerProcess(
        tmp, policy, tokens, admin=ADMIN, **{"metrics_port": port, "heartbeat_interval_s": 5.0, **config}
    )
    await process.start()
    return ScaleBroker(process, f"http://127.0.0.1:{port}/metrics", tokens[layout.tenant])


@dataclass(frozen=True, slots=True)
class Phase:
    """`jobs` of the mix submitted at a steady `rate_per_s`."""

    jobs: int
    rate_per_s: float


@dataclass
class PhaseResult:
    """One phase's measurements (times in seconds, from its first submission)."""

    phase: Phase
    submit_s: float = 0.0
    placed: int = 0
    place_window_s: float = 0.0
    """Until the phase's last job's first dispatch reached its cluster."""
    agents_cpu_s: float = 0.0
    """CPU of this process (the synthetic agents and the submitting client) over the placement window."""
    others_cpu_s: float = 0.0
    """CPU the rest of the machine used over the placement window (other processes compete for the cores)."""
    place_cpu_s: float = 0.0
    """Broker CPU over the placement window (submissions, decisions, commits, dispatches, the agents' replies
    and reports, and the ends of the phase's early jobs)."""
    placement_latency_s: dict[str, float] = field(default_factory=dict)
    """job id -> its SubmitJobs call until its Dispatch reached the agent."""
    decisions: Histogram = EMPTY_HISTOGRAM
    time_to_placement: Histogram = EMPTY_HISTOGRAM
    drain_s: float = 0.0
    """Until every job of the phase finished at the agents."""
    total_cpu_s: float = 0.0
    """Broker CPU until the drain: every job's whole life."""
    broker_rss_end: int = 0
    refused: list[str] = field(default_factory=list)
    final_states: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    """job id -> JobKind.label."""

    @property
    def placed_per_s(self) -> float:
        return self.placed / self.place_window_s if self.place_window_s > 0 else 0.0

    @property
    def cpu_ms_per_placed_job(self) -> float:
        return self.place_cpu_s * 1000 / self.placed if self.placed else float("nan")

    @property
    def cpu_ms_per_job_life(self) -> float:
        return self.total_cpu_s * 1000 / self.placed if self.placed else float("nan")


@dataclass
class ScaleResult:
    """Everything a scale run measured (times in seconds, sizes in bytes)."""

    layout: FleetLayout
    recorded: RecordedInventory
    mix: tuple[JobKind, ...]
    run_seconds: tuple[float, float]
    broker_rss_idle: int = 0
    connect_s: float = 0.0
    connect_cpu_s: float = 0.0
    connect_agents_cpu_s: float = 0.0
    connect_others_cpu_s: float = 0.0
    broker_rss_connected: int = 0
    idle_cpu_per_s: float = 0.0
    """Broker CPU share with the fleet connected and nothing to do (heartbeats)."""
    phases: list[PhaseResult] = field(default_factory=list)
    broker_rss_end: int = 0
    broker_rss_peak: int = 0
    agents_rss_end: int = 0
    tally: FleetTally = field(default_factory=FleetTally)


async def _states(client: BrokerClient, job_set: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    token = ""
    while True:
        page = await client.list(job_set_id=job_set, page_size=1000, page_token=token)
        for j in page.jobs:
            state = job_pb2.JobState.Name(j.status.state).removeprefix("JOB_STATE_")
            counts[state] = counts.get(state, 0) + 1
        token = page.next_page_token
        if not token:
            return counts


async def _settled_states(client: BrokerClient, job_set: str, n: int, timeout_s: float = 60.0) -> dict[str, int]:
    """The job set's states once the broker has recorded `n` ends (the last statuses may still be in flight)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = await _states(client, job_set)
        if sum(states.get(s, 0) for s in ("SUCCEEDED", "FAILED", "CANCELLED")) >= n or time.monotonic() > deadline:
            return states
        await asyncio.sleep(0.5)


async def _run_phase(
    broker: ScaleBroker,
    client: BrokerClient,
    fleet: SyntheticFleet,
    phase: Phase,
    mix: Sequence[JobKind],
    tenant: str,
    *,
    place_timeout_s: float,
    drain_timeout_s: float,
) -> PhaseResult:
    out = PhaseResult(phase)
    pid, tally, procs = broker.pid, fleet.tally, [broker.process.as_proc()]
    specs = job_specs(phase.jobs, mix, tenant)
    job_set = f"scale-{uuid.uuid4().hex[:8]}"
    finished_before = tally.finished
    before = await broker.metrics()
    cpu0, own0, busy0, t0 = process_cpu_s(pid), process_cpu_s(os.getpid()), machine_busy_s(), time.monotonic()
    sent, out.refused = await submit_steady(client, [s for _, s in specs], phase.rate_per_s, job_set)
    out.submit_s = time.monotonic() - t0
    await wait_for(lambda: all(s.job_id in tally.placements for s in sent), place_timeout_s, "every job placed", procs)
    out.place_cpu_s = process_cpu_s(pid) - cpu0
    out.agents_cpu_s = process_cpu_s(os.getpid()) - own0
    out.others_cpu_s = max(0.0, machine_busy_s() - busy0 - out.place_cpu_s - out.agents_cpu_s)
    out.placed = len(sent)
    if sent:
        out.place_window_s = max(tally.placements[s.job_id].received for s in sent) - t0
    out.placement_latency_s = {s.job_id: tally.placements[s.job_id].received - s.sent for s in sent}
    out.kinds = {s.job_id: specs[s.index][0].label for s in sent}
    after = await broker.metrics()
    out.decisions = histogram(after, DECISION_METRIC).minus(histogram(before, DECISION_METRIC))
    out.time_to_placement = histogram(after, PLACEMENT_METRIC).minus(histogram(before, PLACEMENT_METRIC))
    await wait_for(lambda: tally.finished - finished_before >= len(sent), drain_timeout_s, "every job finished", procs)
    out.drain_s = time.monotonic() - t0
    out.total_cpu_s = process_cpu_s(pid) - cpu0
    out.broker_rss_end = process_rss_bytes(pid)
    out.final_states = await _settled_states(client, job_set, len(sent))
    return out


async def run_scale(
    workdir: Path,
    layout: FleetLayout,
    phases: Sequence[Phase],
    *,
    mix: Sequence[JobKind] = DEFAULT_MIX,
    run_seconds: tuple[float, float] = (10.0, 20.0),
    settle_s: float = 3.0,
    parallel: int = 16,
    place_timeout_s: float = 300.0,
    drain_timeout_s: float = 300.0,
    seed: int = 0,
) -> ScaleResult:
    """Record the inventory, start the broker, connect the fleet, then per phase submit its jobs at its rate
    and wait until every one was placed and has finished; the broker process is measured throughout."""
    recorded = record_inventory(layout)
    result = ScaleResult(layout, recorded, tuple(mix), run_seconds)
    broker = await start_broker(workdir, layout)
    fleet: SyntheticFleet | None = None
    pid = broker.pid
    try:
        admin = broker.process.client(ADMIN, timeout_s=60.0)
        client = broker.process.client(layout.tenant, timeout_s=60.0)
        await asyncio.sleep(1.0)  # start-up settles before the idle sample
        result.broker_rss_idle = process_rss_bytes(pid)
        cpu0, own0, busy0 = process_cpu_s(pid), process_cpu_s(os.getpid()), machine_busy_s()
        fleet = await connect_fleet(
            recorded,
            broker.process,
            admin,
            run_seconds=run_seconds,
            parallel=parallel,
            seed=seed,
            timeout_s=place_timeout_s,
        )
        result.tally = fleet.tally
        result.connect_s = fleet.connect_s
        result.connect_cpu_s = process_cpu_s(pid) - cpu0
        result.connect_agents_cpu_s = process_cpu_s(os.getpid()) - own0
        result.connect_others_cpu_s = max(
            0.0, machine_busy_s() - busy0 - result.connect_cpu_s - result.connect_agents_cpu_s
        )
        result.broker_rss_connected = process_rss_bytes(pid)
        cpu0, t0 = process_cpu_s(pid), time.monotonic()
        await asyncio.sleep(settle_s)
        result.idle_cpu_per_s = (process_cpu_s(pid) - cpu0) / (time.monotonic() - t0)
        for phase in phases:
            result.phases.append(
                await _run_phase(
                    broker,
                    client,
                    fleet,
                    phase,
                    mix,
                    layout.tenant,
                    place_timeout_s=place_timeout_s,
                    drain_timeout_s=drain_timeout_s,
                )
            )
        result.broker_rss_end = process_rss_bytes(pid)
        result.broker_rss_peak = process_peak_rss_bytes(pid)
        result.agents_rss_end = process_rss_bytes(os.getpid())
    finally:
        if fleet is not None:
            await fleet.close()
        await broker.process.stop()
    return result
