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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from broker.launcher.client import BrokerClient, SubmitItem
from fleetsim.harness import BrokerProcess, Cluster, start_cluster, tenancy_policy, wait_for
from fleetsim.model import ClusterSpec, FleetSpec, Outcome, RunResult, WorkItem
from placement import mig
from placement.podspec import GPU_MILLI_RESOURCE, GPU_RESOURCE, mig_profile_of
from placement.usage import mig_gpus
from sim import identities as ids
from sim import kuberesources as kr
from sim.informer import Informer
from sim.kubeclient import KubeApiError, KubeClient
from sim.schedconfig import SchedulerProfile
from sim.scheduler import Scheduler
from tandem.v1 import job_pb2

__all__ = ["BACKGROUND_LABEL", "PIPELINE_BUDGET", "job_spec", "pod_gpus", "run_wire"]

log = logging.getLogger("tandem.fleetsim.wire")

JSON = dict[str, Any]
PIPELINE_BUDGET = 0.02
"""S-1: the pipeline latency (submit -> all bound) should stay under this share of the median job duration."""
PROMPT_PLACEMENT_S = 1.0
"""An item reserved this soon (real seconds) after submission was placed on arrival, not held for capacity
(the placer rescans waiting jobs every 20 x 50 ms)."""
BACKGROUND_LABEL = "fleetsim.example.com/background"
"""Marks the background pods this module creates (outside Tandem's reserved label domains)."""
_BACKGROUND_MINUTES_ANNOTATION = "fleetsim.example.com/run-minutes"
BACKGROUND_NAMESPACE = "default"
BACKGROUND_GPUS = (1, 1, 2, 4)
"""GPUs per background pod, drawn uniformly (an inference replica or a notebook, mostly small)."""
BACKGROUND_MINUTES = (2.0, 20.0)
"""A background pod runs this many simulated minutes (uniform)."""
_ADMIN = "fleetsim-admin"
_JOB_LABEL = "tandem.dev/job"
_ATTEMPT_LABEL = "tandem.dev/attempt"
_TERMINAL = frozenset({job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED})
_NOT_STARTED = frozenset(
    {
        job_pb2.ATTEMPT_OUTCOME_REJECTED,
        job_pb2.ATTEMPT_OUTCOME_GANG_TIMEOUT,
        job_pb2.ATTEMPT_OUTCOME_INFRA_FAILED,
        job_pb2.ATTEMPT_OUTCOME_LOST,
    }
)
"""Outcomes of an attempt that never ran and is re-planned: a false dispatch when it was dispatched."""
_TOLERATIONS = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


# ----------------------------------------------------------------------------- the job a launcher submits


def job_spec(item: WorkItem, compression: float = 0.0) -> job_pb2.JobSpec:
    """One pod set of `item.replicas` with the item's shape and a pod template that requests exactly it; with a
    `compression` factor, the item's declared max runtime in compressed time (0: none is sent)."""
    spec = job_pb2.JobSpec(
        tenant=item.tenant,
        queue="default",
        priority=max(-1000, min(1000, item.priority)),
        preemptible=item.preemptible,
        display_name=item.name,
        framework=job_pb2.FRAMEWORK_TORCHRUN if item.replicas > 1 else job_pb2.FRAMEWORK_PLAIN,
    )
    resources: dict[str, str] = {"cpu": f"{item.cpu_milli}m", "memory": str(item.memory_bytes)}
    ps = spec.pod_sets.add(name="workers", count=item.replicas)
    shape = ps.shape
    shape.cpu_milli = item.cpu_milli
    shape.memory_bytes = item.memory_bytes
    shape.allowed_gpu_models.extend(item.gpu_models)
    if item.mig_profile:
        shape.mig_profile = item.mig_profile
        shape.mig_count = item.mig_count
        resources[mig.resource_name(item.mig_profile)] = str(item.mig_count)
    elif item.gpus and item.gpu_milli < 1000:
        shape.gpu_count = 1  # a share is asked of one GPU
        shape.gpu_milli = item.gpu_milli
        resources[GPU_MILLI_RESOURCE] = str(item.gpu_milli)
    elif item.gpus:
        shape.gpu_count = item.gpus
        resources[GPU_RESOURCE] = str(item.gpus)
    container = {
        "name": "main",
        "image": "registry.example.com/fleetsim/workload:1",
        "resources": {"requests": resources, "limits": dict(resources)},
    }
    ps.pod_template_json = json.dumps({"spec": {"containers": [container], "tolerations": _TOLERATIONS}})
    if item.required_level:
        spec.topology.required_level = item.required_level
    if item.min_replicas and item.min_replicas < item.replicas:
        spec.min_available = item.min_replicas
    if item.max_runtime_s is not None and compression > 0:
        spec.max_runtime.FromMilliseconds(max(1000, int(1000 * item.max_runtime_s / compression)))
    return spec


