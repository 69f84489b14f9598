"""A real Kubernetes control plane seen through the same calls as `SimCluster`, for `make e2e-real`.

The control plane (kube-apiserver, kube-controller-manager, the `tandem-scheduler` kube-scheduler running
the shipped KubeSchedulerConfiguration) is real; there is no kubelet, so the kubelet stand-in
(`sim.kubelet`, an ordinary API client) creates the test's Nodes, renews their Leases, runs their pods
and finishes their deletions (FLEET-NOTES A-20). Tokens are minted with the TokenRequest API for the
agent's and the extender's own ServiceAccounts, so RBAC gaps surface as they would in production.

What the caller must provide: a kubeconfig with cluster-admin rights (`TANDEM_REAL_KUBECONFIG`), the
shipped manifests applied (`kubectl apply -k manifests/`), and the Tandem scheduler's extender `urlPrefix`
pointing where the test runs the extender (`set_extender_url` checks it: the real scheduler's config is
not the test's to change).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sim import kuberesources as kr
from sim.kubeclient import KubeApiError, KubeClient
from sim.kubeconfig import Credentials, load_kubeconfig
from sim.kubelet import Kubelet

__all__ = ["RealCluster"]

log = logging.getLogger("tandem.sim.realcluster")

JSON = dict[str, Any]


class RealCluster:
    """`start()` registers the test's nodes and runs the kubelet stand-in; `stop()` removes what it made."""

    def __init__(
        self,
        kubeconfig: str | Path,
        nodes: Sequence[JSON],
        *,
        extender_url: str = "",
        kubelet_auto_run: bool = False,
        heartbeat_interval_s: float = 10.0,
    ) -> None:
        self.creds: Credentials = load_kubeconfig(kubeconfig)
        self.url = self.creds.server
        self._nodes = list(nodes)
        self.extender_url = extender_url
        self.admin = KubeClient(self.url, credentials=self.creds, user_agent="tandem-e2e-admin")
        self.kubelet = Kubelet(
            KubeClient(self.url, credentials=self.creds, user_agent="tandem-kubelet-standin"),
            self._nodes,
            heartbeat_interval_s=heartbeat_interval_s,
            auto_run=kubelet_auto_run,
        )
        self._clients: list[KubeClient] = [self.admin, self.kubelet.client]
        self._created: list[tuple[kr.Resource, str, str | None]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.kubelet.run(), name="kubelet-standin")
        await asyncio.wait_for(self.kubelet.registered.wait(), 60)
        self._created += [(kr.NODES, str(n["metadata"]["name"]), None) for n in self._nodes]

    async def stop(self) -> None:
        for res, name, ns in reversed(self._created):
            with contextlib.suppress(KubeApiError):
                await self.admin.delete(res, name, ns)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for c in self._clients:
            await c.close()

    def set_extender_url(self, url: str | None) -> None:
        """The real kube-scheduler calls the extender its own configuration names: check it is this one."""
        if url and self.extender_url and url.rstrip("/") != self.extender_url.rstrip("/"):
            raise RuntimeError(
                f"the cluster's tandem-scheduler calls {self.extender_url}; the test runs the "
                f"extender at {url}: set TANDEM_REAL_EXTENDER_URL / the listen address to match"
            )

    def client(self, token: str | None = None, user_agent: str = "tandem-e2e") -> KubeClient:
        creds = (
            self.creds
            if token is None
            else Credentials(
                self.url,
                token=token,
                ca_pem=self.creds.ca_pem,
                insecure_skip_tls_verify=self.creds.insecure_skip_tls_verify,
            )
        )
        c = KubeClient(self.url, credentials=creds, user_agent=user_agent)
        self._clients.append(c)
        return c

    async def apply(self, obj: JSON) -> JSON:
        """Create as cluster-admin (an existing object is kept and returned); remembered for `stop`."""
        res = kr.resource_for(obj)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") if res.namespaced else None
        try:
            out = await self.admin.create(res, obj, ns)
        except KubeApiError as e:
            if not e.already_exists:
                raise
            return await self.admin.get(res, str(meta["name"]), ns)
        if obj.get("kind") in ("Namespace", "RoleBinding", "ClusterRoleBinding"):
            self._created.append((res, str(meta["name"]), ns))
        return out

    async def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> JSON:
        body: JSON = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
        return await self.apply(body)

    async def service_account_token(self, namespace: str, name: str, expiration_s: int = 3600) -> str:
        """A TokenRequest for that ServiceAccount (created if missing)."""
        await self.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
        )
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_s},
        }
        out = await self.admin.create_subresource(kr.SERVICE_ACCOUNTS, name, "token", review, namespace)
        return str(out["status"]["token"])

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig for this cluster with that token (the admin's credentials when None)."""
        cluster: JSON = {"server": self.url}
        if self.creds.ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(self.creds.ca_pem).decode()
        if self.creds.insecure_skip_tls_verify:
            cluster["insecure-skip-tls-verify"] = True
        user: JSON = {"token": token or self.creds.token or ""}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "tandem",
            "clusters": [{"name": "tandem", "cluster": cluster}],
            "users": [{"name": "tandem", "user": user}],
            "contexts": [{"name": "tandem", "context": {"cluster": "tandem", "user": "tandem"}}],
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path
