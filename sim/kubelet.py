"""The kubelet stand-in (modelled on KWOK's stages): registers fixture Nodes, heartbeats them, runs their pods.

An ordinary API client, also meant for a real control plane (``python -m sim.kubelet
--kubeconfig K --nodes nodes.yaml``), where without it nodes go Unknown and bound pods never
finish deleting. It

* creates the Nodes and ResourceSlices of a fixture; renews each node's Lease in
  ``kube-node-lease`` and refreshes its conditions every ``heartbeat_interval_s`` by PATCH of
  ``nodes/<n>/status`` without a resourceVersion (no 409 race with the controller-manager);
* moves pods bound to its nodes to Running (``auto_run``), or leaves them Pending in
  ``ContainerCreating``; on command completes them with exit codes, restarts them in place
  (``restartPolicy`` OnFailure/Always), or shows ``ErrImagePull`` / ``ImagePullBackOff``;
* finishes graceful deletions: terminal phase first, then ``DELETE`` with grace 0.

Pods can also drive themselves through annotations (for runs without a test harness):
``sim.tandem.dev/exit-code`` (exit with that code after ``sim.tandem.dev/run-seconds``) and
``sim.tandem.dev/image-pull-error`` (``ErrImagePull`` or ``ImagePullBackOff``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from sim import jobpods as jp
from sim import kuberesources as kr
from sim import nodes as nd
from sim import podstatus as ps
from sim.informer import Informer, WorkQueue, object_key
from sim.kubeclient import KubeApiError, KubeClient

__all__ = ["Kubelet", "main", "EXIT_CODE_ANNOTATION", "RUN_SECONDS_ANNOTATION", "PULL_ERROR_ANNOTATION"]

log = logging.getLogger("tandem.sim.kubelet")

JSON = dict[str, Any]
EXIT_CODE_ANNOTATION = "sim.tandem.dev/exit-code"
RUN_SECONDS_ANNOTATION = "sim.tandem.dev/run-seconds"
PULL_ERROR_ANNOTATION = "sim.tandem.dev/image-pull-error"
_IO_ERRORS = (KubeApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


class Kubelet:
    """``await Kubelet(client, nodes).run()``; commands (``complete``, ``set_ready``, ...) while it runs."""

    def __init__(
        self,
        client: KubeClient,
        nodes: Sequence[JSON],
        *,
        resource_slices: Sequence[JSON] = (),
        heartbeat_interval_s: float = 10.0,
        lease_duration_s: int = 40,
        auto_run: bool = True,
        termination_delay_s: float = 0.0,
        deletion_exit_code: int = 143,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.fixtures = {str(n["metadata"]["name"]): n for n in nodes}
        self.resource_slices = list(resource_slices)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.lease_duration_s = lease_duration_s
        self.termination_delay_s = termination_delay_s
        self.deletion_exit_code = deletion_exit_code
        self._auto_run = auto_run
        self._clock = clock
        self.pods = Informer(client, kr.PODS)
        self.queue = WorkQueue()
        self.registered = asyncio.Event()
        self.heartbeats = 0
        """Completed heartbeat rounds (every node's Lease and status written once per round)."""
        self._nodes: dict[str, JSON] = {}  # as the server returned them
        self._leases: dict[str, JSON] = {}
        self._ready: dict[str, tuple[bool, str | None]] = {n: (True, None) for n in self.fixtures}
        self._beating: set[str] = set(self.fixtures)
        self._ips = nd.PodIPs()
        self._pod_ips: dict[str, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._deleting: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.pods.add_handler(self._on_pod)

    # ---- switches ------------------------------------------------------------------------------

    @property
    def auto_run(self) -> bool:
        """Bound pods go Running by themselves; when False they stay Pending in ContainerCreating."""
        return self._auto_run

    @auto_run.setter
    def auto_run(self, value: bool) -> None:
        self._auto_run = value
        if value:
            for key, pod in self.pods.store.items():
                if self._mine(pod):
                    self.queue.add(key)

    async def set_ready(self, node: str, ready: bool, message: str | None = None) -> None:
        """Report the node Ready (KubeletReady) or NotReady (KubeletNotReady); written at once."""
        self._ready[node] = (ready, message)
        await self._post_status(node)

    def set_heartbeat(self, node: str, on: bool) -> None:
        """Stop (or resume) the node's Lease and status updates, as a crashed kubelet would."""
        (self._beating.add if on else self._beating.discard)(node)

    # ---- nodes ---------------------------------------------------------------------------------

    async def register(self) -> None:
        """Create the Nodes (an existing one is taken over) and ResourceSlices, then one heartbeat."""
        for name, fixture in self.fixtures.items():
            try:
                self._nodes[name] = await self.client.create(kr.NODES, nd.registration_body(fixture))
            except KubeApiError as e:
                if not e.already_exists:
                    raise
                self._nodes[name] = await self.client.get(kr.NODES, name)
        for rslice in self.resource_slices:
            try:
                body = await self._owned_by_live_nodes(nd.resource_slice_body(rslice))
                await self.client.create(kr.RESOURCE_SLICES, body)
            except KubeApiError as e:
                if not e.already_exists:
                    raise
        await self.heartbeat()
        self.registered.set()

    async def _owned_by_live_nodes(self, obj: JSON) -> JSON:
        """Point Node ownerReferences at the Nodes' real uids (a fixture's uids are not this cluster's);
        a reference to a Node that does not exist is dropped, or the garbage collector takes the object."""
        refs = []
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("kind") != "Node" or ref.get("apiVersion") != "v1":
                refs.append(ref)
                continue
            node = self._nodes.get(str(ref.get("name")))
            if node is None:
                try:
                    node = await self.client.get(kr.NODES, str(ref.get("name")))
                except KubeApiError as e:
                    if not e.not_found:
                        raise
                    continue
            refs.append(dict(ref) | {"uid": node["metadata"]["uid"]})
        if refs:
            obj["metadata"]["ownerReferences"] = refs
        else:
            obj["metadata"].pop("ownerReferences", None)
        return obj

    async def heartbeat(self) -> None:
        """One round: every heartbeating node's Lease renewed and its status refreshed."""
        for name in list(self.fixtures):
            if name not in self._beating:
                continue
            try:
                await self._renew_lease(name)
                await self._post_status(name)
            except KubeApiError as e:
                if e.not_found:
                    await self._register_again(name)
                else:
                    log.warning("node heartbeat failed", extra={"node": name, "error": str(e)})
            except _IO_ERRORS as e:
                log.warning("node heartbeat failed", extra={"node": name, "error": str(e)})
        self.heartbeats += 1

    async def _register_again(self, name: str) -> None:
        """The Node was deleted under us: a kubelet registers it again."""
        log.info("node gone, registering it again", extra={"node": name})
        self._leases.pop(name, None)
        try:
            self._nodes[name] = await self.client.create(kr.NODES, nd.registration_body(self.fixtures[name]))
        except _IO_ERRORS as e:
            log.warning("node registration failed", extra={"node": name, "error": str(e)})

    async def _post_status(self, name: str) -> None:
        fixture_status = dict(self.fixtures[name].get("status") or {})
        live = (self._nodes.get(name) or {}).get("status") or {}
        previous = live.get("conditions") or fixture_status.get("conditions")
        ready, message = self._ready.get(name, (True, None))
        status = {
            k: v
            for k, v in fixture_status.items()
            if k in ("capacity", "allocatable", "addresses", "nodeInfo", "daemonEndpoints", "images")
        }
        status["conditions"] = nd.node_conditions(previous, ready, self._clock(), message)
        try:
            self._nodes[name] = await self.client.patch(
                kr.NODES, name, {"status": status}, patch_type="strategic", subresource="status"
            )
        except KubeApiError as e:
            if e.code != 415:
                raise
            self._nodes[name] = await self.client.patch(
                kr.NODES, name, {"status": status}, patch_type="merge", subresource="status"
            )

    async def _renew_lease(self, name: str) -> None:
        now = self._clock()
        lease = self._leases.get(name)
        if lease is None:
            try:
                lease = await self.client.get(kr.LEASES, name, nd.NODE_LEASE_NAMESPACE)
            except KubeApiError as e:
                if not e.not_found:
                    raise
                body = nd.lease_body(self._nodes.get(name) or self.fixtures[name], now, self.lease_duration_s)
                self._leases[name] = await self.client.create(kr.LEASES, body, nd.NODE_LEASE_NAMESPACE)
                return
        renewed = dict(lease)
        renewed["spec"] = dict(lease.get("spec") or {}) | {
            "holderIdentity": name,
            "leaseDurationSeconds": self.lease_duration_s,
            "renewTime": ps.micro_time(now),
        }
        try:
            self._leases[name] = await self.client.replace(kr.LEASES, renewed, nd.NODE_LEASE_NAMESPACE)
        except KubeApiError as e:
            self._leases.pop(name, None)  # re-read next round
            if not (e.conflict or e.not_found):
                raise

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            await self.heartbeat()

    # ---- pods ----------------------------------------------------------------------------------

    def _mine(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("nodeName") in self.fixtures

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        if new is None:
            key = object_key(old or {})
            self._pod_ips.pop(key, None)
            self._deleting.discard(key)
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()
            return
        if self._mine(new):
            self.queue.add(object_key(new))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        try:
            await self.register()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._heartbeat_loop())
                tg.create_task(self.pods.run())
                await self.pods.synced.wait()
                for _ in range(4):
                    tg.create_task(self._worker())
        finally:
            for timer in self._timers.values():
                timer.cancel()
            for task in list(self._tasks):
                task.cancel()

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
            except _IO_ERRORS as e:
                log.warning("pod sync failed", extra={"pod": key, "error": str(e)})
                self.queue.add_after(key, 0.5)
            finally:
                self.queue.done(key)

    def _where(self, pod: JSON) -> tuple[str, str]:
        node = self._nodes.get(str(pod["spec"]["nodeName"])) or self.fixtures[str(pod["spec"]["nodeName"])]
        key = object_key(pod)
        if key not in self._pod_ips:
            self._pod_ips[key] = (pod.get("status") or {}).get("podIP") or self._ips.allocate(node)
        return nd.host_ip(node), self._pod_ips[key]

    async def reconcile(self, key: str) -> None:
        """Move one pod along: deletion first, then start (or waiting), then annotation-driven exits."""
        pod = self.pods.get(key)
        if pod is None or not self._mine(pod):
            return
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            if key not in self._deleting:
                self._deleting.add(key)
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                self._spawn(self._finish_deletion(pod, min(self.termination_delay_s, grace)))
            return
        if jp.is_terminal(pod):
            return
        host, ip = self._where(pod)
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        running = bool(statuses) and all("running" in (cs.get("state") or {}) for cs in statuses)
        annotations = meta.get("annotations") or {}
        pull_error = annotations.get(PULL_ERROR_ANNOTATION)
        if pull_error:
            if not statuses or any(
                (cs.get("state") or {}).get("waiting", {}).get("reason") != pull_error for cs in statuses
            ):
                await self._write(pod, ps.waiting_status(pod, host, self._clock(), str(pull_error)), guarded=True)
        elif not running and self._auto_run:
            await self._write(pod, ps.running_status(pod, host, ip, self._clock()), guarded=True)
            self._schedule_exit(pod)
        elif not statuses:
            await self._write(pod, ps.waiting_status(pod, host, self._clock()), guarded=True)
        elif running:
            self._schedule_exit(pod)

    def _schedule_exit(self, pod: JSON) -> None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if EXIT_CODE_ANNOTATION not in annotations:
            return
        key = object_key(pod)
        if key in self._timers:
            return
        code = int(annotations[EXIT_CODE_ANNOTATION])
        delay = float(annotations.get(RUN_SECONDS_ANNOTATION) or 0)
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self._timers[key] = asyncio.get_running_loop().call_later(
            delay, lambda: self._spawn(self._exit_quietly(ns, name, code))
        )

    async def _exit_quietly(self, ns: str, name: str, code: int) -> None:
        try:
            await self.complete(ns, name, exit_code=code)
        except (LookupError, *_IO_ERRORS) as e:
            log.warning("annotated exit failed", extra={"pod": f"{ns}/{name}", "error": str(e)})

    async def _finish_deletion(self, pod: JSON, delay_s: float) -> None:
        key = object_key(pod)
        try:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            current = self.pods.get(key) or pod
            if not jp.is_terminal(current):
                host, ip = self._where(current)
                await self._write(
                    current,
                    ps.killed_status(
                        current, host, ip if self._started(current) else None, self.deletion_exit_code, self._clock()
                    ),
                )
            await self.client.delete(
                kr.PODS,
                pod["metadata"]["name"],
                pod["metadata"]["namespace"],
                grace_period_seconds=0,
                preconditions={"uid": str(pod["metadata"]["uid"])},
            )
        except KubeApiError as e:
            if not (e.not_found or e.conflict):
                log.warning("pod deletion not finished", extra={"pod": key, "error": str(e)})
                self._deleting.discard(key)
                self.queue.add_after(key, 0.5)
        except _IO_ERRORS as e:
            log.warning("pod deletion not finished", extra={"pod": key, "error": str(e)})
            self._deleting.discard(key)
            self.queue.add_after(key, 0.5)

    @staticmethod
    def _started(pod: JSON) -> bool:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return any("running" in (cs.get("state") or {}) for cs in statuses)

    async def _write(self, pod: JSON, status: JSON, *, guarded: bool = False) -> JSON:
        """Patch the pod's status. `guarded` writes decided from the informer's (maybe stale) copy carry its
        resourceVersion, so the server refuses them (409) when the pod moved on meanwhile — e.g. a command
        that already ran it — instead of taking the pod back to ContainerCreating."""
        body: JSON = {"status": status}
        if guarded:
            body["metadata"] = {"resourceVersion": pod["metadata"]["resourceVersion"]}
        out: JSON = await self.client.patch(
            kr.PODS,
            pod["metadata"]["name"],
            body,
            patch_type="strategic",
            namespace=pod["metadata"]["namespace"],
            subresource="status",
        )
        return out

    # ---- commands ------------------------------------------------------------------------------

    async def _current(self, ns: str, name: str) -> JSON:
        pod = self.pods.get(f"{ns}/{name}")
        if pod is None or not self._mine(pod):
            pod = await self.client.get(kr.PODS, name, ns)
        if not self._mine(pod):
            raise LookupError(f"pod {ns}/{name} is not bound to a node of this kubelet")
        return pod

    async def start(self, ns: str, name: str) -> JSON:
        """Run a pod now (when ``auto_run`` is off)."""
        pod = await self._current(ns, name)
        host, ip = self._where(pod)
        return await self._write(pod, ps.running_status(pod, host, ip, self._clock()))

    async def complete(
        self, ns: str, name: str, exit_code: int = 0, *, exit_codes: Mapping[str, int] | None = None
    ) -> JSON:
        """Every container exits (``exit_codes`` per container, else ``exit_code``). With ``restartPolicy``
        Never the pod ends Succeeded / Failed; otherwise the exited containers restart in place."""
        pod = await self._current(ns, name)
        codes = dict(exit_codes) if exit_codes is not None else {c: exit_code for c in ps.container_names(pod)}
        host, ip = self._where(pod)
        policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
        if policy == "Always" or (policy == "OnFailure" and any(codes.values())):
            return await self._write(pod, ps.restarted_status(pod, host, ip, codes, self._clock()))
        return await self._write(pod, ps.terminated_status(pod, host, ip, codes, self._clock()))

    async def image_pull_error(
        self, ns: str, name: str, reason: str = "ErrImagePull", message: str | None = None
    ) -> JSON:
        """Show the pod's containers waiting with ``ErrImagePull`` or ``ImagePullBackOff``."""
        pod = await self._current(ns, name)
        host, _ = self._where(pod)
        return await self._write(pod, ps.waiting_status(pod, host, self._clock(), reason, message))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim.kubelet", description="kubelet stand-in for simulated nodes")
    p.add_argument("--kubeconfig", required=True, help="kubeconfig with a token or client certificate user")
    p.add_argument("--context", default=None, help="kubeconfig context (default: current-context)")
    p.add_argument(
        "--nodes",
        action="append",
        type=Path,
        required=True,
        help="Node / ResourceSlice fixture, JSON or YAML (repeatable)",
    )
    p.add_argument("--pending", action="store_true", help="leave pods Pending in ContainerCreating")
    p.add_argument("--heartbeat-interval", type=float, default=10.0, help="Lease and status period, seconds")
    p.add_argument(
        "--termination-delay",
        type=float,
        default=0.0,
        help="seconds a deleted pod's containers take to stop (capped by its grace period)",
    )
    return p


async def _serve(args: argparse.Namespace) -> None:
    nodes: list[JSON] = []
    slices: list[JSON] = []
    for path in args.nodes:
        n, s = nd.load_fixture(path)
        nodes += n
        slices += s
    async with KubeClient.from_kubeconfig(str(args.kubeconfig), args.context, user_agent="sim-kubelet") as client:
        kubelet = Kubelet(
            client,
            nodes,
            resource_slices=slices,
            heartbeat_interval_s=args.heartbeat_interval,
            auto_run=not args.pending,
            termination_delay_s=args.termination_delay,
        )
        task = asyncio.create_task(kubelet.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(_serve(build_parser().parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
