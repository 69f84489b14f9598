"""Gangs and reservations: pinned replicas, GPUs held for gangs not fully started, consumption by bound replicas."""

from __future__ import annotations

from typing import Any

from extender.inventory import Inventory
from tests.extender.extender_builders import args, gang_pod, pod, reservation
from tests.extender.extender_support import fixture_pod, make_inventory, start_client

H100 = ["h100-r1-n2", "h100-r2-n1", "h100-r2-n2"]


async def filter_(inv: Inventory, p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    server, session, c = await start_client(inv)
    try:
        status, reply = await c.post("filter", args(p, names))
        assert status == 200 and reply["Error"] == ""
        return reply
    finally:
        await session.close()
        await server.close()


async def test_gang_pod_passes_only_its_assigned_node() -> None:
    inv = make_inventory()
    p = gang_pod("train-42-0", "train-42", "1", 4, pinned="h100-r2-n1")
    reply = await filter_(inv, p, H100)
    assert reply["NodeNames"] == ["h100-r2-n1"]
    for other in ("h100-r1-n2", "h100-r2-n2"):
        msg = reply["FailedAndUnresolvableNodes"][other]
        assert "gang train-42" in msg and "h100-r2-n1" in msg


async def test_gang_pod_refused_on_its_node_when_it_lacks_room() -> None:
    p = gang_pod("train-42-0", "train-42", "1", 8, pinned="h100-r2-n1")
    reply = await filter_(make_inventory(), p, ["h100-r2-n1"])
    assert reply["NodeNames"] == []
    msg = reply["FailedNodes"]["h100-r2-n1"]
    assert "6 free GPUs, pod needs 8" in msg and "gang train-42" in msg


async def test_reserved_gpus_are_refused_to_other_pods() -> None:
    res = reservation("train-42", "1", {"h100-r1-n2": 2}, gpus=4, domain="rack r1")
    inv = make_inventory([res])
    reply = await filter_(inv, fixture_pod("want-4-h100"), H100)
    assert reply["NodeNames"] == ["h100-r2-n1", "h100-r2-n2"]
    msg = reply["FailedAndUnresolvableNodes"]["h100-r1-n2"]
    assert "gang train-42 (attempt 1) in rack r1" in msg and "2 replica(s) x 4 GPU(s)" in msg
    assert "0 free GPUs, pod needs 4" in msg


async def test_gang_uses_its_own_reservation_but_not_anothers() -> None:
    inv = make_inventory([reservation("train-42", "1", {"h100-r1-n2": 2}, gpus=4)])
    own = gang_pod("train-42-0", "train-42", "1", 4, pinned="h100-r1-n2")
    assert (await filter_(inv, own, H100))["NodeNames"] == ["h100-r1-n2"]
    other = gang_pod("train-43-0", "train-43", "1", 4, pinned="h100-r1-n2")
    reply = await filter_(inv, other, ["h100-r1-n2"])
    assert reply["NodeNames"] == []
    assert "train-42" in reply["FailedAndUnresolvableNodes"]["h100-r1-n2"]
    stale = gang_pod("train-42-0", "train-42", "0", 4, pinned="h100-r1-n2")  # an older attempt
    assert (await filter_(inv, stale, ["h100-r1-n2"]))["NodeNames"] == []


async def test_bound_replicas_consume_the_reservation() -> None:
    inv = make_inventory([reservation("train-42", "1", {"h100-r1-n2": 2}, gpus=4)])
    want4 = fixture_pod("want-4-h100")
    inv.apply("Pod", "ADDED", gang_pod("train-42-0", "train-42", "1", 4, node_name="h100-r1-n2", phase="Running"))
    # 4 GPUs used by the bound replica, 4 still held for the second one
    reply = await filter_(inv, want4, ["h100-r1-n2"])
    assert reply["NodeNames"] == []
    assert "1 replica(s) x 4 GPU(s)" in reply["FailedAndUnresolvableNodes"]["h100-r1-n2"]
    inv.apply("Pod", "ADDED", gang_pod("train-42-1", "train-42", "1", 4, node_name="h100-r1-n2", phase="Pending"))
    reply = await filter_(inv, want4, ["h100-r1-n2"])
    # fully started: nothing held, but both replicas use all 8 GPUs
    assert "0 free GPUs" in reply["FailedNodes"]["h100-r1-n2"]
    assert "held" not in reply["FailedNodes"]["h100-r1-n2"]


async def test_reservation_events_change_verdicts() -> None:
    inv = make_inventory()
    want4 = fixture_pod("want-4-h100")
    assert (await filter_(inv, want4, H100))["NodeNames"] == H100
    res = reservation("train-42", "1", {"h100-r2-n1": 1, "h100-r2-n2": 1}, gpus=4)
    inv.apply("Reservation", "ADDED", res)
    assert (await filter_(inv, want4, H100))["NodeNames"] == ["h100-r1-n2"]
    inv.apply("Reservation", "DELETED", res)
    assert (await filter_(inv, want4, H100))["NodeNames"] == H100


async def test_partial_hold_leaves_the_rest_usable() -> None:
    inv = make_inventory([reservation("train-42", "1", {"h100-r1-n2": 1}, gpus=4)])
    assert (await filter_(inv, fixture_pod("want-4-h100"), ["h100-r1-n2"]))["NodeNames"] == ["h100-r1-n2"]
    assert (await filter_(inv, pod("p5", gpus=5), ["h100-r1-n2"]))["NodeNames"] == []


async def test_mig_reservation() -> None:
    res = reservation("infer-7", "1", {"a100-mig-1": 3}, gpus=0, cpu="1", memory="1Gi", mig={"3g.40gb": 1})
    inv = make_inventory([res])
    reply = await filter_(inv, fixture_pod("want-mig-3g"), ["a100-mig-1"])
    assert "infer-7" in reply["FailedAndUnresolvableNodes"]["a100-mig-1"]


async def test_malformed_reservation_is_skipped_and_reported() -> None:
    bad = reservation("train-42", "1", {"h100-r1-n2": 2})
    bad["data"]["nodes"] = "not json"
    inv = make_inventory([bad])
    assert any("train-42" in e for e in inv.errors)
    assert (await filter_(inv, fixture_pod("want-4-h100"), H100))["NodeNames"] == H100


async def test_reservations_outside_the_namespace_are_ignored() -> None:
    inv = make_inventory([reservation("train-42", "1", {"h100-r1-n2": 2}, namespace="team-a")])
    assert (await filter_(inv, fixture_pod("want-4-h100"), H100))["NodeNames"] == H100


async def test_gang_refusal_names_the_domain_and_what_it_still_needs() -> None:
    res = reservation("train-42", "1", {"h100-r2-n1": 1, "h100-r2-n2": 1}, gpus=4, domain="network.example.com/rack=r2")
    inv = make_inventory([res])
    inv.apply("Pod", "ADDED", pod("squatter", gpus=3, node_name="h100-r2-n1", phase="Running"))
    p = gang_pod("train-42-0", "train-42", "1", 4, pinned="h100-r2-n1")
    reply = await filter_(inv, p, ["h100-r2-n1"])
    msg = reply["FailedNodes"]["h100-r2-n1"]
    assert msg.startswith("rack r2 holds 9 free GPUs for gang train-42, needs 8")
    assert "3 free GPUs, pod needs 4" in msg
