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

from extender.agent.config import AgentConfig
from extender.agent.preflight import render_rbac
from sim.cluster import SimCluster
from tests.broker.hub_builders import Broker
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

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
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
            if not p.alive():
                raise AssertionError(f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n{p.tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        await asyncio.sleep(0.05)


@dataclass
class Cluster:
    """One cluster of the fleet: its simulated control plane, extender and agents."""

    name: str
    sim: SimCluster
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


async def start_cluster(name: str, nodes: Sequence[dict[str, Any]], broker: Broker, tmp: Path, *,
                        agents: int = 1, tenants: dict[str, list[str]] | None = None,
                        lease: dict[str, float] | None = None, agent_extra: dict[str, Any] | None = None,
                        kubelet_auto_run: bool = False) -> Cluster:
    """Start one cluster and connect it to the broker (the agent dials the broker's agent listener)."""
    d = tmp / name
    d.mkdir(parents=True)
    sim = SimCluster(nodes, manifests=MANIFESTS, kubelet_auto_run=kubelet_auto_run)
    await sim.start()
    tenants = tenants or {"alpha": [TENANT_NAMESPACE]}
    for ns in sorted({n for v in tenants.values() for n in v}):
        await sim.create_namespace(ns)
    # What an operator applies: the agent's manifests, then the RoleBindings render-rbac prints.
    for doc in yaml.safe_load_all((MANIFESTS / "base" / "agent-rbac.yaml").read_text()):
        await sim.apply(doc)
    for doc in yaml.safe_load_all((MANIFESTS / "base" / "agent.yaml").read_text()):
        if doc["kind"] == "ServiceAccount":
            await sim.apply(doc)
    ext_port = free_port()
    ext_cfg = {"listen": f"127.0.0.1:{ext_port}", "url_prefix": "/tandem", "scheduler_name": "tandem-scheduler",
               "log_level": "INFO"}
    (d / "extender.yaml").write_text(yaml.safe_dump(ext_cfg))
    sched_token = await sim.service_account_token("tandem-system", "tandem-scheduler")
    sim.kubeconfig(d / "extender.kubeconfig", sched_token)
    agent_token = await sim.service_account_token("tandem-system", "tandem-agent")
    sim.kubeconfig(d / "agent.kubeconfig", agent_token)
    cert, key = broker.pki.issue(name)
    agent_cfg: dict[str, Any] = {
        "cluster_name": name, "region": "eu-west", "role": "training", "broker": broker.agent_addr,
        "tls_cert_file": str(cert), "tls_key_file": str(key), "tls_ca_file": str(broker.pki.dir / "test-root-ca.pem"),
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
    await wait_for(lambda: (e := broker.hub.catalog.clusters.get(name)) is not None and e.has_snapshot
                   and e.connected, 60, f"{name} agent connected with a snapshot", cluster.procs)
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