def pod_gpus(pod: Mapping[str, Any]) -> float:
    """GPUs a pod holds: whole GPUs, shares (`tandem.dev/gpu-milli`) and MIG instances as the core counts them
    (`placement.usage.mig_gpus`, as `WorkItem.gpu_cost`)."""
    total = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        amounts = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in amounts.items():
            if name == GPU_RESOURCE:
                total += float(value)
            elif name == GPU_MILLI_RESOURCE:
                total += float(value) / 1000.0
            elif (profile := mig_profile_of(name)) is not None:
                total += mig_gpus(profile, None, float(value))
    return total


def _holds(pod: Mapping[str, Any]) -> bool:
    """Bound and not finished (a terminating pod still holds its devices)."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def _running(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def _seconds(ts: Any) -> float | None:
    nanos = int(ts.ToNanoseconds())
    return nanos / 1e9 if nanos else None


# ----------------------------------------------------------------------------- one run


@dataclass
class _Gang:
    """One attempt's pods as the clusters show them."""

    cluster: str
    live: dict[str, str] = field(default_factory=dict)
    """namespace/name -> node ("" while unbound), for pods that exist."""
    nodes: dict[str, str] = field(default_factory=dict)
    """namespace/name -> node, every pod that was ever bound (kept after the pods are deleted)."""
    bound_at: float | None = None
    finishing: bool = False


