"""The kube-scheduler stand-in: one profile, in-tree filters and scores of its own, the extender over HTTP.

An ordinary API client: it watches Nodes and the pods that are not finished, schedules unbound,
ungated pods whose ``schedulerName`` is its profile's, one cycle at a time, and binds through
``pods/<name>/binding``. A cycle mirrors kube-scheduler's ``schedulePod``:

1. NodeAffinity PreFilter (``matchFields metadata.name``) narrows the candidates;
2. in-tree filters (``sim.schedplugins``) in default order, counting bound and assumed pods;
3. each interested extender's ``filter`` (only when some node passed), refusals folded in;
4. one node left: take it; otherwise score (NodeResourcesFit, TaintToleration, NodeAffinity;
   PodTopologySpread and InterPodAffinity score every node alike for pods without such
   constraints and are not computed) plus ``prioritize`` × weight × 10, best total wins, ties
   by a seeded reservoir draw;
5. assume the pod on the node and bind it in the background.

A rejection writes ``PodScheduled=False``, reason ``Unschedulable``, with kube-scheduler's
"0/N nodes are available" message and a ``FailedScheduling`` event; an extender error or a
failed bind writes reason ``SchedulerError``. No preemption, no leader election.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from sim import jobpods as jp
from sim import kuberesources as kr
from sim import schedplugins as sp
from sim.events import EventRecorder
from sim.extenderclient import ExtenderClient, ExtenderError
from sim.informer import Informer, object_key
from sim.kubeclient import KubeApiError, KubeClient
from sim.schedconfig import SchedulerProfile, combine_scores, fit_error_message, no_preemption_message, select_host
from sim.schedqueue import SchedulingQueue

__all__ = ["Scheduler", "ACTIVE_PODS_SELECTOR"]

log = logging.getLogger("tandem.sim.scheduler")

JSON = dict[str, Any]
ACTIVE_PODS_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
"""kube-scheduler's pod informer selector: finished pods hold nothing and leave the cache."""
_IO_ERRORS = (KubeApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
MIN_FEASIBLE_NODES_TO_FIND = 100


def _spec_changed(old: JSON, new: JSON) -> bool:
    """A change that may make the pod schedulable (kube-scheduler ignores status-only updates)."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    return (
        old.get("spec") != new.get("spec")
        or om.get("labels") != nm.get("labels")
        or om.get("annotations") != nm.get("annotations")
    )


def num_feasible_nodes_to_find(num_nodes: int, percentage: int) -> int:
    """``numFeasibleNodesToFind``: all nodes below 100 or at 100 %; else an adaptive share, at least 100."""
    if num_nodes < MIN_FEASIBLE_NODES_TO_FIND or percentage >= 100:
        return num_nodes
    pct = percentage or max(5, 50 - num_nodes // 125)
    return max(MIN_FEASIBLE_NODES_TO_FIND, num_nodes * pct // 100)


class Scheduler:
    """Runs until cancelled: ``await Scheduler(client, profile, extender_url=...).run()``."""

    def __init__(
        self,
        client: KubeClient,
        profile: SchedulerProfile,
        *,
        extender_url: str | None = None,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        unschedulable_timeout_s: float = 300.0,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.profile = profile
        self.pods = Informer(client, kr.PODS, field_selector=ACTIVE_PODS_SELECTOR)
        self.nodes = Informer(client, kr.NODES)
        self.queue = SchedulingQueue(
            initial_backoff_s=initial_backoff_s,
            max_backoff_s=max_backoff_s,
            unschedulable_timeout_s=unschedulable_timeout_s,
        )
        self.events = EventRecorder(client, profile.scheduler_name, clock=clock)
        self._rng = random.Random(seed)
        self._clock = clock
        self._extenders: list[ExtenderClient] = []
        self._bound: dict[str, tuple[str, dict[str, int]]] = {}  # pod key -> (node, requests), from the cache
        self._assumed: dict[str, tuple[str, dict[str, int]]] = {}  # pod key -> (node, requests), bind in flight
        self._next_start = 0
        self._binds: set[asyncio.Task[None]] = set()
        self.set_extender_url(extender_url)
        self.pods.add_handler(self._on_pod)
        self.nodes.add_handler(self._on_node)

    def set_extender_url(self, base_url: str | None) -> None:
        """Point the configured extenders at ``scheme://host:port`` (paths stay as configured); None: none."""
        old = self._extenders
        self._extenders = [ExtenderClient(e, base_url) for e in self.profile.extenders] if base_url else []
        for ext in old:
            if ext.connected:
                asyncio.ensure_future(ext.close())
        self.queue.move_all_to_active_or_backoff()

    # ---- cache -------------------------------------------------------------------------------

    def _ours(self, pod: JSON) -> bool:
        spec = pod.get("spec") or {}
        return (spec.get("schedulerName") or "default-scheduler") == self.profile.scheduler_name

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        key = object_key(obj)
        if new is None or jp.is_terminal(new):
            was_bound = self._bound.pop(key, None) is not None
            self._assumed.pop(key, None)
            self.queue.remove(key)
            if was_bound:
                self.queue.move_all_to_active_or_backoff()
            return
        spec = new.get("spec") or {}
        if spec.get("nodeName"):
            self._bound[key] = (str(spec["nodeName"]), sp.pod_requests(new))
            self._assumed.pop(key, None)
            self.queue.remove(key)
            return
        if not self._ours(new) or (new.get("metadata") or {}).get("deletionTimestamp") or spec.get("schedulingGates"):
            self.queue.remove(key)
            return
        priority = int(spec.get("priority") or 0)
        if old is None or key not in self.queue:
            self.queue.add(key, priority)
        elif _spec_changed(old, new):
            self.queue.update(key, priority)

    def _on_node(self, old: JSON | None, new: JSON | None) -> None:
        if new is not None:
            self.queue.move_all_to_active_or_backoff()

    def snapshot(self) -> list[sp.NodeInfo]:
        """Every node with what its bound and assumed pods request, in name order."""
        infos = {name: sp.NodeInfo(node) for name, node in sorted(self.nodes.store.items())}
        for node, reqs in list(self._bound.values()) + list(self._assumed.values()):
            if node in infos:
                infos[node].add(reqs)
        return list(infos.values())

    # ---- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.nodes.run())
                tg.create_task(self.pods.run())
                await self.nodes.synced.wait()
                await self.pods.synced.wait()
                while True:
                    key = await self.queue.pop()
                    rejected: bool | None = False
                    try:
                        rejected = await self.schedule_one(key)
                    except _IO_ERRORS as e:
                        log.warning("scheduling cycle failed", extra={"pod": key, "error": str(e)})
                    finally:
                        self.queue.done(key, rejected=rejected)
        finally:
            for ext in self._extenders:
                await ext.close()

    async def schedule_one(self, key: str) -> bool | None:
        """One cycle; None if the pod was assumed (or needs nothing), True if rejected, False on error."""
        pod = self.pods.get(key)
        spec = (pod or {}).get("spec") or {}
        if pod is None or spec.get("nodeName") or spec.get("schedulingGates") or not self._ours(pod):
            return None
        infos = self.snapshot()
        n_all = len(infos)
        names = sp.prefilter_node_names(pod)
        if names is not None and not names:
            await self._reject(
                pod,
                fit_error_message(
                    n_all,
                    {},
                    prefilter_msg=sp.REASON_AFFINITY_CONFLICT,
                    post_filter_msg=no_preemption_message(pod, n_all),
                ),
            )
            return True
        absent: list[str] = []
        if names is not None:
            infos = [i for i in infos if i.name in names]
            absent = ["node(s) didn't satisfy plugin(s) [NodeAffinity]"]
        infos = self._rotate(infos)
        feasible, statuses = sp.run_filters(pod, infos, self.profile.fit_ignored, self.profile.fit_ignored_groups)
        feasible = feasible[: num_feasible_nodes_to_find(len(infos), self.profile.percentage_of_nodes_to_score)]
        try:
            feasible = await self._run_extender_filters(pod, feasible, statuses)
        except ExtenderError as e:
            await self._write_condition(pod, "SchedulerError", str(e))
            await self.events.record(pod, "Warning", "FailedScheduling", str(e))
            return False
        if not feasible:
            message = fit_error_message(n_all, statuses, absent, post_filter_msg=no_preemption_message(pod, n_all))
            await self._reject(pod, message)
            return True
        host = feasible[0].name if len(feasible) == 1 else await self._pick(pod, feasible)
        self._assumed[key] = (host, sp.pod_requests(pod))
        task = asyncio.create_task(self._bind(pod, host))
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)
        return None

    def _rotate(self, infos: list[sp.NodeInfo]) -> list[sp.NodeInfo]:
        """Start where the last cycle stopped (``nextStartNodeIndex``), as kube-scheduler does."""
        if not infos:
            return infos
        start = self._next_start % len(infos)
        self._next_start += 1
        return infos[start:] + infos[:start]

    async def _run_extender_filters(
        self, pod: JSON, feasible: list[sp.NodeInfo], statuses: dict[str, list[str]]
    ) -> list[sp.NodeInfo]:
        """``findNodesThatPassExtenders``: unresolvable refusals first, then the others, per node."""
        for ext in self._extenders:
            if not feasible:
                break
            if not ext.settings.filter_verb or not ext.settings.interested(pod):
                continue
            try:
                result = await ext.filter(pod, [i.node for i in feasible])
            except ExtenderError:
                if ext.settings.ignorable:
                    continue
                raise
            for node, reason in result.failed_unresolvable.items():
                statuses[node] = list(statuses.get(node, [])) + [reason]
            for node, reason in result.failed.items():
                if node not in result.failed_unresolvable:
                    statuses[node] = list(statuses.get(node, [])) + [reason]
            passed = set(result.nodes)
            feasible = [i for i in feasible if i.name in passed]
        return feasible

    async def _pick(self, pod: JSON, feasible: list[sp.NodeInfo]) -> str:
        weights = self.profile.score_weights
        reqs = sp.pod_requests(pod)
        plugin_scores: dict[str, dict[str, int]] = {}
        if "NodeResourcesFit" in weights:
            plugin_scores["NodeResourcesFit"] = {
                i.name: sp.score_resource_fit(reqs, i, self.profile.fit_resources, self.profile.fit_strategy)
                for i in feasible
            }
        if "TaintToleration" in weights:
            plugin_scores["TaintToleration"] = sp.score_taint_toleration(pod, feasible)
        if "NodeAffinity" in weights and (aff := sp.score_node_affinity(pod, feasible)) is not None:
            plugin_scores["NodeAffinity"] = aff
        ext_scores: list[tuple[dict[str, int], int]] = []
        for ext in self._extenders:
            if not ext.settings.prioritize_verb or not ext.settings.interested(pod):
                continue
            try:
                ext_scores.append((await ext.prioritize(pod, [i.node for i in feasible]), ext.settings.weight))
            except ExtenderError as e:  # kube-scheduler ignores prioritize errors
                log.info("extender prioritize failed", extra={"pod": object_key(pod), "error": str(e)})
        names = [i.name for i in feasible]
        return select_host(combine_scores(plugin_scores, weights, ext_scores, names), names, self._rng)

    # ---- writes --------------------------------------------------------------------------------

    async def _bind(self, pod: JSON, node: str) -> None:
        meta = pod["metadata"]
        key = object_key(pod)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.client.create_subresource(kr.PODS, meta["name"], "binding", binding, meta["namespace"])
        except _IO_ERRORS as e:
            self._assumed.pop(key, None)
            message = f'running Bind plugin "DefaultBinder": {getattr(e, "message", None) or e}'
            log.warning("bind failed", extra={"pod": key, "node": node, "error": message})
            if self.pods.get(key) is not None:
                self.queue.done(key, rejected=False)  # back to the queue after its back-off
                await self._write_condition(pod, "SchedulerError", message)
            return
        await self.events.record(
            pod, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"
        )

    async def _reject(self, pod: JSON, message: str) -> None:
        await self._write_condition(pod, "Unschedulable", message)
        await self.events.record(pod, "Warning", "FailedScheduling", message)

    async def _write_condition(self, pod: JSON, reason: str, message: str) -> None:
        """``PodScheduled=False`` by strategic merge on ``pods/<name>/status``, only when it changes."""
        current = self.pods.get(object_key(pod)) or pod
        conditions = (current.get("status") or {}).get("conditions") or []
        old: JSON = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        if old.get("status") == "False" and old.get("reason") == reason and old.get("message") == message:
            return
        now = jp.format_time(self._clock())
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": old.get("lastTransitionTime") if old.get("status") == "False" else now,
        }
        try:
            await self.client.patch(
                kr.PODS,
                pod["metadata"]["name"],
                {"status": {"conditions": [cond]}},
                patch_type="strategic",
                namespace=pod["metadata"]["namespace"],
                subresource="status",
            )
        except KubeApiError as e:
            if not e.not_found:
                log.warning("pod condition not written", extra={"pod": object_key(pod), "error": str(e)})
