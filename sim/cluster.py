"""One simulated Kubernetes cluster on loopback: the fake API server plus its controllers, started together.

``async with SimCluster(nodes=..., manifests=Path("manifests")) as c:`` starts a
``sim.kubeapi.KubeAPIServer`` on 127.0.0.1, bootstraps it through the API as an installer would
(namespaces ``kube-system``, ``kube-node-lease``, ``default``, ``tandem-system``; the shipped
PriorityClasses, ServiceAccount and RBAC; the controller identities of ``sim.identities``),
then runs, each with its own ServiceAccount token: the Job controller, PodGC, the scheduler
stand-in (the shipped ``tandem-scheduler`` profile and extender settings) and the kubelet stand-in
for ``nodes``. The extender is started by the caller once the API server exists; point the
scheduler at it with ``c.set_extender_url("http://127.0.0.1:PORT")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml

from sim import identities as ids
from sim import kuberesources as kr
from sim.jobcontroller import JobController
from sim.kubeapi import KubeAPIServer, write_kubeconfig
from sim.kubeclient import KubeApiError, KubeClient
from sim.kubelet import Kubelet
from sim.podgc import PodGC
from sim.schedconfig import SchedulerProfile, load_profile
from sim.scheduler import Scheduler

__all__ = ["ControllerSettings", "SimCluster", "SCHEDULER_NAME", "eventually"]

log = logging.getLogger("tandem.sim.cluster")

JSON = dict[str, Any]
SCHEDULER_NAME = "tandem-scheduler"
SYSTEM_NAMESPACES = ("kube-system", "kube-node-lease", "default")
_SHIPPED = ("namespace.yaml", "serviceaccount.yaml", "priorityclasses.yaml", "rbac.yaml")
_SCHEDULER_SA = ("tandem-system", "tandem-scheduler")


T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T | None]], timeout_s: float = 20.0, interval_s: float = 0.02) -> T:
    """Poll ``check`` until it returns something truthy (and return that); TimeoutError with the last value.

    For tests and harnesses: wait for a condition instead of sleeping for a guessed time.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s (last value: {value!r})")
        await asyncio.sleep(interval_s)


def _documents(path: Path) -> list[JSON]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """Knobs of the simulated controllers (defaults suit tests: short scheduler back-off)."""

    scheduler_backoff_s: tuple[float, float] = (0.05, 0.5)
    """kube-scheduler's podInitialBackoffSeconds / podMaxBackoffSeconds (upstream 1 s / 10 s)."""
    unschedulable_timeout_s: float = 5.0
    """How long a rejected pod waits without a cluster event before it is retried (upstream 5 min)."""
    heartbeat_interval_s: float = 10.0
    """Node Lease renewal and status period of the kubelet stand-in, seconds."""
    kubelet_auto_run: bool = True
    """Bound pods go Running by themselves."""
    job_controller_qps: tuple[float, int] = (20.0, 30)
    """The controller-manager's --kube-api-qps / --kube-api-burst for the Job controller's writes."""
    pod_failure_backoff_s: float = 10.0
    """First delay before a Job replaces a failed pod (doubles per failure, capped at 6 min)."""


