"""One cluster of a fleet on one machine: a local Kubernetes API server with its Job controller, kube-scheduler
stand-in and kubelet stand-in (`sim.cluster.SimCluster`), the real extender and the real agent as separate processes,
started the way the manifests start them (`tandem-extender serve --kube`, `tandem-extender agent --kube`) and reaching
their cluster through `kubernetes.aio` with their own ServiceAccount tokens and the shipped RBAC, connected to a
broker (`fleetsim.broker_process`).

Used by wire mode (`fleetsim.wire`), the end-to-end tests and the fleet benchmark.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetplan.catalog import Level
from fleetsim.broker_process import BrokerEndpoint
from fleetsim.processes import REPO, Proc, free_port, http_ok, spawn, wait_for
from sim.cluster import SimCluster
from sim.realcluster import RealCluster

__all__ = ["MANIFESTS", "TENANT_NAMESPACE_LABELS", "Cluster", "start_cluster", "topology_keys"]

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
