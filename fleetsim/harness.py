"""A fleet on one machine: the real broker as its own process, and per cluster a local Kubernetes API server with
its Job controller, kube-scheduler stand-in and kubelet stand-in (`sim.cluster.SimCluster`), the real extender
and the real agent as separate processes, started the way the manifests start them
(`tandem-extender serve --kube`, `tandem-extender agent --kube`) and reaching their cluster through
`kubernetes.aio` with their own ServiceAccount tokens and the shipped RBAC.

Used by wire mode (`fleetsim.wire`), the end-to-end tests and the fleet benchmark.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import yaml

from broker.launcher.client import BrokerClient
from fleetsim.model import Level, TenantSpec
from fleetsim.pki import Pki
from sim.cluster import SimCluster
from sim.realcluster import RealCluster

__all__ = [
    "MANIFESTS",
    "REPO",
    "TENANT_NAMESPACE_LABELS",
    "BrokerEndpoint",
    "BrokerProcess",
    "Cluster",
    "Proc",
    "WaitFailed",
    "free_port",
    "http_ok",
    "spawn",
    "start_cluster",
    "tenancy_policy",
    "topology_keys",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
TENANT_NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "baseline", "tandem.dev/tenant-namespace": "true"}
"""What the agent's start checks want on a tenant namespace (FLEET-NOTES H-1, H-2)."""
_TOPOLOGY_FIELDS = {
    "zone": "zone",
    "block": "block",
    "rack": "rack",
    "nvlink": "clique",
    "clique": "clique",
    "host": "hostname",
    "hostname": "hostname",
}
"""Level name -> the agent's `extender.topology` field holding its label key (the agent reports the levels
under its own names: zone, block, rack, nvlink, host)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WaitFailed(AssertionError):
    """A condition was not reached in time, or a process it needs exited (an AssertionError, so a test that
    waits on it fails rather than errors)."""


@dataclass
class Proc:
    """A child process with its output in a log file (shown when a wait fails)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False
    """Stopped on purpose (a crash of it is not a failure)."""

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


def spawn(name: str, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> Proc:
    """`tandem-extender <args>` as a child process, its output appended to `log`."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "extender.main", *args], cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT
        )
    return Proc(name, popen, log)


async def http_ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def wait_for(
    check: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition", procs: Iterable[Proc] = ()
) -> Any:
    """Poll an async or sync predicate until truthy (and return its value); WaitFailed with the processes'
    last log lines on timeout or when one of them exits."""
    procs = list(procs)
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        for p in procs:
            if not p.alive() and not p.stopped:
                raise WaitFailed(f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n{p.tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
            raise WaitFailed(f"timed out waiting for {what}\n{logs}")
        await asyncio.sleep(0.05)


class BrokerEndpoint(Protocol):
    """What a cluster needs of a broker: its CA, its agent listener, and whether a cluster is connected."""

    @property
    def pki(self) -> Pki: ...

    @property
    def agent_addr(self) -> str: ...

    def cluster_ready(self, name: str) -> Awaitable[bool]: ...


def tenancy_policy(tenants: Sequence[TenantSpec], tokens: Mapping[str, str], admin_token: str) -> dict[str, Any]:
    """The broker's policy document for these tenants (weights, quotas), each with its bearer token."""
    docs: list[dict[str, Any]] = []
    for t in tenants:
        doc: dict[str, Any] = {
            "name": t.name,
            "token_sha256": [_sha256(tokens[t.name])],
            "weight": t.weight,
            "priority_bands": ["default", "high"],
            "rate_limit": {"rate_per_s": 10000, "burst": 10000},
        }  # launchers submit in bursts
        if t.quota:
            doc["quotas"] = {model: float(gpus) for model, gpus in t.quota}
        docs.append(doc)
    return {"tenants": docs, "admins": {"token_sha256": [_sha256(admin_token)]}}


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class BrokerProcess:
    """The broker as its own process (`tandem-broker`), on fixed ports so agents find it again after a
    restart, with the agents' mutual-TLS listener and the database kept across restarts.

    `tokens` maps principal names (tenants, and `admin`) to bearer tokens; `policy` is the tenancy policy
    document that authorises them (see `tenancy_policy`)."""

    def __init__(
        self, tmp: Path, policy: Mapping[str, Any], tokens: Mapping[str, str], *, admin: str = "admin", **config: Any
    ) -> None:
        self.dir = tmp / "broker"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tokens = dict(tokens)
        self.admin = admin
        self.pki = Pki.create(self.dir)
        cert, key = self.pki.issue("broker", server=True)
        (self.dir / "policy.yaml").write_text(yaml.safe_dump(dict(policy)))
        self.tenant_port, agent_port = free_port(), free_port()
        self.tenant_addr = f"127.0.0.1:{self.tenant_port}"
        self.agent_addr = f"127.0.0.1:{agent_port}"
        self.config = {
            "tenant_listener": {"address": self.tenant_addr},
            "agent_listener": {
                "address": self.agent_addr,
                "max_message_bytes": 64 << 20,
                "tls": {
                    "cert_file": str(cert),
                    "key_file": str(key),
                    "client_ca_file": str(self.pki.ca_file),
                    "require_client_cert": True,
                },
            },
            "db_path": str(self.dir / "broker.db"),
            "policy_path": str(self.dir / "policy.yaml"),
            "metrics_port": 0,
            "heartbeat_interval_s": 1.0,
            **config,
        }
        (self.dir / "broker.yaml").write_text(yaml.safe_dump(self.config))
        self.log = self.dir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.clients: list[BrokerClient] = []

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker.main", "--config", str(self.dir / "broker.yaml")],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        await wait_for(self._serving, 60, "the broker serving", [self.as_proc()])

    def as_proc(self) -> Proc:
        """The running broker seen as a `Proc` (for `wait_for`'s crash check and log tail)."""
        assert self.proc is not None
        return Proc("broker", self.proc, self.log)

    async def _serving(self) -> bool:
        try:
            async with BrokerClient(self.tenant_addr, token=self.tokens[self.admin], timeout_s=2) as c:
                await c.list_clusters()
            return True
        except Exception:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    async def stop(self) -> None:
        for c in self.clients:
            await c.close()
        self.clients.clear()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait, 5)

    def client(self, who: str, **kw: Any) -> BrokerClient:
        """A client acting as `who` (closed with the broker)."""
        c = BrokerClient(self.tenant_addr, token=self.tokens[who], **{"timeout_s": 10.0, **kw})
        self.clients.append(c)
        return c

    async def cluster_ready(self, name: str) -> bool:
        try:
            listed = await self.client(self.admin).list_clusters()
        except Exception:
            return False
        return any(c.name == name and c.connected and not c.stale and c.nodes for c in listed.clusters)


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
        proc = spawn(
            f"{self.name}-agent-{n}",
            [
                "agent",
                "--kube",
                "--kubeconfig",
                str(self.agent_kubeconfig),
                "--config",
                str(self.agent_config),
                "--listen",
                f"127.0.0.1:{port}",
            ],
            self.dir / f"agent-{n}.log",
            env={"POD_NAME": f"tandem-agent-{self.name}-{n}"},
        )
        self.agents.append(proc)
        self.agent_ports.append(port)
        return proc

    async def agent_ready(self, i: int) -> bool:
        return await http_ok(f"http://127.0.0.1:{self.agent_ports[i]}/readyz")

    async def stop(self) -> None:
        for p in self.procs:
            await p.stop()
        await self.sim.stop()


