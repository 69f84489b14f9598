"""Per-node fit decisions, device choice on allocate, and exact release."""

import pytest

from placement.allocation import allocate, release
from placement.dra import DraEvaluator
from placement.errors import CapacityError
from placement.fit import Fit, capacity
from placement.model import DraDevice, DraRequest, LabelRequirement, Node, PodShape, Taint
from placement.reasons import Reason
from tests.placement.builders import GIB, h200_device, mig_inst, node, shape

R = Reason
A100_MIG = {
    0: (mig_inst("3g.40gb", 0, 4, used=True), mig_inst("3g.40gb", 4, 4)),
    1: (
        mig_inst("1g.10gb", 0, 1),
        mig_inst("1g.10gb", 1, 1, used=True),
        mig_inst("2g.20gb", 2, 2),
        mig_inst("3g.40gb", 4, 4),
    ),
}
H200_DRA = tuple(h200_device(i, allocated=i < 2) for i in range(8))
IS_H200 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"


def dra(count: int, *selectors: str, cls: str = "gpu.nvidia.com") -> tuple[DraRequest, ...]:
    return (DraRequest(cls, selectors, count),)


CASES: list[tuple[str, Node, PodShape, int, Reason | None]] = [
    ("whole 4 on 8", node(), shape(4), 2, None),
    ("whole 3 on 8", node(), shape(3), 2, None),
    ("whole 8 on 8", node(), shape(8), 1, None),
    ("whole 4 on 2 free", node(used=range(6)), shape(4), 0, R.INSUFFICIENT_GPUS),
    ("more than the node has", node(gpus=4), shape(8), 0, R.GPU_COUNT_TOO_LARGE),
    ("model ok", node(model="H100"), shape(1, models=["H100", "H200"]), 8, None),
    ("model mismatch", node(model="GB200"), shape(1, models=["H100"]), 0, R.GPU_MODEL_MISMATCH),
    ("gpu memory", node(memory_mib=40000), shape(1, min_mem=80000), 0, R.GPU_MEMORY_TOO_SMALL),
    ("no gpu", node(gpus=0), shape(1), 0, R.NO_GPU),
    ("no gpu, model asked", node(gpus=0), shape(1, models=["H100"]), 0, R.NO_GPU),
    ("unhealthy excluded", node(gpus=4, unhealthy=[0, 1]), shape(2), 1, None),
    ("mig gpus are not whole gpus", node(gpus=2, mig=A100_MIG), shape(1), 0, R.GPU_MODEL_MISMATCH),
    ("share 250 on partly used", node(gpus=2, milli={0: 750, 1: 500}), shape(1, milli=250), 3, None),
    ("share does not fit", node(gpus=2, milli={0: 800, 1: 900}), shape(1, milli=250), 0, R.INSUFFICIENT_GPU_SHARE),
    ("share on 2 distinct devices", node(gpus=3, milli={0: 0, 1: 500, 2: 1000}), shape(2, milli=500), 1, None),
    ("share on 2 of 3 empty", node(gpus=3), shape(2, milli=500), 3, None),
    ("whole needs untouched gpu", node(gpus=2, milli={0: 100, 1: 100}), shape(1), 0, R.INSUFFICIENT_GPUS),
    ("cpu bound", node(cpu=10), shape(1, cpu=4), 2, None),
    ("cpu short", node(cpu=2), shape(1, cpu=4), 0, R.INSUFFICIENT_CPU),
    ("memory short", node(mem_gib=8), shape(1, mem_gib=16), 0, R.INSUFFICIENT_MEMORY),
    ("memory bound", node(mem_gib=40), shape(1, mem_gib=16), 2, None),
    ("pods bound", node(pods=3), shape(1), 3, None),
    ("no pod slots", node(pods=0), shape(1), 0, R.TOO_MANY_PODS),
    ("not ready", node(ready=False), shape(1), 0, R.NOT_READY),
    ("cordoned", node(cordoned=True), shape(1), 0, R.CORDONED),
    ("taint", node(), shape(1, tolerate=False), 0, R.TAINT_NOT_TOLERATED),
    (
        "prefer-no-schedule ignored",
        node(taints=(Taint("x", "", "PreferNoSchedule"),)),
        shape(1, tolerate=False),
        8,
        None,
    ),
    ("selector match", node(labels={"pool": "a"}), shape(1, selector={"pool": "a"}), 8, None),
    ("selector mismatch", node(labels={"pool": "b"}), shape(1, selector={"pool": "a"}), 0, R.NODE_SELECTOR_MISMATCH),
    ("cpu-only pod", node(gpus=0), shape(0, cpu=2), 64, None),
    ("mig detailed", node(gpus=2, mig=A100_MIG), shape(mig="3g.40gb"), 2, None),
    ("mig detailed 2 per pod", node(gpus=2, mig=A100_MIG), shape(mig="3g.40gb", mig_count=2), 1, None),
    ("mig all used", node(gpus=2, mig=A100_MIG), shape(mig="1g.10gb", mig_count=2), 0, R.INSUFFICIENT_MIG),
    ("mig profile absent", node(gpus=2, mig=A100_MIG), shape(mig="7g.80gb"), 0, R.NO_MIG_PROFILE),
    (
        "mig mixed counts",
        node(gpus=0, extended={"nvidia.com/mig-1g.10gb": 5}),
        shape(mig="1g.10gb", mig_count=2),
        2,
        None,
    ),
    (
        "mig mixed none free",
        node(gpus=0, extended={"nvidia.com/mig-1g.10gb": 0}),
        shape(mig="1g.10gb"),
        0,
        R.INSUFFICIENT_MIG,
    ),
    ("mig on a non-mig node", node(), shape(mig="1g.10gb"), 0, R.NO_MIG_PROFILE),
    ("extended", node(gpus=0, extended={"example.com/fpga": 3}), shape(extended={"example.com/fpga": 1}), 3, None),
    (
        "extended short",
        node(gpus=0, extended={"example.com/fpga": 1}),
        shape(extended={"example.com/fpga": 2}),
        0,
        R.INSUFFICIENT_EXTENDED,
    ),
    ("dra 4 of 6 free", node(gpus=0, dra=H200_DRA), shape(dra=dra(4, IS_H200)), 1, None),
    ("dra 2 of 6 free", node(gpus=0, dra=H200_DRA), shape(dra=dra(2)), 3, None),
    ("dra 7 of 6 free", node(gpus=0, dra=H200_DRA), shape(dra=dra(7)), 0, R.INSUFFICIENT_DRA_DEVICES),
    (
        "dra no match",
        node(gpus=0, dra=H200_DRA),
        shape(dra=dra(1, "device.attributes['gpu.nvidia.com'].productName == 'B200'")),
        0,
        R.NO_DRA_DEVICES,
    ),
    (
        "dra missing attribute",
        node(gpus=0, dra=H200_DRA),
        shape(dra=dra(1, "device.attributes['gpu.nvidia.com'].profile == '1g'")),
        0,
        R.DRA_SELECTOR_ERROR,
    ),
    (
        "dra unknown class",
        node(gpus=0, dra=H200_DRA),
        shape(dra=dra(1, cls="fpga.example.com")),
        0,
        R.DRA_CLASS_UNKNOWN,
    ),
    ("dra none on node", node(), shape(dra=dra(1)), 0, R.NO_DRA_DEVICES),
    ("dra two requests share devices", node(gpus=0, dra=H200_DRA), shape(dra=dra(2) + dra(1, IS_H200)), 2, None),
]


