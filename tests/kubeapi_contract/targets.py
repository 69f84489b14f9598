"""Targets of the contract suite: the fake API server, or a real cluster from a kubeconfig.

A `Target` gives the same test an admin client, fresh namespaces, ServiceAccount clients and
kubernetes.aio configurations on either; fake-only knobs (small event window, page cap,
faults, partitions) are reached through `target.fake(...)`, which skips on a real cluster.
"""

from __future__ import annotations

import os
import ssl
import uuid
from pathlib import Path
from typing import Any

import pytest

from sim.kubeapi import KubeAPIServer
from tests.kubeapi_contract.kubehttp import KubeHTTP, eventually

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
REAL_ENV = "TANDEM_REAL_KUBECONFIG"


class Target:
    """One API server under test, with cleanup of what the test created."""

    def __init__(
        self,
        kind: str,
        url: str,
        admin: KubeHTTP,
        server: KubeAPIServer | None,
        ssl_context: ssl.SSLContext | None,
        aio_config: Any,
    ) -> None:
        self.kind = kind
        self.url = url
        self.admin = admin
        self.server = server
        self.ssl_context = ssl_context
        self._aio_config = aio_config
        self._clients: list[KubeHTTP] = []
        self._namespaces: list[str] = []
        self._cluster_paths: list[str] = []

    @property
    def is_fake(self) -> bool:
        return self.server is not None

    def fake(self, why: str) -> KubeAPIServer:
        """The fake server, for knobs a real cluster does not have; skips the test on a real cluster."""
        if self.server is None:
            pytest.skip(f"fake-only: {why}")
        return self.server

    async def namespace(self, prefix: str = "kc") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        reply = await self.admin.post(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        assert reply.status == 201, reply.body
        self._namespaces.append(name)
        # A real ServiceAccount controller adds "default" a moment later; pods need it (ServiceAccount admission).
        await eventually(lambda: self._has_default_account(name))
        return name

    async def _has_default_account(self, namespace: str) -> bool:
        return (await self.admin.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")).status == 200

    def created_cluster_object(self, path: str) -> None:
        """Remember a cluster-scoped object (node, priority class, RBAC) to delete at the end."""
        self._cluster_paths.append(path)

    def client(self, token: str | None) -> KubeHTTP:
        c = KubeHTTP(self.url, token, self.ssl_context)
        self._clients.append(c)
        return c

    async def service_account_client(self, namespace: str, name: str) -> KubeHTTP:
        """A client holding a token of that ServiceAccount, made as `kubectl create token` does (TokenRequest)."""
        created = await self.admin.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )
        assert created.status in (201, 409), created.body
        reply = await self.admin.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )
        assert reply.status == 201, reply.body
        return self.client(str(reply.obj["status"]["token"]))

    def aio_configuration(self, token: str | None = None) -> Any:
        """A kubernetes.aio Configuration for this target (admin unless a token is given)."""
        from kubernetes.aio import client as kclient

        if self.server is not None:
            return kclient.Configuration(
                host=self.url, api_key={"authorization": f"Bearer {token or self.server.admin_token}"}
            )
        cfg = kclient.Configuration()
        cfg.host = self._aio_config.host
        cfg.ssl_ca_cert = self._aio_config.ssl_ca_cert
        if token is None:
            cfg.cert_file, cfg.key_file = self._aio_config.cert_file, self._aio_config.key_file
            cfg.api_key = dict(self._aio_config.api_key)
        else:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        return cfg

    async def aclose(self) -> None:
        for path in reversed(self._cluster_paths):
            await self.admin.delete(path)
        for ns in self._namespaces:
            await self.admin.delete(f"/api/v1/namespaces/{ns}")
        for c in self._clients:
            await c.close()
        await self.admin.close()
        if self.server is not None:
            await self.server.stop()


async def start_fake(**kwargs: Any) -> Target:
    kwargs.setdefault("rbac_paths", [MANIFESTS])
    server = KubeAPIServer(**kwargs)
    await server.start()
    return Target("fake", server.url, KubeHTTP(server.url, server.admin_token), server, None, None)


async def start_real() -> Target:
    from kubernetes.aio import client as kclient
    from kubernetes.aio import config as kconfig

    cfg = kclient.Configuration()
    await kconfig.load_kube_config(config_file=os.environ[REAL_ENV], client_configuration=cfg)  # type: ignore[no-untyped-call]
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    bearer = (cfg.api_key or {}).get("authorization", "")
    token = bearer.removeprefix("Bearer ").strip() or None
    return Target("real", cfg.host, KubeHTTP(cfg.host, token, ctx), None, ctx, cfg)
