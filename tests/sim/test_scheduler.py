"""The kube-scheduler stand-in: filters, scores and messages as tables; whole cycles against the fake API server."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sim import kuberesources as kr
from sim import schedplugins as sp
from sim.cluster import SimCluster, eventually
from sim.kubeclient import KubeClient
from sim.schedconfig import (
    DEFAULT_SCORE_WEIGHTS,
    combine_scores,
    fit_error_message,
    load_profile,
    no_preemption_message,
    parse_duration,
    select_host,
)
from sim.schedqueue import SchedulingQueue
from sim.scheduler import Scheduler
from tests.fixtures import fixture_json

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = REPO / "manifests" / "base" / "scheduler-config.yaml"

JSON = dict[str, Any]


# ---- builders -----------------------------------------------------------------------------------


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    taints: list[JSON] | None = None,
    cpu: str = "64",
    memory: str = "256Gi",
    pods: str = "110",
    gpus: int | None = None,
    unschedulable: bool = False,
) -> JSON:
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus is not None:
        alloc["nvidia.com/gpu"] = str(gpus)
    spec: JSON = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"capacity": dict(alloc), "allocatable": alloc},
    }


def pod(
    name: str = "p",
    *,
    cpu: str | None = "1",
    memory: str | None = None,
    gpus: int | None = None,
    tolerations: list[JSON] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity: JSON | None = None,
    init: list[JSON] | None = None,
    overhead: dict[str, str] | None = None,
) -> JSON:
    req: dict[str, str] = {}
    if cpu:
        req["cpu"] = cpu
    if memory:
        req["memory"] = memory
    if gpus is not None:
        req["nvidia.com/gpu"] = str(gpus)
    spec: JSON = {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": req}}]}
    if tolerations:
        spec["tolerations"] = tolerations
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity:
        spec["affinity"] = affinity
    if init:
        spec["initContainers"] = init
    if overhead:
        spec["overhead"] = overhead
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"}, "spec": spec}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def required(*terms: JSON) -> JSON:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def container(name: str, cpu: str, *, sidecar: bool = False) -> JSON:
    c: JSON = {"name": name, "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


# ---- requests -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "the_pod, want_cpu",
    [
        (pod(cpu="2"), 2000),
        (pod(cpu="500m", init=[container("init", "4")]), 4000),  # max(init) beats the sum of containers
        (
            pod(cpu="1", init=[container("side", "1", sidecar=True), container("init", "3")]),
            4000,
        ),  # sidecar + later init
        (pod(cpu="1", init=[container("side", "2", sidecar=True)]), 3000),  # sidecars add to the containers
        (pod(cpu="1", overhead={"cpu": "250m"}), 1250),
    ],
)
def test_pod_requests_as_kube_scheduler(the_pod: JSON, want_cpu: int) -> None:
    assert sp.pod_requests(the_pod)["cpu"] == want_cpu


def test_limits_stand_in_for_missing_requests() -> None:
    p = pod(cpu=None)
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2", "memory": "1Gi"}}
    assert sp.pod_requests(p) == {"nvidia.com/gpu": 2, "memory": 2**30}


# ---- filters ------------------------------------------------------------------------------------


def reasons(the_pod: JSON, the_node: JSON, bound: tuple[JSON, ...] = ()) -> list[str]:
    info = sp.NodeInfo(the_node)
    for b in bound:
        info.add(sp.pod_requests(b))
    feasible, rejected = sp.run_filters(the_pod, [info])
    return rejected.get(info.name, [])


@pytest.mark.parametrize(
    "the_pod, the_node, want",
    [
        (pod(), node("n", unschedulable=True), ["node(s) were unschedulable"]),
        (
            pod(
                tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
            ),
            node("n", unschedulable=True),
            [],
        ),
        (pod(), node("n", taints=[GPU_TAINT]), ["node(s) had untolerated taint {nvidia.com/gpu: present}"]),
        (pod(tolerations=[GPU_TOLERATION]), node("n", taints=[GPU_TAINT]), []),
        (
            pod(),
            node("n", taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
            ["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"],
        ),
        (pod(), node("n", taints=[{"key": "soft", "value": "x", "effect": "PreferNoSchedule"}]), []),
        (
            pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}]),
            node("n", taints=[GPU_TAINT]),
            ["node(s) had untolerated taint {nvidia.com/gpu: present}"],
        ),
        (pod(tolerations=[{"operator": "Exists"}]), node("n", taints=[GPU_TAINT]), []),
        (
            pod(node_selector={"zone": "a"}),
            node("n", labels={"zone": "b"}),
            ["node(s) didn't match Pod's node affinity/selector"],
        ),
        (pod(gpus=4), node("n", gpus=2), ["Insufficient nvidia.com/gpu"]),
        (pod(gpus=1), node("n"), ["Insufficient nvidia.com/gpu"]),  # an extended resource the node lacks
        (pod(cpu="65", memory="1Ti"), node("n"), ["Insufficient cpu", "Insufficient memory"]),
        (pod(cpu=None), node("n", pods="0"), ["Too many pods"]),
        # the first rejecting plugin wins: a tainted node is not also reported as too small
        (
            pod(gpus=16),
            node("n", gpus=8, taints=[GPU_TAINT]),
            ["node(s) had untolerated taint {nvidia.com/gpu: present}"],
        ),
    ],
)
def test_filter_reasons(the_pod: JSON, the_node: JSON, want: list[str]) -> None:
    assert reasons(the_pod, the_node) == want


def test_the_shipped_profile_leaves_gpu_shares_to_the_extender() -> None:
    """A fractional-GPU pod asks for `tandem.dev/gpu-milli`, which no node advertises: with the shipped
    NodeResourcesFit `ignoredResources` kube-scheduler passes it to the extender instead of refusing it."""
    profile = load_profile(SHIPPED_CONFIG, "tandem-scheduler")
    assert profile.fit_ignored == {"tandem.dev/gpu-milli"}
    share = pod(gpus=1)
    share["spec"]["containers"][0]["resources"]["requests"]["tandem.dev/gpu-milli"] = "500"
    info = sp.NodeInfo(node("n", gpus=8))
    assert sp.run_filters(share, [info])[1] == {"n": ["Insufficient tandem.dev/gpu-milli"]}
    feasible, rejected = sp.run_filters(share, [info], profile.fit_ignored, profile.fit_ignored_groups)
    assert [i.name for i in feasible] == ["n"] and not rejected
    # Only extended resources can be ignored, and a group ignores every resource of its prefix.
    assert sp.run_filters(pod(gpus=16), [info], frozenset(), frozenset({"nvidia.com"}))[1] == {}
    assert sp.run_filters(pod(cpu="65"), [info], frozenset({"cpu"}))[1] == {"n": ["Insufficient cpu"]}


def test_resources_fit_counts_pods_already_on_the_node() -> None:
    n = node("n", gpus=8, pods="2")
    assert reasons(pod(gpus=4), n, (pod(gpus=4),)) == []
    assert reasons(pod(gpus=4), n, (pod(gpus=4), pod(gpus=1))) == ["Too many pods", "Insufficient nvidia.com/gpu"]


@pytest.mark.parametrize(
    "expr, labels, want",
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, {"zone": "b"}, True),
        ({"key": "zone", "operator": "In", "values": ["a"]}, {}, False),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, {}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, {"zone": "a"}, False),
        ({"key": "gpu", "operator": "Exists"}, {"gpu": ""}, True),
        ({"key": "gpu", "operator": "DoesNotExist"}, {"gpu": "1"}, False),
        ({"key": "mem", "operator": "Gt", "values": ["40000"]}, {"mem": "81559"}, True),
        ({"key": "mem", "operator": "Lt", "values": ["40000"]}, {"mem": "81559"}, False),
        ({"key": "mem", "operator": "Gt", "values": ["1"]}, {"mem": "lots"}, False),
    ],
)
def test_node_selector_requirements(expr: JSON, labels: dict[str, str], want: bool) -> None:
    assert sp.match_node_selector_term({"matchExpressions": [expr]}, node("n", labels=labels)) is want


def test_affinity_terms_are_ored_and_an_empty_term_matches_nothing() -> None:
    n = node("n", labels={"zone": "a"})
    assert (
        sp.filter_node_affinity(
            pod(affinity=required({}, {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]})),
            sp.NodeInfo(n),
        )
        == []
    )
    assert sp.filter_node_affinity(pod(affinity=required({})), sp.NodeInfo(n)) == [sp.REASON_AFFINITY]


def test_match_fields_pins_by_node_name_not_hostname_label() -> None:
    n = node("node-0007", labels={"kubernetes.io/hostname": "h100-r7-n1"})
    pin = required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0007"]}]})
    by_label = required(
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-0007"]}]}
    )
    assert sp.filter_node_affinity(pod(affinity=pin), sp.NodeInfo(n)) == []
    assert sp.filter_node_affinity(pod(affinity=by_label), sp.NodeInfo(n)) == [sp.REASON_AFFINITY]


@pytest.mark.parametrize(
    "terms, want",
    [
        ([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}], {"a", "b"}),
        (
            [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["a", "b"]},
                        {"key": "metadata.name", "operator": "In", "values": ["b", "c"]},
                    ]
                }
            ],
            {"b"},
        ),
        (
            [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
            ],
            None,
        ),  # one term pins nothing
        (
            [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["a"]},
                        {"key": "metadata.name", "operator": "In", "values": ["b"]},
                    ]
                }
            ],
            set(),
        ),
    ],
)
def test_prefilter_node_names(terms: list[JSON], want: set[str] | None) -> None:
    assert sp.prefilter_node_names(pod(affinity=required(*terms))) == want


FIXTURE_CASES = ["want-4-h100", "want-8", "want-mig-3g", "no-gpu"]


@pytest.mark.parametrize("name", FIXTURE_CASES)
def test_in_tree_filters_agree_with_kube_scheduler_on_the_fixture_cluster(name: str) -> None:
    """The fixture records what kube-scheduler's own filters passed for each pending pod."""
    cluster = fixture_json("cluster.json")["items"]
    infos = {n["metadata"]["name"]: sp.NodeInfo(n) for n in cluster if n["kind"] == "Node"}
    for p in cluster:
        if p["kind"] == "Pod" and p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed"):
            infos[p["spec"]["nodeName"]].add(sp.pod_requests(p))
    the_pod = next(p for p in fixture_json("pending-pods.json")["items"] if p["metadata"]["name"] == name)
    feasible, _ = sp.run_filters(the_pod, infos.values())
    assert sorted(i.name for i in feasible) == sorted(fixture_json(f"args-{name}-names.json")["NodeNames"])