@dataclass
class _Tracked:
    item: WorkItem
    outcome: Outcome
    submitted_at: float = 0.0
    job_id: str = ""
    done: bool = False
    first_placed_at: float | None = None
    bound_at: float | None = None
    """Wall-clock times of the first reservation and of the gang of the last attempt all bound."""
    attempts: int = 0


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
        self.tracked = [_Tracked(i, Outcome(i, submitted_s=0.0)) for i in self.items]
        self.by_job: dict[str, _Tracked] = {}
        self.ended_unknown: set[str] = set()
        """Jobs seen terminal before their submission returned (a race the watch may win)."""
        self.gangs: dict[tuple[str, int], _Gang] = {}
        self.node_labels = {
            c: {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in nodes}
            for c, nodes in cluster_nodes.items()
        }
        self.level_keys: dict[str, dict[str, str]] = {}
        """cluster -> level name -> node label key, as its agent reported them to the broker."""
        self.broker: BrokerProcess | None = None
        self.clusters: dict[str, Cluster] = {}
        self.informers: dict[str, Informer] = {}
        self.kube: dict[str, KubeClient] = {}
        """cluster -> this module's own cluster-admin client (pod cache, background pods)."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished = 0
        self.all_done = asyncio.Event()
        self.allocation: list[tuple[float, dict[str, float]]] = []
        self.background_created = 0
        self.background_ran: set[str] = set()
        """Background pods (cluster/namespace/name) seen running."""
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
        self.broker = BrokerProcess(self.workdir, policy, tokens, admin=_ADMIN, **self.broker_times())
        await self.broker.start()
        namespaces = {t.name: [t.namespace or t.name] for t in self.fleet.tenants}
        started = await asyncio.gather(
            *(self._start_cluster(spec, namespaces) for spec in self.fleet.clusters), return_exceptions=True
        )
        failures = [r for r in started if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        listed = await self.broker.client(_ADMIN).list_clusters()
        self.level_keys = {c.name: {lvl.name: lvl.label_key for lvl in c.topology_levels} for c in listed.clusters}

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
        await self._start_default_scheduler(cluster)
        self.kube[spec.name] = cluster.sim.client(user_agent="fleetsim-wire")
        pods = Informer(self.kube[spec.name], kr.PODS)
        pods.add_handler(lambda old, new: self._on_pod(spec.name, old, new))
        self.informers[spec.name] = pods
        self._spawn(pods.run(), f"{spec.name}-pods")
        await wait_for(pods.synced.is_set, 30, f"{spec.name} pod cache synced")

    async def _start_default_scheduler(self, cluster: Cluster) -> None:
        """kube-scheduler's default profile for the pods that never go through Tandem (S-4): the scheduler
        stand-in with no extender, under a ServiceAccount bound to system:kube-scheduler."""
        identity = ids.Identity("kube-system", "default-scheduler", "system:kube-scheduler")
        token = await cluster.sim.service_account_token(identity.namespace, identity.name)
        binding = ids.cluster_role_binding(identity) | {"metadata": {"name": "fleetsim-default-scheduler"}}
        await cluster.sim.apply(binding)
        scheduler = Scheduler(
            cluster.sim.client(token, "default-scheduler"),
            SchedulerProfile(),
            seed=self.seed,
            initial_backoff_s=0.05,
            max_backoff_s=1.0,
            unschedulable_timeout_s=5.0,
        )
        self._spawn(scheduler.run(), f"{cluster.name}-default-scheduler")
        await wait_for(
            lambda: scheduler.nodes.synced.is_set() and scheduler.pods.synced.is_set(),
            30,
            f"{cluster.name} default scheduler synced",
        )

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
            if new is not None and _running(new) and f"{cluster}/{key}" not in self.background_ran:
                self.background_ran.add(f"{cluster}/{key}")
                minutes = float((meta.get("annotations") or {}).get(_BACKGROUND_MINUTES_ANNOTATION) or 1.0)
                self._spawn(self._finish_background(cluster, key, self.real(minutes * 60)), f"end {key}")
            return
        job_id, attempt = labels.get(_JOB_LABEL), labels.get(_ATTEMPT_LABEL)
        if not job_id or not attempt or not attempt.isdigit():
            return
        gang = self.gangs.setdefault((job_id, int(attempt)), _Gang(cluster))
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

    async def _finish_gang(self, gang: _Gang, delay: float) -> None:
        await asyncio.sleep(delay)
        kubelet = self.clusters[gang.cluster].sim.kubelet
        assert kubelet is not None
        for key in list(gang.live):
            ns, name = key.split("/", 1)
            try:
                await kubelet.complete(ns, name, 0)
            except (LookupError, KubeApiError) as e:  # the attempt was torn down meanwhile
                log.info("pod not completed", extra={"pod": key, "error": str(e)})

    # ---- background load ------------------------------------------------------------------------

    async def _background(self, spec: ClusterSpec, rng: random.Random) -> None:
        """Pods that bypass Tandem, arriving as a Poisson process at the spec's rate per simulated minute."""
        largest = max((g.gpus_per_node for g in spec.groups), default=0)
        sizes = [g for g in BACKGROUND_GPUS if g <= largest]
        if not sizes:
            return
        client = self.kube[spec.name]
        mean_gap_s = self.real(60.0 / spec.background_pods_per_min)
        n = 0
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / mean_gap_s))
            n += 1
            minutes = rng.uniform(*BACKGROUND_MINUTES)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"background-{n}",
                    "namespace": BACKGROUND_NAMESPACE,
                    "labels": {BACKGROUND_LABEL: "true"},
                    "annotations": {_BACKGROUND_MINUTES_ANNOTATION: f"{minutes:.3f}"},
                },
                "spec": {
                    "schedulerName": "default-scheduler",
                    "restartPolicy": "Never",
                    "tolerations": _TOLERATIONS,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example.com/inference:1",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "4Gi"},
                                "limits": {GPU_RESOURCE: str(rng.choice(sizes))},
                            },
                        }
                    ],
                },
            }
            try:
                await client.create(kr.PODS, pod, BACKGROUND_NAMESPACE)
                self.background_created += 1
            except KubeApiError as e:
                log.warning("background pod not created", extra={"cluster": spec.name, "error": str(e)})

    async def _finish_background(self, cluster: str, key: str, delay: float) -> None:
        await asyncio.sleep(delay)
        ns, name = key.split("/", 1)
        sim = self.clusters[cluster].sim
        assert sim.kubelet is not None
        try:
            await sim.kubelet.complete(ns, name, 0)
            await self.kube[cluster].delete(kr.PODS, name, ns)  # as a Job's TTL would: keep the pod lists short
        except (LookupError, KubeApiError) as e:
            log.info("background pod not completed", extra={"pod": key, "error": str(e)})

    # ---- allocation -----------------------------------------------------------------------------

    async def _sample_allocation(self) -> None:
        interval = max(0.1, self.real(60.0))
        while True:
            sample = {
                name: sum(pod_gpus(p) for p in inf.store.values() if _holds(p)) for name, inf in self.informers.items()
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

    async def _submit(self, client: BrokerClient, tracked: _Tracked) -> None:
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
                    if ev.job_id and ev.job.status.state in _TERMINAL:
                        tracked = self.by_job.get(ev.job_id)
                        if tracked is None:
                            self.ended_unknown.add(ev.job_id)
                        elif not tracked.done:
                            tracked.done = True
                            self._spawn(self._finalize(client, tracked), f"outcome {ev.job_id}")
            except grpc.aio.AioRpcError as e:
                log.warning("job watch broke, resuming", extra={"tenant": tenant, "error": e.code().name})
                await asyncio.sleep(0.5)

    async def _finalize(self, client: BrokerClient, tracked: _Tracked) -> None:
        job = await client.get(tracked.job_id)
        self._fill(tracked, job)
        self._count_done(tracked)

    def _count_done(self, tracked: _Tracked) -> None:
        tracked.done = True
        self.finished += 1
        if self.progress is not None:
            self.progress(self.finished, len(self.tracked))
        if self.finished == len(self.tracked):
            self.all_done.set()

    def _fill(self, tracked: _Tracked, job: job_pb2.Job) -> None:
        """The outcome from the broker's attempts and what the clusters showed of the pods."""
        out = tracked.outcome
        attempts = list(job.status.attempts)
        out.dispatches = sum(1 for a in attempts if a.dispatch_time.ToNanoseconds())
        causes = []
        for a in attempts[:-1]:
            if a.dispatch_time.ToNanoseconds() and not a.running_time.ToNanoseconds() and a.outcome in _NOT_STARTED:
                cause = job_pb2.AttemptOutcome.Name(a.outcome).removeprefix("ATTEMPT_OUTCOME_")
                if a.outcome == job_pb2.ATTEMPT_OUTCOME_REJECTED:
                    reason = job_pb2.DispatchRejectReason.Name(a.rejection.reason)
                    cause += ":" + reason.removeprefix("DISPATCH_REJECT_REASON_")
                causes.append(cause)
        out.false_dispatches = len(causes)
        out.false_dispatch_causes = tuple(causes)
        if not attempts:
            return
        tracked.attempts = len(attempts)
        tracked.first_placed_at = _seconds(attempts[0].reserve_time)
        last = attempts[-1]
        out.cluster = last.cluster
        if (reserved := _seconds(last.reserve_time)) is not None:
            out.placed_s = self.sim_time(reserved)
        gang = self.gangs.get((job.job_id, last.number))
        if gang is not None and gang.bound_at is not None:
            tracked.bound_at = gang.bound_at
            out.started_s = self.sim_time(gang.bound_at)
        elif (running := _seconds(last.running_time)) is not None:
            out.started_s = self.sim_time(running)
        if job.status.state == job_pb2.JOB_STATE_SUCCEEDED and (ended := _seconds(last.end_time)) is not None:
            out.finished_s = self.sim_time(ended)
        nodes = (
            list(gang.nodes.values()) if gang is not None and gang.nodes else [r.node for r in last.replicas if r.node]
        )
        level = tracked.item.required_level
        if level and nodes:
            key = self.level_keys.get(last.cluster, {}).get(level, level)  # a level may be named by its key
            labels = self.node_labels.get(last.cluster, {})
            out.domains = tuple(labels.get(n, {}).get(key, "") for n in sorted(nodes))

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
                self._spawn(self._background(spec, random.Random(rng.random())), f"{spec.name} background")
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

    def broker_times(self) -> dict[str, Any]:
        """The broker's fairness and grace periods in compressed time, as they are in simulated time."""
        c = self.compression
        return {
            "grace_period_s": 30.0 / c,
            "fairness": {
                "min_runtime_s": 900.0 / c,
                "release_timeout_s": max(120.0 / c, 5.0),
                "hold_after_s": 1800.0 / c,
                "max_hold_s": 4 * 3600.0 / c,
            },
        }

    def _result(self) -> RunResult:
        outcomes = [t.outcome for t in self.tracked]
        finished = [o.finished_s for o in outcomes if o.finished_s is not None]
        header = (
            f"wire mode: real broker, extender and agent processes; time compressed {self.compression:g}x "
            f"(1 real second = {self.compression:g} simulated seconds)"
        )
        notes = [
            header,
            (
                "wire mode: the broker's grace period, minimum runtime before fair-share preemption, "
                "hold bound and hold length are compressed likewise; a preempted job runs its whole "
                "duration again (no checkpoints)"
            ),
        ]
        durations = [self.real(i.duration_s) for i in self.items]
        median = statistics.median(durations) if durations else 0.0
        # S-1's figure is submit -> all bound; only an item the broker placed on arrival (not held for
        # capacity) and that started on its first attempt shows the pipeline rather than queueing.
        prompt = [
            t.bound_at - t.submitted_at
            for t in self.tracked
            if t.bound_at is not None
            and t.first_placed_at is not None
            and t.attempts == 1
            and t.first_placed_at - t.submitted_at <= PROMPT_PLACEMENT_S
        ]
        if prompt and median > 0:
            p50 = statistics.median(prompt)
            verdict = "within" if p50 / median < PIPELINE_BUDGET else "ABOVE"
            notes.append(
                f"pipeline latency (submit -> all pods bound, {len(prompt)} items placed on arrival) p50 "
                f"{p50 * 1000:.0f} ms real = {p50 / median:.1%} of the median job duration "
                f"({median:.1f} s real): {verdict} the {PIPELINE_BUDGET:.0%} budget (S-1)"
            )
        elif self.tracked:
            notes.append("pipeline latency: no item was placed on arrival and started at once (all queued)")
        binding = [
            self.real(o.started_s - o.placed_s) for o in outcomes if o.started_s is not None and o.placed_s is not None
        ]
        if binding:
            notes.append(
                f"placement -> all pods bound p50 {statistics.median(binding) * 1000:.0f} ms real "
                "(dispatch, create, pin, start, bind)"
            )
        if self.background_created:
            notes.append(
                f"background: {self.background_created} pods created outside Tandem, {len(self.background_ran)} ran"
            )
        return RunResult(
            mode="wire",
            policy="tandem",
            fleet=self.fleet,
            seed=self.seed,
            outcomes=outcomes,
            allocation=self.allocation,
            background_pods=len(self.background_ran),
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
