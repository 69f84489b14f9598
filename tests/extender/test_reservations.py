"""The reservation ConfigMap: what the agent writes the extender reads back; pod sets, expiry, the older form."""

from __future__ import annotations

import pytest

from extender.config import ExtenderConfig
from extender.errors import InventoryError
from extender.inventory import Inventory
from extender.reservations import parse_reservation, reservation_configmap
from placement.model import DraRequest, PodShape
from placement.overlay import Reservation, ReservedPart
from tests.extender.extender_builders import gang_pod, node, reservation
from tests.extender.extender_support import cluster_items

WORKER = PodShape(gpus=4, cpu_milli=16_000, memory=64 << 30, extended=(("rdma/hca", 1),))
HEAD = PodShape(gpus=0, cpu_milli=4_000, memory=8 << 30, dra=(DraRequest("gpu.nvidia.com", ("true",), 2),))


def _res(attempt: int = 3) -> Reservation:
    return Reservation(
        "train-42",
        attempt,
        (
            ReservedPart("workers", "node-0007", 2, WORKER),
            ReservedPart("workers", "node-0008", 2, WORKER),
            ReservedPart("head", "node-0007", 1, HEAD),
        ),
    )


def test_what_the_agent_writes_is_what_the_extender_reads() -> None:
    cm = reservation_configmap(
        _res(),
        {"workers": WORKER, "head": HEAD},
        namespace="tandem-system",
        name="train-42-3",
        label="tandem.dev/reservation",
        domain="network.example.com/rack=r7",
        expires_at=1_800_000_000.0,
        dispatch_id="s1/train-42/3",
    )
    assert cm["metadata"]["labels"]["tandem.dev/reservation"] == "true"
    assert "ownerReferences" not in cm["metadata"]  # a cross-namespace owner would get it deleted at once
    held = parse_reservation(cm)
    assert held.gang == ("train-42", "3") and held.domain_label == "rack r7"
    assert held.expires_at == 1_800_000_000.0 and held.dispatch_id == "s1/train-42/3"
    assert held.nodes == {"node-0007", "node-0008"}
    got = {
        (p.pod_set, p.node): (
            p.replicas,
            p.shape.gpus,
            p.shape.cpu_milli,
            p.shape.memory,
            p.shape.extended,
            p.shape.dra,
        )
        for p in held.reservation.parts
    }
    assert got == {
        ("workers", "node-0007"): (2, 4, 16_000, 64 << 30, (("rdma/hca", 1),), ()),
        ("workers", "node-0008"): (2, 4, 16_000, 64 << 30, (("rdma/hca", 1),), ()),
        ("head", "node-0007"): (1, 0, 4_000, 8 << 30, (), HEAD.dra),
    }


def test_the_older_single_shape_form_is_still_read() -> None:
    held = parse_reservation(reservation("job-a", "2", {"h100-r1-n2": 2}, gpus=4, mig={"1g.10gb": 1}))
    assert held.gang == ("job-a", "2")
    shapes = sorted((p.shape.gpus, p.shape.mig_profile or "", p.shape.mig_count) for p in held.reservation.parts)
    assert shapes == [(0, "1g.10gb", 1), (4, "", 0)]  # one replica takes both


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"attempt": "1", "nodes": "{}"}, "data.job"),
        ({"job": "j", "attempt": "one", "nodes": "{}"}, "data.attempt"),
        ({"job": "j", "attempt": "1", "nodes": '{"n": -1}'}, "nodes"),
        ({"job": "j", "attempt": "1", "nodes": "{}", "expires_at": "tomorrow"}, "expires_at"),
        ({"job": "j", "attempt": "1", "pod_sets": '[{"nodes": {"n": 1}, "shape": {"gpu_milli": 0}}]'}, "gpu_milli"),
    ],
)
def test_a_bad_reservation_names_the_field(data: dict[str, str], field: str) -> None:
    with pytest.raises(InventoryError, match=field):
        parse_reservation({"metadata": {"name": "r", "namespace": "tandem-system"}, "data": data})


def _inventory(now: list[float], *extra: dict) -> Inventory:  # type: ignore[type-arg]
    inv = Inventory(ExtenderConfig(), wall_clock=lambda: now[0])
    inv.load_list({"kind": "List", "items": [*cluster_items(), *extra]})
    return inv


def test_an_expired_reservation_holds_nothing_even_with_the_agent_gone() -> None:
    shape = PodShape(gpus=8, cpu_milli=8_000, memory=64 << 30)
    cm = reservation_configmap(
        Reservation("train-9", 1, (ReservedPart("w", "h100-r1-n2", 1, shape),)),
        {"w": shape},
        namespace="tandem-system",
        name="train-9-1",
        label="tandem.dev/reservation",
        expires_at=1000.0,
    )
    now = [999.0]
    inv = _inventory(now, cm)
    facts = inv.snapshot().facts_by_name("h100-r1-n2")
    assert facts is not None and [h.job for h in facts.holds] == ["train-9"]
    now[0] = 1000.5
    assert inv.expire_reservations() == 1
    facts = inv.snapshot().facts_by_name("h100-r1-n2")
    assert facts is not None and facts.holds == ()
    assert inv.reservations() == []
    late = _inventory([2000.0], cm)  # loaded after expiry (extender restarted): never held
    assert late.reservations() == [] and late.snapshot().facts_by_name("h100-r1-n2").holds == ()  # type: ignore[union-attr]


def test_bound_replicas_consume_their_own_pod_sets_part_only() -> None:
    shape = PodShape(gpus=2, cpu_milli=1_000, memory=1 << 30)
    res = Reservation("g", 1, (ReservedPart("a", "h100-r1-n2", 1, shape), ReservedPart("b", "h100-r1-n2", 2, shape)))
    cm = reservation_configmap(
        res, {"a": shape, "b": shape}, namespace="tandem-system", name="g-1", label="tandem.dev/reservation"
    )
    bound = gang_pod("g-1-b-0", "g", "1", 2, node_name="h100-r1-n2", phase="Running")
    bound["metadata"]["labels"]["tandem.dev/pod-set"] = "b"
    inv = _inventory([0.0], cm, bound, node("h100-r1-n2"))
    facts = inv.snapshot().facts_by_name("h100-r1-n2")
    assert facts is not None
    assert sorted(h.replicas for h in facts.holds) == [1, 1]  # a: 1 of 1 still held; b: 1 of 2