# ---- scores and the combined choice ---------------------------------------------------------------


def test_most_allocated_packs_and_weighs_gpus() -> None:
    resources = (("cpu", 1), ("memory", 1), ("nvidia.com/gpu", 10))
    empty, half = sp.NodeInfo(node("a", gpus=8)), sp.NodeInfo(node("b", gpus=8))
    half.add(sp.pod_requests(pod(cpu="32", gpus=4)))
    want = sp.pod_requests(pod(cpu="1", gpus=2))
    # a: cpu 1/64 -> 1, memory 0, gpu 2/8 -> 25: (1 + 0 + 250) // 12 = 20; b: cpu 33/64 -> 51, gpu 6/8 -> 75
    assert sp.score_resource_fit(want, empty, resources) == 20
    assert sp.score_resource_fit(want, half, resources) == (51 + 0 + 750) // 12
    assert sp.score_resource_fit(want, half, resources, "LeastAllocated") == (48 + 100 + 250) // 12


def test_taint_toleration_score_prefers_fewer_prefer_no_schedule_taints() -> None:
    soft = {"key": "soft", "value": "x", "effect": "PreferNoSchedule"}
    nodes = [sp.NodeInfo(node("clean")), sp.NodeInfo(node("soft", taints=[soft]))]
    assert sp.score_taint_toleration(pod(), nodes) == {"clean": 100, "soft": 0}
    tolerant = pod(tolerations=[{"key": "soft", "operator": "Exists"}])
    assert sp.score_taint_toleration(tolerant, nodes) == {"clean": 100, "soft": 100}


