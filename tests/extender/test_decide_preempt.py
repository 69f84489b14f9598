"""The preempt verb: keep nodes where evicting the victims makes the pod fit and spares running gangs."""

from __future__ import annotations

from typing import Any

from extender.inventory import Inventory
from tests.extender.extender_builders import claim, gang_pod, pod
from tests.extender.extender_support import cluster_items, fixture_pod, make_inventory, start_client


def uid_of(name: str) -> str:
    for o in cluster_items():
        if o["kind"] == "Pod" and o["metadata"]["name"] == name:
            return str(o["metadata"]["uid"])
    raise KeyError(name)


def meta(*names: str, pdb: int = 0) -> dict[str, Any]:
    return {"Pods": [{"UID": uid_of(n)} for n in names], "NumPDBViolations": pdb}


async def preempt(inv: Inventory, body: dict[str, Any]) -> dict[str, Any]:
    server, session, c = await start_client(inv)
    try:
        status, reply = await c.post("preempt", body)
        assert status == 200
        return reply
    finally:
        await session.close()
        await server.close()


async def test_keeps_nodes_where_victims_make_room() -> None:
    body = {
        "Pod": fixture_pod("want-8"),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "h100-r1-n1": meta("llm-pretrain-0", pdb=1),  # frees 6 of 8: fits
            "h100-r2-n1": meta("finetune-0"),  # frees 2: fits
            "gb200-r5-n1": meta("nvl-worker-0"),  # 4 GPUs in all: never fits
            "h100-r2-n2": {"Pods": [], "NumPDBViolations": 0},  # no victims: dropped
            "ghost": meta("finetune-1"),  # unknown node: dropped
        },
    }
    reply = await preempt(make_inventory(), body)
    kept = reply["NodeNameToMetaVictims"]
    assert set(kept) == {"h100-r1-n1", "h100-r2-n1"}
    assert kept["h100-r1-n1"] == {"Pods": [{"UID": uid_of("llm-pretrain-0")}], "NumPDBViolations": 1}
    assert all(v["Pods"] for v in kept.values())


async def test_drops_nodes_whose_victims_include_a_running_gang_member() -> None:
    inv = make_inventory()
    member = gang_pod("train-9-0", "train-9", "1", 2, node_name="h100-r2-n2", phase="Running")
    inv.apply("Pod", "ADDED", member)
    body = {
        "Pod": fixture_pod("want-8"),
        "NodeNameToMetaVictims": {
            "h100-r2-n2": {"Pods": [{"UID": uid_of("finetune-1")}, {"UID": member["metadata"]["uid"]}]},
            "h100-r2-n1": meta("finetune-0"),
        },
    }
    reply = await preempt(inv, body)
    assert set(reply["NodeNameToMetaVictims"]) == {"h100-r2-n1"}


async def test_drops_nodes_where_the_pod_still_would_not_fit() -> None:
    inv = make_inventory()
    inv.apply("Pod", "ADDED", pod("other", gpus=4, node_name="h100-r2-n1", phase="Running"))
    body = {"Pod": fixture_pod("want-8"), "NodeNameToMetaVictims": {"h100-r2-n1": meta("finetune-0")}}
    reply = await preempt(inv, body)
    assert reply["NodeNameToMetaVictims"] == {}


async def test_full_victim_pods_when_not_node_cache_capable() -> None:
    victim = next(o for o in cluster_items() if o["kind"] == "Pod" and o["metadata"]["name"] == "finetune-0")
    body = {
        "Pod": fixture_pod("want-8"),
        "NodeNameToVictims": {"h100-r2-n1": {"Pods": [victim], "NumPDBViolations": 0}},
    }
    reply = await preempt(make_inventory(), body)
    assert reply["NodeNameToMetaVictims"] == {
        "h100-r2-n1": {"Pods": [{"UID": uid_of("finetune-0")}], "NumPDBViolations": 0}
    }


async def test_dra_victim_frees_its_devices() -> None:
    inv = make_inventory()
    inv.apply("ResourceClaim", "ADDED", claim("want-7", 7))
    seven = pod("d7", claims=[{"name": "g", "resourceClaimName": "want-7"}], cpu="1", memory="1Gi")
    body = {"Pod": seven, "NodeNameToMetaVictims": {"h200-dra-1": meta("dra-train-0")}}
    reply = await preempt(inv, body)
    assert set(reply["NodeNameToMetaVictims"]) == {"h200-dra-1"}  # 6 free + the victim's 2 >= 7


async def test_preempt_before_sync_keeps_nothing() -> None:
    inv = Inventory(make_inventory().config)
    body = {"Pod": fixture_pod("want-8"), "NodeNameToMetaVictims": {"h100-r2-n1": meta("finetune-0")}}
    reply = await preempt(inv, body)
    assert reply == {"NodeNameToMetaVictims": {}}
