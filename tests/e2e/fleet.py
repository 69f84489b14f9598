"""A fleet on one machine: one real broker, and per cluster a local Kubernetes API server with its Job
controller, kube-scheduler stand-in and kubelet stand-in (`sim.cluster.SimCluster`), the real extender
and the real agent as separate processes, started the way the manifests start them
(`tandem-extender serve --kube`, `tandem-extender agent --kube`) and reaching their cluster through
`kubernetes.aio` with their own ServiceAccount tokens and the shipped RBAC.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from broker.client import BrokerClient
from tandem.v1 import job_pb2
from extender.agent.config import AgentConfig
from extender.agent.preflight import render_rbac
from extender.podreq import pinned_node
from sim import kuberesources as kr
from sim.cluster import SimCluster
from sim.realcluster import RealCluster
from sim.kubeclient import KubeApiError
from tests.broker.hub_builders import TOKENS, Broker, Pki, policy_doc, write_policy
from tests.fixtures import fixture_json

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
H100 = "NVIDIA-H100-80GB-HBM3"
TENANT_NAMESPACE = "team-a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_node(name: str, *, rack: str, zone: str = "zone-a", block: str = "b1", gpus: int = 8,
             hostname: str | None = None) -> dict[str, Any]:
    """A real-format HGX H100 node (the fixture's) renamed; its hostname label differs from its name, as on
    clouds that name nodes by instance id (the agent must pin by name, never by that label)."""
    base = next(o for o in fixture_json("cluster.json")["items"]
                if o["kind"] == "Node" and o["metadata"]["name"] == "h100-r1-n2")
    node: dict[str, Any] = copy.deepcopy(base)
    meta = node["metadata"]
    for k in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(k, None)
    meta["name"] = name
    meta["labels"].update({"kubernetes.io/hostname": hostname or f"h100-{rack}-{name.rsplit('-', 1)[-1]}",
                           "topology.kubernetes.io/zone": zone, "network.example.com/block": block,
                           "network.example.com/rack": rack, "nvidia.com/gpu.count": str(gpus)})
    for field_name in ("capacity", "allocatable"):
        node["status"][field_name]["nvidia.com/gpu"] = str(gpus)
    node["status"]["addresses"] = [{"type": "Hostname", "address": meta["labels"]["kubernetes.io/hostname"]}]
    return node


@dataclass
class Proc:
    """A child process with its output in a log file (shown when a test fails)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False
    """Stopped on purpose (a crash of it is not the test's failure)."""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        self.stopped = True
        if self.alive():
            self.popen.send_signal(sig)
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.alive():
            self.popen.kill()
            await asyncio.sleep(0.1)
        return self.popen.wait()


def spawn(name: str, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    out = log.open("ab")
    popen = subprocess.Popen([sys.executable, "-m", "extender.main", *args], cwd=REPO, env=full_env,
                             stdout=out, stderr=subprocess.STDOUT)
    return Proc(name, popen, log)


async def http_ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def wait_for(check: Any, timeout_s: float = 30.0, what: str = "condition", procs: Iterable[Proc] = ()) -> Any:
    """Poll an async or sync predicate; on timeout fail with the processes' last log lines."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        for p in procs:
            if not p.alive() and not p.stopped:
                raise AssertionError(f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n{p.tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        await asyncio.sleep(0.05)


class BrokerProcess:
    """The broker as its own process (`tandem-broker`), on fixed ports so agents find it again after a
    restart, with the agents' mutual-TLS listener and the database kept across restarts."""

    def __init__(self, tmp: Path, **config: Any) -> None:
        self.dir = tmp / "broker"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = Pki.create(self.dir)
        cert, key = self.pki.issue("broker", server=True)
        write_policy(self.dir / "policy.yaml", policy_doc())
        self.tenant_port, agent_port = free_port(), free_port()
        self.agent_addr = f"127.0.0.1:{agent_port}"
        self.config = {
            "tenant_listener": {"address": f"127.0.0.1:{self.tenant_port}"},
            "agent_listener": {"address": self.agent_addr, "max_message_bytes": 64 << 20,
                               "tls": {"cert_file": str(cert), "key_file": str(key),
                                       "client_ca_file": str(self.pki.dir / "test-root-ca.pem"),
                                       "require_client_cert": True}},
            "db_path": str(self.dir / "broker.db"), "policy_path": str(self.dir / "policy.yaml"),
            "metrics_port": 0, "heartbeat_interval_s": 1.0, **config,
        }
        (self.dir / "broker.yaml").write_text(yaml.safe_dump(self.config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.clients: list[BrokerClient] = []

    async def start(self) -> None:
        log = (self.dir / "broker.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "broker.main", "--config", str(self.dir / "broker.yaml")],
                                     cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        await wait_for(self._serving, 60, "the broker serving")

    async def _serving(self) -> bool:
        try:
            async with BrokerClient(f"127.0.0.1:{self.tenant_port}", token=TOKENS["admin"], timeout_s=2) as c:
                await c.list_clusters()
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    async def stop(self) -> None:
        for c in self.clients:
            await c.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            await asyncio.to_thread(self.proc.wait, 15)

    def client(self, who: str = "alpha") -> BrokerClient:
        c = BrokerClient(f"127.0.0.1:{self.tenant_port}", token=TOKENS[who], timeout_s=10)
        self.clients.append(c)
        return c

    async def cluster_ready(self, name: str) -> bool:
        try:
            listed = await self.client("admin").list_clusters()
        except Exception:  # noqa: BLE001 - restarting
            return False
        return any(c.name == name and c.connected and not c.stale and c.nodes for c in listed.clusters)


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


@dataclass
class Cluster:
    """One cluster of the fleet: its simulated control plane, extender and agents."""

    name: str
    sim: SimCluster | RealCluster
    dir: Path
    agent_config: Path
    agent_kubeconfig: Path
    extender: Proc | None = None
    agents: list[Proc] = field(default_factory=list)
    agent_ports: list[int] = field(default_factory=list)

    @property
    def procs(self) -> list[Proc]:
        return [p for p in [self.extender, *self.agents] if p is not None]

    def start_agent(self) -> Proc:
        """One more agent replica (its own health port and Lease identity)."""
        port = free_port()
        n = len(self.agents)
        proc = spawn(f"{self.name}-agent-{n}", ["agent", "--kube", "--kubeconfig", str(self.agent_kubeconfig),
                                                "--config", str(self.agent_config), "--listen", f"127.0.0.1:{port}"],
                     self.dir / f"agent-{n}.log", env={"POD_NAME": f"tandem-agent-{self.name}-{n}"})
        self.agents.append(proc)
        self.agent_ports.append(port)
        return proc

    async def agent_ready(self, i: int) -> bool:
        return await http_ok(f"http://127.0.0.1:{self.agent_ports[i]}/readyz")

    async def stop(self) -> None:
        for p in self.procs:
            await p.stop()
        await self.sim.stop()


async def start_cluster(name: str, nodes: Sequence[dict[str, Any]], broker: Broker | AnyBroker, tmp: Path, *,
                        agents: int = 1, tenants: dict[str, list[str]] | None = None,
                        lease: dict[str, float] | None = None, agent_extra: dict[str, Any] | None = None,
                        kubelet_auto_run: bool = False, cert_name: str | None = None,
                        sim_options: dict[str, Any] | None = None, wait_connected: bool = True,
                        real_kubeconfig: str | None = None) -> Cluster:
    """Start one cluster and connect it to the broker (the agent dials the broker's agent listener).

    With `real_kubeconfig` the cluster is a real control plane (`sim.realcluster`): its kube-scheduler must
    call the extender at TANDEM_REAL_EXTENDER_URL, where the extender is started (listening on
    TANDEM_REAL_EXTENDER_LISTEN)."""
    hub = InProcessBroker(broker) if isinstance(broker, Broker) else broker
    d = tmp / name
    d.mkdir(parents=True)
    sim: SimCluster | RealCluster
    if real_kubeconfig:
        sim = RealCluster(real_kubeconfig, nodes, extender_url=os.environ.get("TANDEM_REAL_EXTENDER_URL", ""),
                          kubelet_auto_run=kubelet_auto_run)
    else:
        sim = SimCluster(nodes, manifests=MANIFESTS, kubelet_auto_run=kubelet_auto_run, **(sim_options or {}))
    await sim.start()
    tenants = tenants or {"alpha": [TENANT_NAMESPACE]}
    for ns in sorted({n for v in tenants.values() for n in v}):  # labelled as the agent's start checks want
        await sim.create_namespace(ns, labels={"pod-security.kubernetes.io/enforce": "baseline",
                                               "tandem.dev/tenant-namespace": "true"})
    # What an operator applies: the agent's manifests, then the RoleBindings render-rbac prints.
    for doc in yaml.safe_load_all((MANIFESTS / "base" / "agent-rbac.yaml").read_text()):
        await sim.apply(doc)
    for doc in yaml.safe_load_all((MANIFESTS / "base" / "agent.yaml").read_text()):
        if doc["kind"] == "ServiceAccount":
            await sim.apply(doc)
    listen = os.environ.get("TANDEM_REAL_EXTENDER_LISTEN", "0.0.0.0:8888") if real_kubeconfig else ""
    ext_port = int(listen.rpartition(":")[2]) if listen else free_port()
    ext_cfg = {"listen": listen or f"127.0.0.1:{ext_port}", "url_prefix": "/tandem",
               "scheduler_name": "tandem-scheduler", "log_level": "INFO"}
    (d / "extender.yaml").write_text(yaml.safe_dump(ext_cfg))
    sched_token = await sim.service_account_token("tandem-system", "tandem-scheduler")
    sim.kubeconfig(d / "extender.kubeconfig", sched_token)
    agent_token = await sim.service_account_token("tandem-system", "tandem-agent")
    sim.kubeconfig(d / "agent.kubeconfig", agent_token)
    cert, key = hub.pki.issue(cert_name or name)
    agent_cfg: dict[str, Any] = {
        "cluster_name": name, "region": "eu-west", "role": "training", "broker": hub.agent_addr,
        "tls_cert_file": str(cert), "tls_key_file": str(key), "tls_ca_file": str(hub.pki.dir / "test-root-ca.pem"),
        "tls_server_name": "localhost", "tenants": tenants, "coalesce_s": 0.1, "heartbeat_s": 1.0,
        "reconnect_base_s": 0.2, "reconnect_cap_s": 2.0, "finished_retention_s": 0.0,
        "lease": lease or {"duration_s": 4.0, "renew_deadline_s": 3.0, "retry_period_s": 0.5},
        "log_url_templates": {"logs": "https://logs.example.com/{cluster}/{namespace}/{pod}"},
        "extender": {"scheduler_name": "tandem-scheduler", "log_level": "INFO"},
        **(agent_extra or {}),
    }
    (d / "agent.yaml").write_text(yaml.safe_dump(agent_cfg))
    for doc in yaml.safe_load_all(render_rbac(AgentConfig.model_validate(agent_cfg))):
        await sim.apply(doc)
    cluster = Cluster(name, sim, d, d / "agent.yaml", d / "agent.kubeconfig")
    cluster.extender = spawn(f"{name}-extender", ["serve", "--kube", "--config", str(d / "extender.yaml")],
                             d / "extender.log", env={"KUBECONFIG": str(d / "extender.kubeconfig")})
    await wait_for(lambda: http_ok(f"http://127.0.0.1:{ext_port}/readyz"), 60, f"{name} extender ready",
                   cluster.procs)
    sim.set_extender_url(f"http://127.0.0.1:{ext_port}")
    for _ in range(agents):
        cluster.start_agent()
    if wait_connected:
        await wait_for(lambda: hub.cluster_ready(name), 60, f"{name} agent connected with a snapshot", cluster.procs)
    return cluster


def job_template(gpus: int, *, cpu: str = "16", memory: str = "64Gi", extra: dict[str, str] | None = None,
                 **spec: Any) -> str:
    """A pod template whose requests equal the shape (the broker refuses one that differs)."""
    requests = {"cpu": cpu, "memory": memory, **(extra or {})}
    container = {"name": "trainer", "image": "registry.example.com/llm/trainer:2026.11",
                 "command": ["torchrun", "train.py"],
                 "resources": {"requests": requests, "limits": {"nvidia.com/gpu": str(gpus), **requests}}}
    template = {"metadata": {"labels": {"team": "llm"}},
                "spec": {"containers": [container],
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                         **spec}}
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
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "registry.example.com/inference:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


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
        except (KubeApiError, asyncio.TimeoutError, OSError):
            await asyncio.sleep(0.1)
