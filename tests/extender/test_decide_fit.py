"""Every refusal reason of the filter, through the real app: GPUs, MIG, shares, DRA, CPU/memory, node state."""

from __future__ import annotations

from typing import Any

import pytest

from extender.config import ExtenderConfig
from extender.inventory import Inventory
from tests.extender.extender_builders import args, claim, device_class, node, pod
from tests.extender.extender_support import ALL_NODES, fixture_pod, make_inventory, start_client


async def call(inv: Inventory, verb: str, body: Any) -> Any:
    server, session, c = await start_client(inv)
    try:
        status, reply = await c.post(verb, body)
        assert status == 200
        return reply
    finally:
        await session.close()
        await server.close()


def refusal(reply: dict[str, Any], name: str) -> tuple[str, str]:
    """('failed' | 'unresolvable', message) for a refused node."""
    if name in reply["FailedNodes"]:
        return "failed", reply["FailedNodes"][name]
    return "unresolvable", reply["FailedAndUnresolvableNodes"][name]


async def test_cordoned_and_not_ready_are_unresolvable() -> None:
    inv = make_inventory([node(name="h100-cordoned", cordoned=True)])
    reply = await call(
        inv, "filter", args(fixture_pod("want-4-h100"), ["h100-cordoned", "h100-notready", "h100-r1-n2"])
    )
    assert reply["NodeNames"] == ["h100-r1-n2"]
    assert refusal(reply, "h100-cordoned") == ("unresolvable", "node h100-cordoned is cordoned (unschedulable)")
    assert refusal(reply, "h100-notready") == ("unresolvable", "node h100-notready is not Ready")


@pytest.mark.parametrize(
    ("gpus", "node_name", "kind", "text"),
    [
        (4, "h100-r1-n1", "failed", "has 2 free GPUs, pod needs 4"),  # preemption could free them
        (8, "gb200-r5-n2", "unresolvable", "has 4 GPUs in all, pod needs 8"),
        (1, "cpu-1", "unresolvable", "has no GPU"),
        (1, "a100-mig-1", "unresolvable", "MIG mode"),
        (1, "h200-dra-1", "unresolvable", "DRA-only"),
    ],
)
async def test_gpu_count_reasons(gpus: int, node_name: str, kind: str, text: str) -> None:
    reply = await call(make_inventory(), "filter", args(pod("p", gpus=gpus), [node_name]))
    assert reply["NodeNames"] == []
    got_kind, message = refusal(reply, node_name)
    assert got_kind == kind and text in message and node_name in message


async def test_gpu_model_from_node_selector() -> None:
    p = pod("p", gpus=1, node_selector={"nvidia.com/gpu.product": "Tesla-T4"})
    reply = await call(make_inventory(), "filter", args(p, ["t4-1", "h100-r1-n2"]))
    assert reply["NodeNames"] == ["t4-1"]
    kind, message = refusal(reply, "h100-r1-n2")
    assert kind == "unresolvable" and "NVIDIA-H100-80GB-HBM3" in message and "Tesla-T4" in message


async def test_gpu_memory_via_affinity() -> None:
    p = pod("p", gpus=1)
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}]}
                ]
            }
        }
    }
    reply = await call(make_inventory(), "filter", args(p, ["t4-1", "h100-r2-n1"]))
    assert reply["NodeNames"] == ["h100-r2-n1"]
    assert "affinity" in refusal(reply, "t4-1")[1]


async def test_gpu_pod_without_toleration_is_refused_by_taint() -> None:
    reply = await call(make_inventory(), "filter", args(pod("p", gpus=1, tolerate_gpu=False), ["h100-r2-n1"]))
    kind, message = refusal(reply, "h100-r2-n1")
    assert kind == "unresolvable" and "nvidia.com/gpu" in message