def test_node_affinity_score_is_skipped_without_preferences_and_normalised_with() -> None:
    nodes = [sp.NodeInfo(node("a", labels={"zone": "a"})), sp.NodeInfo(node("b", labels={"zone": "b"}))]
    assert sp.score_node_affinity(pod(), nodes) is None
    prefer = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 30, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}}
            ]
        }
    }
    assert sp.score_node_affinity(pod(affinity=prefer), nodes) == {"a": 0, "b": 100}


def test_combined_score_follows_the_extender_with_the_shipped_weights() -> None:
    profile = load_profile(SHIPPED_CONFIG, "tandem-scheduler")
    ext = profile.extenders[0]
    nodes = ["packed", "empty"]
    plugins = {"NodeResourcesFit": {"packed": 100, "empty": 0}, "TaintToleration": {"packed": 100, "empty": 100}}
    totals = combine_scores(plugins, profile.score_weights, [({"packed": 4, "empty": 5}, ext.weight)], nodes)
    assert totals == {"packed": 100 + 300 + 4 * 150 * 10, "empty": 300 + 5 * 150 * 10}
    assert select_host(totals, nodes, random.Random(0)) == "empty"


def test_ties_are_drawn_by_the_seeded_reservoir() -> None:
    totals = {f"n{i}": 7 for i in range(5)}
    names = sorted(totals)
    picks = {select_host(totals, names, random.Random(seed)) for seed in range(40)}
    assert picks == set(names)
    assert select_host(totals, names, random.Random(3)) == select_host(totals, names, random.Random(3))