@pytest.mark.parametrize(("name", "n", "s", "count", "reason"), CASES, ids=[c[0] for c in CASES])
def test_capacity(name: str, n: Node, s: PodShape, count: int, reason: Reason | None) -> None:
    f = capacity(n, s)
    assert (f.count, f.reason) == (count, reason)
    assert (f.detail == "") == (reason is None)


def test_affinity_terms_or_and_match_fields() -> None:
    n = node("n7", labels={"pool": "a"})
    ok = PodShape(
        gpus=1,
        tolerations=shape(1).tolerations,
        affinity=((LabelRequirement("pool", "In", ("b",)),), (LabelRequirement("pool", "In", ("a",)),)),
    )
    assert capacity(n, ok).count == 8
    bad = PodShape(
        gpus=1,
        tolerations=shape(1).tolerations,
        affinity=((LabelRequirement("pool", "In", ("a",)), LabelRequirement("x", "Exists")),),
    )
    assert capacity(n, bad).reason is R.NODE_SELECTOR_MISMATCH
    pinned = PodShape(
        gpus=1, tolerations=shape(1).tolerations, affinity=((LabelRequirement("metadata.name", "In", ("n7",)),),)
    )
    assert capacity(n, pinned).count == 8 and capacity(node("n8"), pinned).count == 0


def test_detail_names_the_numbers() -> None:
    f = capacity(node("h1", used=range(6)), shape(4))
    assert f == Fit(0, R.INSUFFICIENT_GPUS, "node h1 has 2 free GPUs, pod needs 4")


def test_allocate_whole_takes_lowest_free_index() -> None:
    n = node(gpus=8, used=[0, 2])
    after, alloc = allocate(n, shape(3))
    assert tuple(i for i, _ in alloc.gpus) == (1, 3, 4)
    assert after.free_whole_gpus == 3
    assert after.cpu_milli_free == n.cpu_milli_free - 1000 and after.pods_free == n.pods_free - 1


def test_allocate_share_is_best_fit() -> None:
    n = node(gpus=3, milli={0: 200, 1: 700, 2: 0})
    after, alloc = allocate(n, shape(1, milli=250))
    assert alloc.gpus == ((1, 250),)
    assert [g.milli_used for g in after.gpus] == [200, 950, 0]