def topology_keys(levels: Sequence[Level]) -> dict[str, str]:
    """The agent's `extender.topology` settings for a cluster's levels (no levels: the shipped label keys;
    otherwise the levels it does not name are switched off); a level name the agent has no place for is refused."""
    out: dict[str, str] = {}
    for level in levels:
        fname = _TOPOLOGY_FIELDS.get(level.name)
        if fname is None:
            raise ValueError(f"topology level {level.name!r}: the agent knows only {sorted(set(_TOPOLOGY_FIELDS))}")
        out[fname] = level.key
    if out:  # levels the cluster does not have are switched off (a node lacking one would stand alone below it)
        for fname in set(_TOPOLOGY_FIELDS.values()) - set(out) - {"hostname"}:
            out[fname] = ""
    return out


async def _render_rbac(agent_config: Path) -> list[dict[str, Any]]:
    """`tandem-extender render-rbac --config agent.yaml`, as an operator runs it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "extender.main",
        "render-rbac",
        "--config",
        str(agent_config),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate()
    except BaseException:  # cancelled: leave no child behind
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"render-rbac failed ({proc.returncode}): {err.decode(errors='replace')}")
    return [d for d in yaml.safe_load_all(out.decode()) if isinstance(d, dict)]


async def start_cluster(
    name: str,
    nodes: Sequence[dict[str, Any]],
    broker: BrokerEndpoint,
    tmp: Path,
    *,
    tenants: Mapping[str, Sequence[str]],
    region: str = "eu-west",
    role: str = "training",
    levels: Sequence[Level] = (),
    agents: int = 1,
    lease: dict[str, float] | None = None,
    agent_extra: dict[str, Any] | None = None,
    kubelet_auto_run: bool = False,
    cert_name: str | None = None,
    sim_options: dict[str, Any] | None = None,
    wait_connected: bool = True,
    real_kubeconfig: str | None = None,
) -> Cluster:
    """Start one cluster and connect it to the broker (the agent dials the broker's agent listener).

    `tenants` maps each tenant to the namespaces this cluster gives it (created, labelled as the agent wants);
    `region`, `role` and `levels` are what the agent reports in its Hello.

    With `real_kubeconfig` the cluster is a real control plane (`sim.realcluster`): its kube-scheduler must
    call the extender at TANDEM_REAL_EXTENDER_URL, where the extender is started (listening on
    TANDEM_REAL_EXTENDER_LISTEN)."""
    d = tmp / name
    d.mkdir(parents=True)
    sim: SimCluster | RealCluster
    if real_kubeconfig:
        sim = RealCluster(
            real_kubeconfig,
            nodes,
            extender_url=os.environ.get("TANDEM_REAL_EXTENDER_URL", ""),
            kubelet_auto_run=kubelet_auto_run,
        )
    else:
        sim = SimCluster(nodes, manifests=MANIFESTS, kubelet_auto_run=kubelet_auto_run, **(sim_options or {}))
    await sim.start()
    cluster = Cluster(name, sim, d, d / "agent.yaml", d / "agent.kubeconfig")
    try:
        await _install(
            cluster,
            broker,
            tenants=tenants,
            region=region,
            role=role,
            levels=levels,
            agents=agents,
            lease=lease,
            agent_extra=agent_extra,
            cert_name=cert_name,
            real=bool(real_kubeconfig),
            wait_connected=wait_connected,
        )
    except BaseException:
        await cluster.stop()
        raise
    return cluster


async def _install(
    cluster: Cluster,
    broker: BrokerEndpoint,
    *,
    tenants: Mapping[str, Sequence[str]],
    region: str,
    role: str,
    levels: Sequence[Level],
    agents: int,
    lease: dict[str, float] | None,
    agent_extra: dict[str, Any] | None,
    cert_name: str | None,
    real: bool,
    wait_connected: bool,
) -> None:
    """What an operator does to a cluster: namespaces, the agent's manifests, configs, RoleBindings, then the
    extender and the agents."""
    name, sim, d = cluster.name, cluster.sim, cluster.dir
    for ns in sorted({n for v in tenants.values() for n in v}):
        await sim.create_namespace(ns, labels=TENANT_NAMESPACE_LABELS)
    for doc in yaml.safe_load_all((MANIFESTS / "base" / "agent-rbac.yaml").read_text()):
        await sim.apply(doc)
    for doc in yaml.safe_load_all((MANIFESTS / "base" / "agent.yaml").read_text()):
        if doc["kind"] == "ServiceAccount":
            await sim.apply(doc)
    listen = os.environ.get("TANDEM_REAL_EXTENDER_LISTEN", "0.0.0.0:8888") if real else ""
    ext_port = int(listen.rpartition(":")[2]) if listen else free_port()
    extender_settings: dict[str, Any] = {"scheduler_name": "tandem-scheduler", "log_level": "INFO"}
    topology = topology_keys(levels)
    if topology:
        extender_settings["topology"] = topology
    ext_cfg = {"listen": listen or f"127.0.0.1:{ext_port}", "url_prefix": "/tandem", **extender_settings}
    (d / "extender.yaml").write_text(yaml.safe_dump(ext_cfg))
    sched_token = await sim.service_account_token("tandem-system", "tandem-scheduler")
    sim.kubeconfig(d / "extender.kubeconfig", sched_token)
    agent_token = await sim.service_account_token("tandem-system", "tandem-agent")
    sim.kubeconfig(cluster.agent_kubeconfig, agent_token)
    cert, key = broker.pki.issue(cert_name or name)
    agent_cfg: dict[str, Any] = {
        "cluster_name": name,
        "region": region,
        "role": role,
        "broker": broker.agent_addr,
        "tls_cert_file": str(cert),
        "tls_key_file": str(key),
        "tls_ca_file": str(broker.pki.ca_file),
        "tls_server_name": "localhost",
        "tenants": {t: list(ns) for t, ns in tenants.items()},
        "coalesce_s": 0.1,
        "heartbeat_s": 1.0,
        "reconnect_base_s": 0.2,
        "reconnect_cap_s": 2.0,
        "finished_retention_s": 0.0,
        "lease": lease or {"duration_s": 4.0, "renew_deadline_s": 3.0, "retry_period_s": 0.5},
        "log_url_templates": {"logs": "https://logs.example.com/{cluster}/{namespace}/{pod}"},
        "extender": extender_settings,
        **(agent_extra or {}),
    }
    cluster.agent_config.write_text(yaml.safe_dump(agent_cfg))
    cluster.extender = spawn(
        f"{name}-extender",
        ["serve", "--kube", "--config", str(d / "extender.yaml")],
        d / "extender.log",
        env={"KUBECONFIG": str(d / "extender.kubeconfig")},
    )
    for doc in await _render_rbac(cluster.agent_config):  # while the extender starts
        await sim.apply(doc)
    await wait_for(lambda: http_ok(f"http://127.0.0.1:{ext_port}/readyz"), 60, f"{name} extender ready", cluster.procs)
    sim.set_extender_url(f"http://127.0.0.1:{ext_port}")
    for _ in range(agents):
        cluster.start_agent()
    if wait_connected:
        await wait_for(lambda: broker.cluster_ready(name), 60, f"{name} agent connected with a snapshot", cluster.procs)