@pytest.mark.parametrize(
    ("cpu", "memory", "text"),
    [("200", "1Gi", "CPU"), ("1", "3000Gi", "memory")],
)
async def test_cpu_and_memory(cpu: str, memory: str, text: str) -> None:
    reply = await call(make_inventory(), "filter", args(pod("p", gpus=1, cpu=cpu, memory=memory), ["h100-r2-n1"]))
    kind, message = refusal(reply, "h100-r2-n1")
    assert kind == "failed" and text in message


async def test_mig_profile_counts() -> None:
    inv = make_inventory()
    p = fixture_pod("want-mig-3g")
    reply = await call(inv, "filter", args(p, ALL_NODES))
    assert reply["NodeNames"] == ["a100-mig-1"]
    assert "offers no MIG instances of profile 3g.40gb" in refusal(reply, "h100-r1-n2")[1]
    # three more 3g.40gb instances in use: all four taken
    busy = pod(
        "serve-more",
        extra={"nvidia.com/mig-3g.40gb": "3"},
        cpu="1",
        memory="1Gi",
        node_name="a100-mig-1",
        phase="Running",
    )
    inv.apply("Pod", "ADDED", busy)
    reply = await call(inv, "filter", args(p, ["a100-mig-1"]))
    kind, message = refusal(reply, "a100-mig-1")
    assert kind == "failed" and "0 free MIG 3g.40gb" in message


async def test_mig_small_profile_fits_many() -> None:
    p = pod("small", extra={"nvidia.com/mig-1g.10gb": "11"}, cpu="1", memory="1Gi")
    reply = await call(make_inventory(), "filter", args(p, ["a100-mig-1"]))
    assert reply["NodeNames"] == ["a100-mig-1"]  # 14 allocatable, 3 in use
    p = pod("small", extra={"nvidia.com/mig-1g.10gb": "12"}, cpu="1", memory="1Gi")
    reply = await call(make_inventory(), "filter", args(p, ["a100-mig-1"]))
    assert "11 free MIG 1g.10gb" in refusal(reply, "a100-mig-1")[1]


async def test_fractional_share() -> None:
    inv = make_inventory()
    share = {"tandem.dev/gpu-milli": "600"}
    p = pod("half", extra=share, cpu="1", memory="1Gi")
    reply = await call(inv, "filter", args(p, ["t4-1"]))
    assert reply["NodeNames"] == ["t4-1"]
    for i in range(2):  # each T4 now 600/1000 used
        inv.apply(
            "Pod", "ADDED", pod(f"sharer-{i}", extra=share, cpu="1", memory="1Gi", node_name="t4-1", phase="Running")
        )
    reply = await call(inv, "filter", args(p, ["t4-1"]))
    kind, message = refusal(reply, "t4-1")
    assert kind == "failed" and "600/1000" in message
    small = pod("small", extra={"tandem.dev/gpu-milli": "400"}, cpu="1", memory="1Gi")
    reply = await call(inv, "filter", args(small, ["t4-1"]))
    assert reply["NodeNames"] == ["t4-1"]


async def test_dra_counts_allocated_devices() -> None:
    inv = make_inventory()
    p = fixture_pod("want-dra-4")
    reply = await call(inv, "filter", args(p, ["h200-dra-1"]))
    assert reply["NodeNames"] == ["h200-dra-1"]  # 8 devices, 2 allocated
    inv.apply("ResourceClaim", "ADDED", claim("other", 3, allocated=["gpu-2", "gpu-3", "gpu-4"]))
    reply = await call(inv, "filter", args(p, ["h200-dra-1"]))
    kind, message = refusal(reply, "h200-dra-1")
    assert kind == "failed" and "3 free DRA devices" in message


