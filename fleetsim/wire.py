"""Wire mode: a workload run through the real processes, in compressed time.

The broker runs as its own process; every cluster of the fleet is a `SimCluster` with the real extender and
the real agent (`fleetsim.harness`). Launchers submit each item with `BrokerClient` at its arrival time
divided by the compression factor; the kubelet stand-in runs the pods, and this module ends them
`duration_s / compression` real seconds after the whole gang is bound, as the workload would. Background
pods (`schedulerName: default-scheduler`) are bound by a stand-in of the default scheduler (the same
`sim.scheduler.Scheduler`, its default profile, no extender), so the broker's view of the cluster is
sometimes wrong, as in a shared cluster.

What it measures is the pipeline under real latencies, not the policy at scale (FLEET-NOTES S-1): the
report carries the compression factor and the measured pipeline latency against the median job duration.
What is said to the broker and read back is `fleetsim.wire_jobs`; the pods and the background load,
`fleetsim.wire_pods`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from broker.launcher.client import BrokerClient, SubmitItem
from fleetsim.broker_process import BrokerProcess, tenancy_policy
from fleetsim.harness import Cluster, start_cluster
from fleetsim.model import ClusterSpec, FleetSpec, Outcome, RunResult, WorkItem
from fleetsim.processes import wait_for
from fleetsim.wire_jobs import TERMINAL_STATES, Tracked, broker_times, fill_outcome, job_spec, wire_notes
from fleetsim.wire_pods import (
    ATTEMPT_LABEL,
    BACKGROUND_LABEL,
    JOB_LABEL,
    BackgroundLoad,
    Gang,
    NodeLabels,
    holds_gpus,
    pod_gpus,
)
from sim import kuberesources as kr
from sim.informer import Informer
from sim.kubeclient import KubeApiError, KubeClient
from tandem.v1 import job_pb2

__all__ = ["run_wire"]

log = logging.getLogger("tandem.fleetsim.wire")

JSON = dict[str, Any]
_ADMIN = "fleetsim-admin"


class _WireRun:
    def __init__(
        self,
        fleet: FleetSpec,
        cluster_nodes: Mapping[str, list[JSON]],
        items: Sequence[WorkItem],
        *,
        compression: float,
        workdir: Path,
        seed: int,
        progress: Callable[[int, int], None] | None,
        timeout_s: float,
        horizon_s: float | None = None,
    ) -> None:
        if compression <= 0:
            raise ValueError("compression must be positive")
        missing = [c.name for c in fleet.clusters if c.name not in cluster_nodes]
        if missing:
            raise ValueError(f"no nodes given for clusters {missing}")
        unknown = sorted({i.tenant for i in items} - {t.name for t in fleet.tenants})
        if unknown:
            raise ValueError(f"items of tenants the fleet does not define: {unknown}")
        self.fleet = fleet
        self.cluster_nodes = cluster_nodes
        self.items = list(items)
        self.compression = compression
        self.workdir = workdir
        self.seed = seed
        self.progress = progress
        self.deadline = time.monotonic() + timeout_s
        self.horizon_s = horizon_s
        self.job_set = f"fleetsim-{seed}"
        self.t0 = time.time()
        self.tracked = [Tracked(i, Outcome(i, submitted_s=0.0)) for i in self.items]
        self.by_job: dict[str, Tracked] = {}
        self.ended_unknown: set[str] = set()
        """Jobs seen terminal before their submission returned (a race the watch may win)."""
        self.gangs: dict[tuple[str, int], Gang] = {}
        self.node_labels = NodeLabels(cluster_nodes)
        self.broker: BrokerProcess | None = None
        self.clusters: dict[str, Cluster] = {}
        self.informers: dict[str, Informer] = {}
        self.kube: dict[str, KubeClient] = {}
        """cluster -> this module's own cluster-admin client (pod cache, background pods)."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished = 0
        self.all_done = asyncio.Event()
        self.allocation: list[tuple[float, dict[str, float]]] = []
        self.background = BackgroundLoad(compression, self._spawn)
        self.notes: list[str] = []

    # ---- clocks ---------------------------------------------------------------------------------

    def sim_time(self, wall: float) -> float:
        """Simulated seconds since the workload began, for a wall-clock time (the broker's clock too)."""
        return (wall - self.t0) * self.compression

    def real(self, simulated_s: float) -> float:
        return simulated_s / self.compression

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("wire-mode task failed", exc_info=task.exception(), extra={"task": task.get_name()})

    # ---- setup ----------------------------------------------------------------------------------

    async def start(self) -> None:
        tokens = {t.name: secrets.token_urlsafe(24) for t in self.fleet.tenants}
        tokens[_ADMIN] = secrets.token_urlsafe(24)
        policy = tenancy_policy(self.fleet.tenants, tokens, tokens[_ADMIN])
        self.broker = BrokerProcess(self.workdir, policy, tokens, admin=_ADMIN, **broker_times(self.compression))
        await self.broker.start()
        namespaces = {t.name: [t.namespace or t.name] for t in self.fleet.tenants}
        started = await asyncio.gather(
            *(self._start_cluster(spec, namespaces) for spec in self.fleet.clusters), return_exceptions=True
        )
        failures = [r for r in started if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        listed = await self.broker.client(_ADMIN).list_clusters()
        self.node_labels.level_keys = {
            c.name: {lvl.name: lvl.label_key for lvl in c.topology_levels} for c in listed.clusters
        }

    async def _start_cluster(self, spec: ClusterSpec, namespaces: Mapping[str, list[str]]) -> None:
        assert self.broker is not None
        cluster = await start_cluster(
            spec.name,
            self.cluster_nodes[spec.name],
            self.broker,
            self.workdir,
            tenants=namespaces,
            region=spec.region,
            role=spec.role,
            levels=spec.levels,
            kubelet_auto_run=True,
        )
        self.clusters[spec.name] = cluster
        await self.background.start_scheduler(cluster, self.seed)
        self.kube[spec.name] = cluster.sim.client(user_agent="fleetsim-wire")
        pods = Informer(self.kube[spec.name], kr.PODS)
        pods.add_handler(lambda old, new: self._on_pod(spec.name, old, new))
        self.informers[spec.name] = pods
        self._spawn(pods.run(), f"{spec.name}-pods")
        await wait_for(pods.synced.is_set, 30, f"{spec.name} pod cache synced")

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for cluster in self.clusters.values():
            with contextlib.suppress(Exception):
                await cluster.stop()
        if self.broker is not None:
            await self.broker.stop()

    # ---- the clusters' pods ---------------------------------------------------------------------

    def _on_pod(self, cluster: str, old: JSON | None, new: JSON | None) -> None:
        pod = new or old
        assert pod is not None
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if labels.get(BACKGROUND_LABEL):
            if new is not None:
                self.background.seen(self.clusters[cluster], self.kube[cluster], new)
            return
        job_id, attempt = labels.get(JOB_LABEL), labels.get(ATTEMPT_LABEL)
        if not job_id or not attempt or not attempt.isdigit():
            return
        gang = self.gangs.setdefault((job_id, int(attempt)), Gang(cluster))
        if new is None:
            gang.live.pop(key, None)
            return
        node = str((new.get("spec") or {}).get("nodeName") or "")
        gang.live[key] = node
        if node:
            gang.nodes[key] = node
        if gang.bound_at is None and gang.live and all(gang.live.values()):
            # The agent starts a gang only once all its pods exist and are pinned, so "every live pod bound"
            # is "the whole gang bound".
            gang.bound_at = time.time()
        self._maybe_finish(job_id, int(attempt))

    def _maybe_finish(self, job_id: str, attempt: int) -> None:
        """Once the gang is bound and its item known, end its pods after the item's (compressed) duration."""
        gang = self.gangs.get((job_id, attempt))
        tracked = self.by_job.get(job_id)
        if gang is None or tracked is None or gang.bound_at is None or gang.finishing:
            return
        gang.finishing = True
        delay = max(0.0, gang.bound_at + self.real(tracked.item.duration_s) - time.time())
        self._spawn(self._finish_gang(gang, delay), f"end {job_id}-{attempt}")

    async def _finish_gang(self, gang: Gang, delay: float) -> None:
        await asyncio.sleep(delay)
        kubelet = self.clusters[gang.cluster].sim.kubelet
        assert kubelet is not None
        for key in list(gang.live):
            ns, name = key.split("/", 1)
            try:
                await kubelet.complete(ns, name, 0)
            except (LookupError, KubeApiError) as e:  # the attempt was torn down meanwhile
                log.info("pod not completed", extra={"pod": key, "error": str(e)})

    # ---- allocation -----------------------------------------------------------------------------

    async def _sample_allocation(self) -> None:
        interval = max(0.1, self.real(60.0))
        while True:
            sample = {
                name: sum(pod_gpus(p) for p in inf.store.values() if holds_gpus(p))
                for name, inf in self.informers.items()
            }
            self.allocation.append((self.sim_time(time.time()), sample))
            await asyncio.sleep(interval)

    # ---- launchers and the broker's view --------------------------------------------------------

    async def _launch(self) -> None:
        assert self.broker is not None
        clients = {t.name: self.broker.client(t.name) for t in self.fleet.tenants}
        for tracked in sorted(self.tracked, key=lambda t: t.item.arrival_s):
            delay = self.t0 + self.real(tracked.item.arrival_s) - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._spawn(self._submit(clients[tracked.item.tenant], tracked), f"submit {tracked.item.name}")

    async def _submit(self, client: BrokerClient, tracked: Tracked) -> None:
        tracked.submitted_at = time.time()
        tracked.outcome.submitted_s = self.sim_time(tracked.submitted_at)
        request = [SubmitItem(tracked.item.name, job_spec(tracked.item, self.compression))]
        result = None
        for attempt in range(5):  # the idempotency key makes a resend safe
            try:
                [result] = await client.submit(self.job_set, request)
                break
            except grpc.aio.AioRpcError as e:
                retryable = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
                if not retryable or attempt == 4:
                    self.notes.append(f"item {tracked.item.name} not submitted: {e.code().name} {e.details()}")
                    self._count_done(tracked)
                    return
                await asyncio.sleep(0.2 * 2**attempt)
        assert result is not None
        if not result.job_id:
            self.notes.append(f"item {tracked.item.name} refused at submission: {result.error_message}")
            self._count_done(tracked)
            return
        tracked.job_id = result.job_id
        self.by_job[result.job_id] = tracked
        if result.job_id in self.ended_unknown:
            tracked.done = True
            self._spawn(self._finalize(client, tracked), f"outcome {result.job_id}")
            return
        for job_id, attempt in list(self.gangs):
            if job_id == result.job_id:
                self._maybe_finish(job_id, attempt)

    async def _watch(self, tenant: str, ready: asyncio.Event) -> None:
        """The tenant's jobs of this run; a terminal one is read in full and its outcome filled in."""
        assert self.broker is not None
        client = self.broker.client(tenant, timeout_s=10.0)
        revision = 0
        while True:
            try:
                async for ev in client.watch(revision, job_set_id=self.job_set, bookmark_interval_seconds=5):
                    revision = max(revision, ev.revision)
                    ready.set()
                    if ev.job_id and ev.job.status.state in TERMINAL_STATES:
                        tracked = self.by_job.get(ev.job_id)
                        if tracked is None:
                            self.ended_unknown.add(ev.job_id)
                        elif not tracked.done:
                            tracked.done = True
                            self._spawn(self._finalize(client, tracked), f"outcome {ev.job_id}")
            except grpc.aio.AioRpcError as e:
                log.warning("job watch broke, resuming", extra={"tenant": tenant, "error": e.code().name})
                await asyncio.sleep(0.5)

    async def _finalize(self, client: BrokerClient, tracked: Tracked) -> None:
        job = await client.get(tracked.job_id)
        self._fill(tracked, job)
        self._count_done(tracked)

    def _count_done(self, tracked: Tracked) -> None:
        tracked.done = True
        self.finished += 1
        if self.progress is not None:
            self.progress(self.finished, len(self.tracked))
        if self.finished == len(self.tracked):
            self.all_done.set()

    def _fill(self, tracked: Tracked, job: job_pb2.Job) -> None:
        fill_outcome(tracked, job, self.gangs, self.sim_time, self.node_labels)

    # ---- the run --------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        await self.start()
        ready = {t.name: asyncio.Event() for t in self.fleet.tenants}
        for tenant, event in ready.items():
            self._spawn(self._watch(tenant, event), f"watch {tenant}")
        await wait_for(lambda: all(e.is_set() for e in ready.values()), 30, "the job watches open")
        self.t0 = time.time()
        self._spawn(self._sample_allocation(), "allocation")
        rng = random.Random(self.seed)
        for spec in self.fleet.clusters:
            if spec.background_pods_per_min > 0:
                background = self.background.arrive(spec, self.kube[spec.name], random.Random(rng.random()))
                self._spawn(background, f"{spec.name} background")
        self._spawn(self._launch(), "launchers")
        if not self.tracked:
            self.all_done.set()
        wait_s = max(0.0, self.deadline - time.monotonic())
        stop_at_horizon = self.horizon_s is not None and self.horizon_s / self.compression < wait_s
        if stop_at_horizon:
            assert self.horizon_s is not None
            wait_s = self.horizon_s / self.compression
        try:
            await asyncio.wait_for(self.all_done.wait(), wait_s)
        except TimeoutError:
            await self._fill_unfinished("at the simulated horizon" if stop_at_horizon else "timed out")
        return self._result()

    async def _fill_unfinished(self, why: str) -> None:
        """At the deadline or the horizon: what the broker knows of the items that did not finish."""
        assert self.broker is not None
        client = self.broker.client(_ADMIN)
        unfinished = [t for t in self.tracked if not t.done]
        for tracked in unfinished:
            if tracked.job_id:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    self._fill(tracked, await client.get(tracked.job_id))
        self.notes.append(f"{why}: {len(unfinished)} of {len(self.tracked)} items had not finished")

    def _result(self) -> RunResult:
        outcomes = [t.outcome for t in self.tracked]
        finished = [o.finished_s for o in outcomes if o.finished_s is not None]
        notes = wire_notes(self.tracked, self.compression)
        if self.background.created:
            notes.append(
                f"background: {self.background.created} pods created outside Tandem, {len(self.background.ran)} ran"
            )
        return RunResult(
            mode="wire",
            policy="tandem",
            fleet=self.fleet,
            seed=self.seed,
            outcomes=outcomes,
            allocation=self.allocation,
            background_pods=len(self.background.ran),
            makespan_s=max(finished, default=0.0),
            notes=notes + self.notes,
        )


async def run_wire(
    fleet: FleetSpec,
    cluster_nodes: Mapping[str, list[dict[str, Any]]],
    items: Sequence[WorkItem],
    *,
    compression: float,
    workdir: Path,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float,
    horizon_s: float | None = None,
) -> RunResult:
    """Run `items` through a real broker and, per cluster of `fleet`, a simulated control plane with the real
    extender and agent (`cluster_nodes`: the Node objects of each cluster). Times in the result are simulated
    seconds (real seconds x `compression`). Every process is stopped on return, also on error; past
    `timeout_s` (real seconds, set-up included), or at `horizon_s` simulated seconds after the first arrival, the
    result holds what had happened, and a note says so.
    `workdir` (the broker's database, every process's configuration and log) must be new or empty."""
    if workdir.exists() and any(workdir.iterdir()):
        raise ValueError(f"{workdir} is not empty (a broker database there would answer resubmissions)")
    workdir.mkdir(parents=True, exist_ok=True)
    run = _WireRun(
        fleet,
        cluster_nodes,
        items,
        compression=compression,
        workdir=workdir,
        seed=seed,
        progress=progress,
        timeout_s=timeout_s,
        horizon_s=horizon_s,
    )
    try:
        return await run.run()
    finally:
        await run.stop()
