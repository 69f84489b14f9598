"""The broker as its own process for a fleet on one machine (`tandem-broker` on fixed ports, with the agents'
mutual-TLS listener), and the tenancy policy document that authorises a fleet's tenants."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from broker.launcher.client import BrokerClient
from broker.tenancy.policy import hash_token
from fleetsim.model import TenantSpec
from fleetsim.pki import Pki
from fleetsim.processes import REPO, Proc, free_port, wait_for

__all__ = ["BrokerEndpoint", "BrokerProcess", "tenancy_policy"]


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
            "token_sha256": [hash_token(tokens[t.name])],
            "weight": t.weight,
            "priority_bands": ["default", "high"],
            "rate_limit": {"rate_per_s": 10000, "burst": 10000},
        }  # launchers submit in bursts
        if t.quota:
            doc["quotas"] = {model: float(gpus) for model, gpus in t.quota}
        docs.append(doc)
    return {"tenants": docs, "admins": {"token_sha256": [hash_token(admin_token)]}}


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