@pytest.mark.parametrize(
    ("selector", "passes", "text"),
    [
        ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'", True, ""),
        (
            "device.attributes['gpu.nvidia.com'].architecture == 'Hopper' && "
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('140Gi')) >= 0",
            True,
            "",
        ),
        ("device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('580.0.0'))", True, ""),
        ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'", False, "no DRA device matching"),
        ("device.attributes['gpu.nvidia.com'].noSuchAttribute == 1", False, "selector failed"),
    ],
)
async def test_dra_selectors(selector: str, passes: bool, text: str) -> None:
    inv = make_inventory([claim("sel", 1, selectors=(selector,))])
    p = pod("dra", claims=[{"name": "gpus", "resourceClaimName": "sel"}], cpu="1", memory="1Gi")
    reply = await call(inv, "filter", args(p, ["h200-dra-1"]))
    assert (reply["NodeNames"] == ["h200-dra-1"]) is passes
    if not passes:
        kind, message = refusal(reply, "h200-dra-1")
        assert kind == "unresolvable" and text in message


async def test_dra_device_class_from_cluster_and_unknown_class() -> None:
    inv = make_inventory(
        [
            device_class(
                "numa0-h200",
                "device.driver == 'gpu.nvidia.com'",
                "device.attributes['resource.kubernetes.io'].numaNode == 0",
            ),
            claim("numa", 4, device_class="numa0-h200"),
            claim("numa-too-many", 5, device_class="numa0-h200"),
            claim("nope", 1, device_class="no-such-class"),
        ]
    )

    def dra_pod(claim_name: str) -> dict[str, Any]:
        return pod("d", claims=[{"name": "g", "resourceClaimName": claim_name}], cpu="1", memory="1Gi")

    reply = await call(inv, "filter", args(dra_pod("numa"), ["h200-dra-1"]))
    assert reply["NodeNames"] == []  # numa 0 holds gpu-0..3, two of them allocated
    assert "2 free DRA devices" in refusal(reply, "h200-dra-1")[1]
    inv.apply("ResourceClaim", "ADDED", claim("numa2", 2, device_class="numa0-h200"))
    reply = await call(inv, "filter", args(dra_pod("numa2"), ["h200-dra-1"]))
    assert reply["NodeNames"] == ["h200-dra-1"]
    reply = await call(inv, "filter", args(dra_pod("nope"), ["h200-dra-1"]))
    kind, message = refusal(reply, "h200-dra-1")
    assert kind == "unresolvable" and "no-such-class" in message


async def test_dra_claim_problems_are_whole_request_errors() -> None:
    inv = make_inventory()
    missing = pod("d", claims=[{"name": "g", "resourceClaimName": "not-there"}], cpu="1", memory="1Gi")
    reply = await call(inv, "filter", args(missing, ["h200-dra-1"]))
    assert "not-there" in reply["Error"]
    templ = pod("d", claims=[{"name": "g", "resourceClaimTemplateName": "tpl"}], cpu="1", memory="1Gi")
    reply = await call(inv, "filter", args(templ, ["h200-dra-1"]))
    assert "not created yet" in reply["Error"]
    inv.apply("ResourceClaim", "ADDED", claim("bad-sel", 1, selectors=("device.attributes[",)))
    bad = pod("d", claims=[{"name": "g", "resourceClaimName": "bad-sel"}], cpu="1", memory="1Gi")
    reply = await call(inv, "filter", args(bad, ["h200-dra-1"]))
    assert "selector" in reply["Error"]


async def test_claim_from_template_resolved_through_pod_status() -> None:
    inv = make_inventory([claim("d-g-x7k2", 2)])
    p = pod("d", claims=[{"name": "g", "resourceClaimTemplateName": "tpl"}], cpu="1", memory="1Gi")
    p["status"]["resourceClaimStatuses"] = [{"name": "g", "resourceClaimName": "d-g-x7k2"}]
    reply = await call(inv, "filter", args(p, ["h200-dra-1", "h100-r1-n2"]))
    assert reply["NodeNames"] == ["h200-dra-1"]


async def test_allocated_claim_pins_pod_to_its_node() -> None:
    inv = make_inventory([claim("shared", 1, allocated=["gpu-7"])])
    p = pod("d", claims=[{"name": "g", "resourceClaimName": "shared"}], cpu="1", memory="1Gi")
    reply = await call(inv, "filter", args(p, ["h200-dra-1", "h100-r1-n2"]))
    assert reply["NodeNames"] == ["h200-dra-1"]
    assert "allocated ResourceClaim" in refusal(reply, "h100-r1-n2")[1]