def test_shipped_configuration_is_read_as_kube_scheduler_reads_it() -> None:
    profile = load_profile(SHIPPED_CONFIG, "tandem-scheduler")
    assert profile.fit_strategy == "MostAllocated"
    assert profile.fit_resources == (("cpu", 1), ("memory", 1), ("nvidia.com/gpu", 10))
    # kube-scheduler's defaults with the two plugins the profile disables taken out (VolumeBinding is kept,
    # though the profile does not list it); every weight the profile does list is the default one.
    disabled = {"NodeResourcesBalancedAllocation", "ImageLocality"}
    assert dict(profile.score_weights) == {n: w for n, w in DEFAULT_SCORE_WEIGHTS.items() if n not in disabled}
    assert profile.percentage_of_nodes_to_score == 100
    (ext,) = profile.extenders
    assert (ext.path_prefix, ext.filter_verb, ext.prioritize_verb) == ("/tandem", "filter", "prioritize")
    assert ext.weight == 150
    assert ext.http_timeout_s == 2.0 and ext.node_cache_capable and not ext.ignorable
    assert ext.url("http://127.0.0.1:41234", "filter") == "http://127.0.0.1:41234/tandem/filter"


@pytest.mark.parametrize("text, seconds", [("2s", 2.0), ("500ms", 0.5), ("1m30s", 90.0), ("0", 0.0)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


# ---- the message --------------------------------------------------------------------------------


def test_fit_error_message_in_kube_scheduler_format() -> None:
    statuses = {f"cpu-{i}": ["node(s) didn't match Pod's node affinity/selector"] for i in range(8)}
    statuses["t"] = ["node(s) had untolerated taint {nvidia.com/gpu: present}"]
    statuses |= {f"g{i}": ["Insufficient nvidia.com/gpu"] for i in range(3)}
    p = pod()
    assert fit_error_message(12, statuses, post_filter_msg=no_preemption_message(p, 12)) == (
        "0/12 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
        "3 Insufficient nvidia.com/gpu, 8 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/12 nodes are available: 12 Preemption is not helpful for scheduling."
    )


def test_absent_nodes_count_under_the_prefilter_reason_and_sorting_is_by_string() -> None:
    msg = fit_error_message(12, {"a": ["Insufficient cpu"]}, ["node(s) didn't satisfy plugin(s) [NodeAffinity]"])
    # Go sorts the whole "count reason" strings, so "1 Insufficient cpu" comes before "11 node(s)..."
    assert msg == "0/12 nodes are available: 1 Insufficient cpu, 11 node(s) didn't satisfy plugin(s) [NodeAffinity]."


def test_preemption_never_policy_message() -> None:
    p = pod()
    p["spec"]["preemptionPolicy"] = "Never"
    assert no_preemption_message(p, 3) == "preemption: not eligible due to preemptionPolicy=Never."


# ---- the queue ----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_queue_orders_by_priority_then_time_and_backs_off() -> None:
    clock = FakeClock()
    q = SchedulingQueue(initial_backoff_s=1.0, max_backoff_s=4.0, unschedulable_timeout_s=60.0, clock=clock)
    q.add("low", 0)
    clock.now += 1
    q.add("high", 1000)
    clock.now += 1
    q.add("low2", 0)
    assert [q.pop_ready(), q.pop_ready(), q.pop_ready()] == ["high", "low", "low2"]
    q.done("high", rejected=False)  # an error: back-off only
    assert q.pop_ready() is None
    clock.now += 1.0
    assert q.pop_ready() == "high"
    q.done("high", rejected=False)
    clock.now += 1.0
    assert q.pop_ready() is None  # second failure waits 2 s
    clock.now += 1.0
    assert q.pop_ready() == "high"


def test_unschedulable_pods_wait_for_an_event_or_the_timeout() -> None:
    clock = FakeClock()
    q = SchedulingQueue(initial_backoff_s=1.0, max_backoff_s=4.0, unschedulable_timeout_s=60.0, clock=clock)
    q.add("p", 0)
    assert q.pop_ready() == "p"
    q.done("p", rejected=True)
    clock.now += 30
    assert q.pop_ready() is None and q.pending() == {"p": "unschedulable"}
    q.move_all_to_active_or_backoff()  # e.g. a node was added
    assert q.pop_ready() == "p"
    q.done("p", rejected=True)
    clock.now += 59
    assert q.pop_ready() is None
    clock.now += 1
    assert q.pop_ready() == "p"


def test_an_event_during_the_cycle_sends_a_rejected_pod_to_backoff() -> None:
    clock = FakeClock()
    q = SchedulingQueue(initial_backoff_s=1.0, max_backoff_s=4.0, unschedulable_timeout_s=60.0, clock=clock)
    q.add("p", 0)
    assert q.pop_ready() == "p"
    q.move_all_to_active_or_backoff()
    q.done("p", rejected=True)
    assert q.pending() == {"p": "backoff"}
    q.remove("p")
    assert "p" not in q


# ---- whole cycles against the fake API server ------------------------------------------------------

GATE = "tandem.dev/placement"
H100 = "NVIDIA-H100-80GB-HBM3"


def real_node(
    name: str, *, hostname: str | None = None, gpus: int = 8, product: str = H100, taints: list[JSON] | None = None
) -> JSON:
    """A fixture H100 node (real format) renamed, with its GPU count and taints changed."""
    n = copy.deepcopy(next(o for o in fixture_json("cluster.json")["items"] if o["metadata"]["name"] == "h100-r1-n1"))
    n["metadata"]["name"] = name
    n["metadata"]["labels"].update(
        {
            "kubernetes.io/hostname": hostname or name,
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(gpus),
        }
    )
    for key in ("capacity", "allocatable"):
        n["status"][key]["nvidia.com/gpu"] = str(gpus)
    n["status"]["addresses"] = [{"type": "InternalIP", "address": "192.0.2.50"}, {"type": "Hostname", "address": name}]
    n["spec"]["taints"] = [GPU_TAINT] if taints is None else taints
    n["spec"].pop("podCIDR", None)
    n["spec"].pop("podCIDRs", None)
    out: JSON = n
    return out


def gpu_pod(
    name: str,
    gpus: int = 4,
    *,
    gated: bool = False,
    affinity: JSON | None = None,
    selector: dict[str, str] | None = None,
) -> JSON:
    p = pod(name, cpu="1", gpus=gpus, tolerations=[GPU_TOLERATION], node_selector=selector, affinity=affinity)
    p["spec"]["schedulerName"] = "tandem-scheduler"
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    if gated:
        p["spec"]["schedulingGates"] = [{"name": GATE}]
    return p


def pin(node_name: str) -> JSON:
    return required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]})


