"""The clusters' pods as wire mode sees and makes them: the GPUs a pod holds, one attempt's gang as its pods show
it, the nodes' topology labels, and the background pods that never go through Tandem (their default scheduler, and
the pods created, run and removed here)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetsim.harness import Cluster
from fleetsim.model import ClusterSpec
from fleetsim.processes import wait_for
from placement.podspec import GPU_MILLI_RESOURCE, GPU_RESOURCE, mig_profile_of
from placement.usage import mig_gpus
from sim import identities as ids
from sim import kuberesources as kr
from sim.kubeclient import KubeApiError, KubeClient
from sim.schedconfig import SchedulerProfile
from sim.scheduler import Scheduler

__all__ = [
    "ATTEMPT_LABEL",
    "BACKGROUND_GPUS",
    "BACKGROUND_LABEL",
    "BACKGROUND_MINUTES",
    "BACKGROUND_NAMESPACE",
    "GPU_TOLERATIONS",
    "JOB_LABEL",
    "BackgroundLoad",
    "Gang",
    "NodeLabels",
    "holds_gpus",
    "pod_gpus",
]

log = logging.getLogger("tandem.fleetsim.wire")

JSON = dict[str, Any]
JOB_LABEL = "tandem.dev/job"
ATTEMPT_LABEL = "tandem.dev/attempt"
GPU_TOLERATIONS = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
"""Every pod here tolerates the taint of the fleet's GPU nodes."""
BACKGROUND_LABEL = "fleetsim.example.com/background"
"""Marks the background pods this module creates (outside Tandem's reserved label domains)."""
_BACKGROUND_MINUTES_ANNOTATION = "fleetsim.example.com/run-minutes"
BACKGROUND_NAMESPACE = "default"
BACKGROUND_GPUS = (1, 1, 2, 4)
"""GPUs per background pod, drawn uniformly (an inference replica or a notebook, mostly small)."""
BACKGROUND_MINUTES = (2.0, 20.0)
"""A background pod runs this many simulated minutes (uniform)."""


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


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """Bound and not finished (a terminating pod still holds its devices)."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def _running(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


@dataclass
class Gang:
    """One attempt's pods as the clusters show them."""

    cluster: str
    live: dict[str, str] = field(default_factory=dict)
    """namespace/name -> node ("" while unbound), for pods that exist."""
    nodes: dict[str, str] = field(default_factory=dict)
    """namespace/name -> node, every pod that was ever bound (kept after the pods are deleted)."""
    bound_at: float | None = None
    finishing: bool = False


class NodeLabels:
    """Every cluster's node labels as the run gave them, and the label key of each topology level as the cluster's
    agent reported it to the broker (`level_keys`, set once the clusters are connected)."""

    def __init__(self, cluster_nodes: Mapping[str, Sequence[JSON]]) -> None:
        self.labels = {
            c: {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in nodes}
            for c, nodes in cluster_nodes.items()
        }
        self.level_keys: dict[str, dict[str, str]] = {}
        """cluster -> level name -> node label key."""

    def domains(self, cluster: str, level: str, nodes: Sequence[str]) -> tuple[str, ...]:
        """The `level` domain of each of the cluster's `nodes`, in node name order ("" = not labelled)."""
        key = self.level_keys.get(cluster, {}).get(level, level)  # a level may be named by its key
        labels = self.labels.get(cluster, {})
        return tuple(labels.get(n, {}).get(key, "") for n in sorted(nodes))


class BackgroundLoad:
    """Pods that bypass Tandem (`schedulerName: default-scheduler`), arriving on a cluster as a Poisson process at
    its rate per simulated minute; each runs its drawn minutes once running, then is removed. `spawn` runs a
    coroutine as one of the run's tasks."""

    def __init__(self, compression: float, spawn: Callable[[Coroutine[Any, Any, None], str], None]) -> None:
        self.compression = compression
        self.spawn = spawn
        self.created = 0
        self.ran: set[str] = set()
        """Background pods (cluster/namespace/name) seen running."""

    async def start_scheduler(self, cluster: Cluster, seed: int) -> None:
        """kube-scheduler's default profile for the pods that never go through Tandem (S-4): the scheduler
        stand-in with no extender, under a ServiceAccount bound to system:kube-scheduler."""
        identity = ids.Identity("kube-system", "default-scheduler", "system:kube-scheduler")
        token = await cluster.sim.service_account_token(identity.namespace, identity.name)
        binding = ids.cluster_role_binding(identity) | {"metadata": {"name": "fleetsim-default-scheduler"}}
        await cluster.sim.apply(binding)
        scheduler = Scheduler(
            cluster.sim.client(token, "default-scheduler"),
            SchedulerProfile(),
            seed=seed,
            initial_backoff_s=0.05,
            max_backoff_s=1.0,
            unschedulable_timeout_s=5.0,
        )
        self.spawn(scheduler.run(), f"{cluster.name}-default-scheduler")
        await wait_for(
            lambda: scheduler.nodes.synced.is_set() and scheduler.pods.synced.is_set(),
            30,
            f"{cluster.name} default scheduler synced",
        )

    async def arrive(self, spec: ClusterSpec, client: KubeClient, rng: random.Random) -> None:
        """Create the cluster's background pods until cancelled."""
        largest = max((g.gpus_per_node for g in spec.groups), default=0)
        sizes = [g for g in BACKGROUND_GPUS if g <= largest]
        if not sizes:
            return
        mean_gap_s = 60.0 / spec.background_pods_per_min / self.compression
        n = 0
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / mean_gap_s))
            n += 1
            minutes = rng.uniform(*BACKGROUND_MINUTES)
            pod = _background_pod(f"background-{n}", minutes, rng.choice(sizes))
            try:
                await client.create(kr.PODS, pod, BACKGROUND_NAMESPACE)
                self.created += 1
            except KubeApiError as e:
                log.warning("background pod not created", extra={"cluster": spec.name, "error": str(e)})

    def seen(self, cluster: Cluster, client: KubeClient, pod: JSON) -> None:
        """A background pod as the cluster shows it: once running, it ends after its minutes."""
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if _running(pod) and f"{cluster.name}/{key}" not in self.ran:
            self.ran.add(f"{cluster.name}/{key}")
            minutes = float((meta.get("annotations") or {}).get(_BACKGROUND_MINUTES_ANNOTATION) or 1.0)
            self.spawn(self._finish(cluster, client, key, minutes * 60 / self.compression), f"end {key}")

    async def _finish(self, cluster: Cluster, client: KubeClient, key: str, delay: float) -> None:
        await asyncio.sleep(delay)
        ns, name = key.split("/", 1)
        kubelet = cluster.sim.kubelet
        assert kubelet is not None
        try:
            await kubelet.complete(ns, name, 0)
            await client.delete(kr.PODS, name, ns)  # as a Job's TTL would: keep the pod lists short
        except (LookupError, KubeApiError) as e:
            log.info("background pod not completed", extra={"pod": key, "error": str(e)})


def _background_pod(name: str, minutes: float, gpus: int) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": BACKGROUND_NAMESPACE,
            "labels": {BACKGROUND_LABEL: "true"},
            "annotations": {_BACKGROUND_MINUTES_ANNOTATION: f"{minutes:.3f}"},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "restartPolicy": "Never",
            "tolerations": GPU_TOLERATIONS,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/inference:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "4Gi"},
                        "limits": {GPU_RESOURCE: str(gpus)},
                    },
                }
            ],
        },
    }