async def test_no_gpu_pod_passes_everywhere_even_not_ready() -> None:
    reply = await call(make_inventory(), "filter", args(fixture_pod("no-gpu"), ALL_NODES))
    assert reply["NodeNames"] == ALL_NODES
    assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}


async def test_prioritize_gives_zero_to_nodes_that_do_not_fit() -> None:
    reply = await call(make_inventory(), "prioritize", args(pod("p", gpus=4), ["h100-r1-n1", "h100-r2-n1", "ghost"]))
    scores = {e["Host"]: e["Score"] for e in reply}
    assert scores == {"h100-r1-n1": 0, "h100-r2-n1": 10, "ghost": 0}


async def test_verdicts_and_scores_follow_pod_events() -> None:
    inv = make_inventory(config=ExtenderConfig(scoring_policy="bestfit"))  # least GPUs left wins
    want4 = fixture_pod("want-4-h100")
    names = ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]
    before = {e["Host"]: e["Score"] for e in await call(inv, "prioritize", args(want4, names))}
    assert before["h100-r1-n2"] < before["h100-r2-n1"]
    inv.apply("Pod", "ADDED", pod("busy", gpus=3, node_name="h100-r1-n2", phase="Running"))  # 5 free now
    after = {e["Host"]: e["Score"] for e in await call(inv, "prioritize", args(want4, names))}
    assert after["h100-r1-n2"] > after["h100-r2-n1"]  # now the tightest fit
    inv.apply("Pod", "ADDED", pod("busier", gpus=2, node_name="h100-r2-n1", phase="Running"))  # 4 free
    reply = await call(inv, "filter", args(want4, names))
    assert reply["NodeNames"] == names
    inv.apply("Pod", "ADDED", pod("busiest", gpus=1, node_name="h100-r2-n1", phase="Running"))  # 3 free
    reply = await call(inv, "filter", args(want4, names))
    assert reply["NodeNames"] == ["h100-r1-n2", "h100-r2-n2"]
    assert "3 free GPUs" in reply["FailedNodes"]["h100-r2-n1"]


@pytest.mark.parametrize("policy", ["tandem-frag", "fgd", "bestfit", "packing"])
async def test_every_policy_keeps_the_whole_node_for_later(policy: str) -> None:
    inv = make_inventory(config=ExtenderConfig(scoring_policy=policy))
    reply = await call(inv, "prioritize", args(fixture_pod("want-4-h100"), ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]))
    scores = {e["Host"]: e["Score"] for e in reply}
    assert scores["h100-r2-n1"] > scores["h100-r1-n2"] and scores["h100-r2-n2"] > scores["h100-r1-n2"]


def test_unknown_policy_is_a_config_error() -> None:
    with pytest.raises(ValueError):
        ExtenderConfig(scoring_policy="nope")


async def test_prioritize_after_filter_reuses_rows_only_for_the_same_list() -> None:
    inv = make_inventory()
    want4 = fixture_pod("want-4-h100")
    names = ["h100-r2-n2", "h100-r1-n2", "h100-r2-n1"]
    server, session, c = await start_client(inv)
    try:
        _, f = await c.post("filter", args(want4, names))
        _, same = await c.post("prioritize", args(want4, f["NodeNames"]))
        _, other = await c.post("prioritize", args(want4, list(reversed(f["NodeNames"]))))
        _, fewer = await c.post("prioritize", args(want4, f["NodeNames"][:2]))
    finally:
        await session.close()
        await server.close()
    assert [e["Host"] for e in same] == names
    assert [e["Host"] for e in other] == list(reversed(names))
    assert {e["Host"]: e["Score"] for e in other} == {e["Host"]: e["Score"] for e in same}
    assert [e["Host"] for e in fewer] == names[:2]