class StubExtender:
    """A tiny extender on 127.0.0.1 (port 0) serving /tandem/filter and /tandem/prioritize."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, JSON]] = []
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}
        self.scores: dict[str, int] = {}
        self.error = ""
        self.status = 200
        self.delay_s = 0.0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _filter(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("filter", body))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return web.Response(status=self.status, text="broken")
        if self.error:
            return web.json_response({"Error": self.error})
        names = body["NodeNames"]
        refused = set(self.failed) | set(self.unresolvable)
        return web.json_response(
            {
                "NodeNames": [n for n in names if n not in refused],
                "FailedNodes": {n: r for n, r in self.failed.items() if n in names},
                "FailedAndUnresolvableNodes": {n: r for n, r in self.unresolvable.items() if n in names},
                "Error": "",
            }
        )

    async def _prioritize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("prioritize", body))
        return web.json_response([{"Host": n, "Score": self.scores.get(n, 0)} for n in body["NodeNames"]])

    async def __aenter__(self) -> StubExtender:
        app = web.Application()
        app.router.add_post("/tandem/filter", self._filter)
        app.router.add_post("/tandem/prioritize", self._prioritize)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def pods_seen(self, verb: str = "filter") -> list[str]:
        return [body["Pod"]["metadata"]["name"] for v, body in self.calls if v == verb]


@contextlib.asynccontextmanager
async def running(nodes: list[JSON], **kw: Any) -> AsyncIterator[tuple[SimCluster, StubExtender, KubeClient]]:
    async with StubExtender() as stub:
        async with SimCluster(
            nodes, manifests=REPO / "manifests", extender_url=stub.url, heartbeat_interval_s=60.0, **kw
        ) as c:
            await c.create_namespace("team-a")
            assert c.admin is not None
            yield c, stub, c.admin


async def fetch(client: KubeClient, name: str) -> JSON:
    return await client.get(kr.PODS, name, "team-a")


async def bound_to(client: KubeClient, name: str) -> str:
    async def node() -> str:
        return str((await fetch(client, name))["spec"].get("nodeName") or "")

    return await eventually(node)


async def scheduled_condition(client: KubeClient, name: str, reason: str) -> JSON:
    async def cond() -> JSON | None:
        for c in (await fetch(client, name))["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c.get("reason") == reason:
                return dict(c)
        return None

    return await eventually(cond)


async def test_a_pod_pinned_by_match_fields_binds_to_exactly_that_node() -> None:
    # node-0008's hostname label is "node-0007": a hostname-label pin would pick the wrong node
    nodes = [real_node("node-0007", hostname="h100-r7-n1"), real_node("node-0008", hostname="node-0007")]
    async with running(nodes) as (c, stub, admin):
        await admin.create(kr.PODS, gpu_pod("pinned", affinity=pin("node-0007")), "team-a")
        assert await bound_to(admin, "pinned") == "node-0007"
        by_label = required(
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-0007"]}]}
        )
        await admin.create(kr.PODS, gpu_pod("by-label", affinity=by_label), "team-a")
        assert await bound_to(admin, "by-label") == "node-0008"
        filters = [b for verb, b in stub.calls if verb == "filter" and b["Pod"]["metadata"]["name"] == "pinned"]
        assert filters[0]["NodeNames"] == ["node-0007"] and filters[0]["Nodes"] is None
        assert "prioritize" not in [v for v, b in stub.calls if b["Pod"]["metadata"]["name"] == "pinned"]


async def test_a_pod_that_fits_nowhere_gets_kube_schedulers_message_with_the_extenders_reasons() -> None:
    nodes = [
        real_node("h100-a"),
        real_node("h100-b"),
        real_node("h100-small", gpus=2),
        real_node("t4", product="Tesla-T4"),
        real_node("infer", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
    ]
    async with running(nodes) as (c, stub, admin):
        stub.failed = {"h100-a": "gang train-42 holds this node"}
        stub.unresolvable = {"h100-b": "node h100-b is not Ready"}
        await admin.create(kr.PODS, gpu_pod("big", gpus=4, selector={"nvidia.com/gpu.product": H100}), "team-a")
        cond = await scheduled_condition(admin, "big", "Unschedulable")
        assert cond["status"] == "False"
        assert cond["message"] == (
            "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 1 gang train-42 holds this node, "
            "1 node h100-b is not Ready, 1 node(s) didn't match Pod's node affinity/selector, "
            "1 node(s) had untolerated taint {dedicated: infer}. "
            "preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling."
        )
        assert stub.calls[0][1]["NodeNames"] == ["h100-a", "h100-b"]  # only what passed the in-tree filters
        events = (await admin.list(kr.EVENTS, "team-a", field_selector="involvedObject.name=big")).items
        assert any(e["reason"] == "FailedScheduling" and e["message"] == cond["message"] for e in events)
        assert "nodeName" not in (await fetch(admin, "big"))["spec"]


async def test_gated_pods_are_never_bound_until_the_gate_is_lifted() -> None:
    async with running([real_node("h100-a")]) as (c, stub, admin):
        await admin.create(kr.PODS, gpu_pod("gated", gated=True), "team-a")
        await admin.create(kr.PODS, gpu_pod("free"), "team-a")
        assert await bound_to(admin, "free") == "h100-a"  # the scheduler has processed both creations
        gated = await fetch(admin, "gated")
        assert "nodeName" not in gated["spec"] and "gated" not in stub.pods_seen()
        assert any(x["reason"] == "SchedulingGated" for x in gated["status"]["conditions"])
        await admin.patch(
            kr.PODS,
            "gated",
            {"spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]}},
            patch_type="strategic",
            namespace="team-a",
        )
        assert await bound_to(admin, "gated") == "h100-a"


async def test_an_extender_error_or_failure_fails_the_cycle() -> None:
    async with running([real_node("h100-a")]) as (c, stub, admin):
        stub.error = "inventory not synced yet"
        await admin.create(kr.PODS, gpu_pod("p1"), "team-a")
        cond = await scheduled_condition(admin, "p1", "SchedulerError")
        assert cond["message"] == "inventory not synced yet"
        stub.error, stub.status = "", 500
        await admin.create(kr.PODS, gpu_pod("p2"), "team-a")
        cond = await scheduled_condition(admin, "p2", "SchedulerError")
        assert cond["message"] == f"failed filter with extender at URL {stub.url}/tandem/filter, code 500"
        stub.status = 200  # the extender recovers: the back-off retries bind both
        assert await bound_to(admin, "p1") == "h100-a" and await bound_to(admin, "p2") == "h100-a"


async def test_the_extender_timeout_is_its_http_timeout() -> None:
    profile = load_profile(SHIPPED_CONFIG, "tandem-scheduler")
    quick = dataclasses.replace(profile, extenders=(dataclasses.replace(profile.extenders[0], http_timeout_s=0.2),))
    async with running([real_node("h100-a")], scheduler_profile=quick) as (c, stub, admin):
        stub.delay_s = 1.0
        await admin.create(kr.PODS, gpu_pod("slow"), "team-a")
        cond = await scheduled_condition(admin, "slow", "SchedulerError")
        assert cond["message"] == (
            f'Post "{stub.url}/tandem/filter": context deadline exceeded '
            "(Client.Timeout exceeded while awaiting headers)"
        )


async def test_the_extenders_priorities_outweigh_packing() -> None:
    async with running([real_node("h100-a"), real_node("h100-b")]) as (c, stub, admin):
        await admin.create(kr.PODS, gpu_pod("first", gpus=4, affinity=pin("h100-a")), "team-a")
        assert await bound_to(admin, "first") == "h100-a"
        stub.scores = {"h100-a": 5, "h100-b": 5}  # equal: MostAllocated packs onto the used node
        await admin.create(kr.PODS, gpu_pod("packed", gpus=2), "team-a")
        assert await bound_to(admin, "packed") == "h100-a"
        stub.scores = {"h100-a": 4, "h100-b": 5}  # one extender point (x150x10) beats every plugin score
        await admin.create(kr.PODS, gpu_pod("steered", gpus=1), "team-a")
        assert await bound_to(admin, "steered") == "h100-b"
        assert "steered" in stub.pods_seen("prioritize")


async def test_the_cache_counts_assumed_pods_once_and_releases_finished_ones() -> None:
    sched = Scheduler(KubeClient("http://127.0.0.1:9"), load_profile(SHIPPED_CONFIG, "tandem-scheduler"))
    sched.nodes.store["h100-a"] = real_node("h100-a")
    first, second = gpu_pod("first", gpus=4), gpu_pod("second", gpus=4)
    first["spec"]["nodeName"] = "h100-a"
    first["status"] = {"phase": "Running"}
    sched._on_pod(None, first)
    sched._assumed["team-a/second"] = ("h100-a", sp.pod_requests(second))
    (info,) = sched.snapshot()
    assert (info.requested["nvidia.com/gpu"], info.pods) == (8, 2)
    bound = copy.deepcopy(second) | {"status": {"phase": "Pending"}}
    bound["spec"]["nodeName"] = "h100-a"
    sched._on_pod(second, bound)
    (info,) = sched.snapshot()
    assert (info.requested["nvidia.com/gpu"], info.pods) == (8, 2)
    sched._on_pod(first, first | {"status": {"phase": "Succeeded"}})
    (info,) = sched.snapshot()
    assert (info.requested["nvidia.com/gpu"], info.pods) == (4, 1)


def test_only_its_own_ungated_unbound_pods_are_queued() -> None:
    sched = Scheduler(KubeClient("http://127.0.0.1:9"), load_profile(SHIPPED_CONFIG, "tandem-scheduler"))
    other = gpu_pod("other")
    other["spec"]["schedulerName"] = "default-scheduler"
    gated = gpu_pod("gated", gated=True)
    for p in (other, gated, gpu_pod("mine")):
        sched._on_pod(None, p)
    assert sched.queue.pending() == {"team-a/mine": "active"}
    ungated = copy.deepcopy(gated)
    ungated["spec"]["schedulingGates"] = []
    sched._on_pod(gated, ungated)
    assert sched.queue.pending() == {"team-a/mine": "active", "team-a/gated": "active"}


async def test_three_four_gpu_pods_on_one_eight_gpu_node_two_bind() -> None:
    async with running([real_node("h100-a", gpus=8)]) as (c, stub, admin):
        for i in range(3):
            await admin.create(kr.PODS, gpu_pod(f"p{i}", gpus=4), "team-a")
        bound = [await bound_to(admin, f"p{i}") for i in range(2)]
        assert bound == ["h100-a", "h100-a"]
        cond = await scheduled_condition(admin, "p2", "Unschedulable")
        assert "1 Insufficient nvidia.com/gpu" in cond["message"]


# ---- with the real Tandem extender -----------------------------------------------------------------

FIXTURE_RACKS = ["h100-r1-n1", "h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]


def as_created(obj: JSON, scheduler_name: str | None = None) -> JSON:
    """A fixture pod as a client would create it: no server-set metadata, no status, no computed priority."""
    meta = obj["metadata"]
    spec = copy.deepcopy(obj["spec"])
    spec.pop("priority", None)
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": spec,
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta.get("labels") or {}},
    }


@contextlib.asynccontextmanager
async def tandem_extender(c: SimCluster, tmp_path: Path) -> AsyncIterator[Any]:
    """The real extender in-process: inventory fed by its kube watcher (as the shipped SA), served on port 0."""
    from extender import kube as ekube
    from extender.app import make_app
    from extender.config import ExtenderConfig
    from extender.inventory import Inventory

    config = ExtenderConfig(listen="127.0.0.1:0", url_prefix="/tandem", scheduler_name="tandem-scheduler")
    inventory = Inventory(config)
    token = await c.service_account_token("tandem-system", "tandem-scheduler")
    api = await ekube.load_api_client(kubeconfig=str(c.kubeconfig(tmp_path / "extender.kubeconfig", token)))
    watcher = ekube.Watcher(api, inventory, ekube.KubeSettings(reservation_namespace="tandem-system"))
    task = asyncio.create_task(watcher.run())
    runner = web.AppRunner(make_app(inventory, config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:

        async def ready() -> bool:
            return inventory.ready

        await eventually(ready)
        c.set_extender_url(f"http://127.0.0.1:{port}")
        yield inventory
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await runner.cleanup()
        await api.close()  # type: ignore[no-untyped-call]


async def test_with_the_real_tandem_extender(tmp_path: Path) -> None:
    cluster = fixture_json("cluster.json")["items"]
    nodes = [o for o in cluster if o["kind"] == "Node" and o["metadata"]["name"] in FIXTURE_RACKS]
    async with SimCluster(nodes, manifests=REPO / "manifests", heartbeat_interval_s=60.0) as c:
        admin = c.admin
        assert admin is not None and c.kubelet is not None
        for ns in ("team-a", "team-b"):
            await c.create_namespace(ns)
        for p in cluster:
            if p["kind"] == "Pod" and p["metadata"]["name"] in ("llm-pretrain-0", "finetune-0", "finetune-1"):
                await admin.create(kr.PODS, as_created(p))  # bound already: 6 GPUs on r1-n1, 2 on each r2 node
        async with tandem_extender(c, tmp_path) as inventory:
            pending = {p["metadata"]["name"]: p for p in fixture_json("pending-pods.json")["items"]}
            await admin.create(kr.PODS, as_created(pending["want-4-h100"], "tandem-scheduler"))
            node = await bound_to(admin, "want-4-h100")
            # the extender keeps the whole node h100-r1-n2 for an 8-GPU pod and fills a broken-up r2 node
            assert node in ("h100-r2-n1", "h100-r2-n2")

            await c.kubelet.set_ready("h100-r1-n2", False)

            async def extender_sees_not_ready() -> bool:
                facts = inventory.facts_for("h100-r1-n2")
                return facts is not None and not facts.node.ready

            await eventually(extender_sees_not_ready)
            await admin.create(kr.PODS, as_created(pending["want-8"], "tandem-scheduler"))
            cond = await scheduled_condition(admin, "want-8", "Unschedulable")
            head, _, tail = cond["message"].partition(", 3 Insufficient nvidia.com/gpu. ")
            assert head.startswith("0/4 nodes are available: 1 ") and "h100-r1-n2" in head and "Ready" in head
            assert tail == "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."

            await c.kubelet.set_ready("h100-r1-n2", True)  # a node event: the pod is retried at once
            assert await bound_to(admin, "want-8") == "h100-r1-n2"