class SimCluster:
    """A whole cluster: ``url``, ``admin`` (a cluster-admin client), and the running controllers."""

    def __init__(
        self,
        nodes: Sequence[JSON] = (),
        *,
        resource_slices: Sequence[JSON] = (),
        manifests: Path | None = None,
        extender_url: str | None = None,
        scheduler_profile: SchedulerProfile | None = None,
        scheduler_backoff_s: tuple[float, float] = (0.05, 0.5),
        unschedulable_timeout_s: float = 5.0,
        heartbeat_interval_s: float = 10.0,
        kubelet_auto_run: bool = True,
        job_controller_qps: tuple[float, int] = (20.0, 30),
        pod_failure_backoff_s: float = 10.0,
        seed: int = 0,
        server_options: Mapping[str, Any] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.manifests = manifests
        self._nodes = list(nodes)
        self._slices = list(resource_slices)
        self._extender_url = extender_url
        if scheduler_profile is None:
            if manifests is None:
                raise ValueError("give manifests (for the shipped scheduler configuration) or a scheduler_profile")
            scheduler_profile = load_profile(manifests / "base" / "scheduler-config.yaml", SCHEDULER_NAME)
        self.profile = scheduler_profile
        self.settings = ControllerSettings(
            scheduler_backoff_s=scheduler_backoff_s,
            unschedulable_timeout_s=unschedulable_timeout_s,
            heartbeat_interval_s=heartbeat_interval_s,
            kubelet_auto_run=kubelet_auto_run,
            job_controller_qps=job_controller_qps,
            pod_failure_backoff_s=pod_failure_backoff_s,
        )
        self._seed = seed
        self._host = host
        self.server = KubeAPIServer(seed=seed, **dict(server_options or {}))
        self.url = ""
        self.admin: KubeClient | None = None
        self.job_controller: JobController | None = None
        self.podgc: PodGC | None = None
        self.scheduler: Scheduler | None = None
        self.kubelet: Kubelet | None = None
        self._clients: list[KubeClient] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.server.start(self._host, 0)
        self.url = self.server.url
        self.admin = self._client(self.server.admin_token, "sim-admin")
        try:
            await self._bootstrap()
            await self._start_controllers()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for client in self._clients:
            await client.close()
        self._clients.clear()
        await self.server.stop()

    def _client(self, token: str, agent: str) -> KubeClient:
        client = KubeClient(self.url, token, user_agent=agent)
        self._clients.append(client)
        return client

    def _run(self, name: str, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._report_crash)
        self._tasks.append(task)

    @staticmethod
    def _report_crash(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("simulated controller stopped", exc_info=task.exception(), extra={"task": task.get_name()})

    async def _bootstrap(self) -> None:
        """What an installer does: system namespaces, the shipped objects, the controller identities."""
        for ns in SYSTEM_NAMESPACES:
            await self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        if self.manifests is not None:
            for name in _SHIPPED:
                for doc in _documents(self.manifests / "base" / name):
                    await self.apply(doc)
        else:
            await self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": _SCHEDULER_SA[0]}})
            await self.apply(ids.service_account(*_SCHEDULER_SA))
            scheduler = ids.Identity(*_SCHEDULER_SA, "system:kube-scheduler")
            await self.apply(ids.cluster_role_binding(scheduler) | {"metadata": {"name": "sim-tandem-scheduler"}})
        for identity in ids.CONTROLLER_IDENTITIES:
            await self.apply(ids.service_account(identity.namespace, identity.name))
            if identity.rules:
                await self.apply(ids.cluster_role(identity))
            await self.apply(ids.cluster_role_binding(identity))

    async def _start_controllers(self) -> None:
        o = self.settings
        qps, burst = o.job_controller_qps
        job_client = self._client(self.token_for(ids.JOB_CONTROLLER), "kube-controller-manager/job")
        self.job_controller = JobController(
            job_client, qps=qps, burst=burst, pod_failure_backoff_s=o.pod_failure_backoff_s
        )
        self.podgc = PodGC(self._client(self.token_for(ids.POD_GC), "kube-controller-manager/podgc"))
        initial, cap = o.scheduler_backoff_s
        self.scheduler = Scheduler(
            self._client(self.server.service_account_token(*_SCHEDULER_SA), "kube-scheduler"),
            self.profile,
            extender_url=self._extender_url,
            initial_backoff_s=initial,
            max_backoff_s=cap,
            unschedulable_timeout_s=o.unschedulable_timeout_s,
            seed=self._seed,
        )
        self.kubelet = Kubelet(
            self._client(self.token_for(ids.KUBELET), "kubelet"),
            self._nodes,
            resource_slices=self._slices,
            heartbeat_interval_s=o.heartbeat_interval_s,
            auto_run=o.kubelet_auto_run,
        )
        self._run("job-controller", self.job_controller.run())
        self._run("podgc", self.podgc.run())
        self._run("scheduler", self.scheduler.run())
        self._run("kubelet", self.kubelet.run())
        await self._wait_started(
            [
                self.kubelet.registered,
                self.job_controller.jobs.synced,
                self.job_controller.pods.synced,
                self.scheduler.nodes.synced,
                self.scheduler.pods.synced,
                self.podgc.pods.synced,
                self.podgc.nodes.synced,
            ]
        )

    async def _wait_started(self, ready: Sequence[asyncio.Event], timeout_s: float = 30.0) -> None:
        """Until every controller has synced its caches; a controller that died fails the start."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not all(e.is_set() for e in ready):
            for task in self._tasks:
                if task.done():
                    cause = None if task.cancelled() else task.exception()
                    raise RuntimeError(f"{task.get_name()} stopped during start") from cause
            if loop.time() > deadline:
                raise TimeoutError(f"the simulated controllers did not sync within {timeout_s} s")
            await asyncio.sleep(0.01)

    # ---- helpers -------------------------------------------------------------------------------

    def token_for(self, identity: ids.Identity) -> str:
        return str(self.server.service_account_token(identity.namespace, identity.name))

    def set_extender_url(self, url: str | None) -> None:
        """Point the scheduler's extenders at ``scheme://host:port`` (the configured path is kept)."""
        self._extender_url = url
        if self.scheduler is not None:
            self.scheduler.set_extender_url(url)

    async def apply(self, obj: JSON) -> JSON:
        """Create ``obj`` as cluster-admin; an existing object is left as it is and returned."""
        assert self.admin is not None
        res = kr.resource_for(obj)
        meta = obj.get("metadata") or {}
        try:
            return await self.admin.create(res, obj, meta.get("namespace"))
        except KubeApiError as e:
            if not e.already_exists:
                raise
            return await self.admin.get(res, str(meta["name"]), meta.get("namespace") if res.namespaced else None)

    async def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> JSON:
        body: JSON = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        if labels:
            body["metadata"]["labels"] = dict(labels)
        assert self.admin is not None
        return await self.admin.create(kr.NAMESPACES, body)

    async def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token for that ServiceAccount (created if missing), for clients under test."""
        await self.apply(ids.service_account(namespace, name))
        return str(self.server.service_account_token(namespace, name))

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """Write a kubeconfig for this cluster (cluster-admin unless a token is given)."""
        write_kubeconfig(path, self.url, token or self.server.admin_token)
        return path

    def client(self, token: str | None = None, user_agent: str = "sim-test") -> KubeClient:
        """A raw client for this cluster (closed with the cluster)."""
        return self._client(token or self.server.admin_token, user_agent)
