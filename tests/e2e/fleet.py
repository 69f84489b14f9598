"""The end-to-end tests' fleet: `fleetsim.harness` and `fleetsim.broker_process` (one real broker, and per
cluster a simulated control plane with the real extender and agent processes) with the tests' tenants and tokens,
an in-process broker seen through the same calls, and the tests' own nodes, gangs and pod watch.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.launcher.client import BrokerClient
from extender.podreq import pinned_node
from fleetsim import broker_process, harness
from fleetsim.harness import MANIFESTS, Cluster
from fleetsim.processes import REPO, Proc, free_port, http_ok, spawn, wait_for
from sim import kuberesources as kr
from sim.kubeclient import KubeApiError
from tandem.v1 import job_pb2
from tests.broker.hub_builders import TOKENS, Broker, policy_doc
from tests.fixtures import fixture_json

__all__ = [
    "H100",
    "MANIFESTS",
    "REPO",
    "TENANT_NAMESPACE",
    "AnyBroker",
    "BrokerProcess",
    "Cluster",
    "InProcessBroker",
    "PodHistory",
    "Proc",
    "busy_pod",
    "free_port",
    "gang",
    "gpu_node",
    "http_ok",
    "job_template",
    "spawn",
    "start_cluster",
    "wait_for",
    "watch_pods",
]

H100 = "NVIDIA-H100-80GB-HBM3"
TENANT_NAMESPACE = "team-a"


def gpu_node(
    name: str, *, rack: str, zone: str = "zone-a", block: str = "b1", gpus: int = 8, hostname: str | None = None
) -> dict[str, Any]:
    """A real-format HGX H100 node (the fixture's) renamed; its hostname label differs from its name, as on
    clouds that name nodes by instance id (the agent must pin by name, never by that label)."""
    base = next(
        o
        for o in fixture_json("cluster.json")["items"]
        if o["kind"] == "Node" and o["metadata"]["name"] == "h100-r1-n2"
    )
    node: dict[str, Any] = copy.deepcopy(base)
    meta = node["metadata"]
    for k in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(k, None)
    meta["name"] = name
    meta["labels"].update(
        {
            "kubernetes.io/hostname": hostname or f"h100-{rack}-{name.rsplit('-', 1)[-1]}",
            "topology.kubernetes.io/zone": zone,
            "network.example.com/block": block,
            "network.example.com/rack": rack,
            "nvidia.com/gpu.count": str(gpus),
        }
    )
    for field_name in ("capacity", "allocatable"):
        node["status"][field_name]["nvidia.com/gpu"] = str(gpus)
    node["status"]["addresses"] = [{"type": "Hostname", "address": meta["labels"]["kubernetes.io/hostname"]}]
    return node


class BrokerProcess(broker_process.BrokerProcess):
    """The broker as its own process, with the tests' tenants (alpha, beta) and admin."""

    def __init__(self, tmp: Path, **config: Any) -> None:
        super().__init__(tmp, policy_doc(), TOKENS, **config)

    def client(self, who: str = "alpha", **kw: Any) -> BrokerClient:
        return super().client(who, **kw)


class InProcessBroker:
    """The test's in-process broker (`start_broker`) seen through the same few calls."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.pki = broker.pki
        self.agent_addr = broker.agent_addr

    def client(self, who: str = "alpha") -> BrokerClient:
        return self.broker.client(who)

    async def cluster_ready(self, name: str) -> bool:
        e = self.broker.hub.catalog.clusters.get(name)
        return e is not None and e.has_snapshot and e.connected


AnyBroker = BrokerProcess | InProcessBroker


async def start_cluster(
    name: str,
    nodes: Sequence[dict[str, Any]],
    broker: Broker | AnyBroker,
    tmp: Path,
    *,
    tenants: dict[str, list[str]] | None = None,
    **options: Any,
) -> Cluster:
    """`fleetsim.harness.start_cluster` with the tests' tenant (alpha in team-a) unless told otherwise."""
    hub = InProcessBroker(broker) if isinstance(broker, Broker) else broker
    return await harness.start_cluster(
        name, nodes, hub, tmp, tenants=tenants or {"alpha": [TENANT_NAMESPACE]}, **options
    )


def job_template(
    gpus: int, *, cpu: str = "16", memory: str = "64Gi", extra: dict[str, str] | None = None, **spec: Any
) -> str:
    """A pod template whose requests equal the shape (the broker refuses one that differs)."""
    requests = {"cpu": cpu, "memory": memory, **(extra or {})}
    container = {
        "name": "trainer",
        "image": "registry.example.com/llm/trainer:2026.11",
        "command": ["torchrun", "train.py"],
        "resources": {"requests": requests, "limits": {"nvidia.com/gpu": str(gpus), **requests}},
    }
    template = {
        "metadata": {"labels": {"team": "llm"}},
        "spec": {
            "containers": [container],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            **spec,
        },
    }
    return json.dumps(template)


def gang(replicas: int, gpus: int, *, level: str = "rack", extra: dict[str, str] | None = None) -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec(queue="research", framework=job_pb2.FRAMEWORK_TORCHRUN)
    ps = spec.pod_sets.add(name="workers", count=replicas, pod_template_json=job_template(gpus, extra=extra))
    ps.shape.gpu_count = gpus
    ps.shape.cpu_milli = 16_000
    ps.shape.memory_bytes = 64 << 30
    spec.topology.required_level = level
    spec.start_timeout.seconds = 120
    return spec


def busy_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    """Someone else's GPU pod, bound directly (as a DaemonSet's would be)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/inference:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


class PodHistory:
    """Every state a gang's pods went through, from a watch on the tenant namespace (real JSON)."""

    def __init__(self) -> None:
        self.states: dict[str, list[str]] = {}
        self.last: dict[str, dict[str, Any]] = {}

    @staticmethod
    def state(pod: dict[str, Any]) -> str:
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            return "bound"
        gated = any(g.get("name") == "tandem.dev/gang" for g in spec.get("schedulingGates") or [])
        pinned = pinned_node(pod) is not None
        return ("gated+pinned" if pinned else "gated") if gated else ("ungated+pinned" if pinned else "ungated")

    def see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.last[name] = pod
        seq = self.states.setdefault(name, [])
        s = self.state(pod)
        if not seq or seq[-1] != s:
            seq.append(s)


async def watch_pods(c: Cluster, history: PodHistory) -> None:
    client = c.sim.client()
    while True:
        try:
            async for ev in client.watch(kr.PODS, TENANT_NAMESPACE, resource_version="0", timeout_seconds=60):
                if ev.type in ("ADDED", "MODIFIED"):
                    history.see(ev.object)
        except (TimeoutError, KubeApiError, OSError):
            await asyncio.sleep(0.1)