def test_allocate_mig_detailed_and_counts() -> None:
    after, alloc = allocate(node(gpus=2, mig=A100_MIG), shape(mig="3g.40gb"), 2)
    assert alloc.mig == ((0, 4), (1, 4))
    assert capacity(after, shape(mig="3g.40gb")).reason is R.INSUFFICIENT_MIG
    after, alloc = allocate(node(gpus=0, extended={"nvidia.com/mig-1g.10gb": 5}), shape(mig="1g.10gb", mig_count=2))
    assert after.extended_free == {"nvidia.com/mig-1g.10gb": 3}
    assert alloc.extended == (("nvidia.com/mig-1g.10gb", 2),)


def test_allocate_dra_marks_devices() -> None:
    after, alloc = allocate(node(gpus=0, dra=H200_DRA), shape(dra=dra(4, IS_H200)))
    assert [k[2] for k in alloc.dra] == ["gpu-2", "gpu-3", "gpu-4", "gpu-5"]
    assert sum(not d.allocated for d in after.dra_devices) == 2


def test_allocate_too_many_raises() -> None:
    with pytest.raises(CapacityError) as err:
        allocate(node(gpus=8), shape(4), 3)
    assert (err.value.wanted, err.value.fits, err.value.reason) == (3, 2, R.INSUFFICIENT_GPUS)


@pytest.mark.parametrize(
    ("n", "s", "r"),
    [
        (node(used=[1]), shape(3), 2),
        (node(gpus=3, milli={0: 200, 1: 700}), shape(1, milli=250), 4),
        (node(gpus=2, mig=A100_MIG), shape(mig="3g.40gb"), 2),
        (
            node(gpus=0, extended={"nvidia.com/mig-1g.10gb": 5, "example.com/x": 9}),
            shape(mig="1g.10gb", extended={"example.com/x": 2}),
            2,
        ),
        (node(gpus=0, dra=H200_DRA), shape(dra=dra(2)), 3),
    ],
)
def test_release_restores_exactly(n: Node, s: PodShape, r: int) -> None:
    after, alloc = allocate(n, s, r)
    assert after != n
    assert release(after, alloc) == n


# Dynamic MIG through DRA: the full GPU and every possible partition are advertised, and they overlap.
def _dyn(name: str, profile: str | None, slices: range) -> DraDevice:
    attrs: dict[str, str | int | bool] = {"type": "mig" if profile else "gpu", "productName": "NVIDIA H100"}
    if profile:
        attrs["parentUUID"], attrs["profile"] = "GPU-A", profile
    else:
        attrs["uuid"] = "GPU-A"
    return DraDevice(
        "gpu.nvidia.com", "p", name, attrs, {f"memorySlice{i}": 1 for i in slices} if profile else {"memory": 80 * GIB}
    )


DYN = (
    _dyn("gpu-0", None, range(0)),
    _dyn("gpu-0-mig-3g40gb-9-0", "3g.40gb", range(0, 4)),
    _dyn("gpu-0-mig-3g40gb-9-4", "3g.40gb", range(4, 8)),
    _dyn("gpu-0-mig-4g40gb-5-0", "4g.40gb", range(0, 4)),
)
MIG3 = dra(1, "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'", cls="mig.nvidia.com")
MIG4 = dra(1, "device.attributes['gpu.nvidia.com'].profile == '4g.40gb'", cls="mig.nvidia.com")


def test_dra_dynamic_mig_respects_placements() -> None:
    n = node(gpus=0, dra=DYN)
    assert capacity(n, shape(dra=MIG3)).count == 2
    # a 4g at 0 leaves only the 3g at 4
    after4, _ = allocate(n, shape(dra=MIG4))
    assert capacity(after4, shape(dra=MIG3)).count == 1
    # the full GPU blocks every partition, and a partition blocks the full GPU
    after_full, _ = allocate(n, shape(dra=dra(1)))
    assert capacity(after_full, shape(dra=MIG3)).reason is R.INSUFFICIENT_DRA_DEVICES
    after3, _ = allocate(n, shape(dra=MIG3))
    assert capacity(after3, shape(dra=dra(1))).reason is R.INSUFFICIENT_DRA_DEVICES
    assert capacity(after3, shape(dra=MIG4)).reason is R.INSUFFICIENT_DRA_DEVICES


def test_custom_device_classes_passed_through() -> None:
    ev = DraEvaluator({"any-gpu": ("device.driver == 'gpu.nvidia.com'",)})
    n = node(gpus=0, dra=H200_DRA)
    assert capacity(n, shape(dra=dra(3, cls="any-gpu")), dra=ev).count == 2
    assert capacity(n, shape(dra=dra(3, cls="any-gpu"))).reason is R.DRA_CLASS_UNKNOWN


def test_memory_detail_in_gib() -> None:
    assert (
        capacity(node("m", mem_gib=8), shape(1, mem_gib=16)).detail == "node m has 8.0Gi memory free, pod needs 16.0Gi"
    )
