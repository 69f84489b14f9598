"""GPU usage per model: whole, shared, MIG (detailed and mixed counts) and DRA devices."""

import pytest

from placement.allocation import allocate
from placement.model import DraDevice, DraRequest, PodShape
from placement.topology import GangPlacement, fit_gang
from placement.usage import allocation_usage, merge_usage, mig_fraction, mig_gpus, shape_gpus
from tests.placement.builders import LEVELS, h200_device, job, mig_inst, node, shape


@pytest.mark.parametrize(
    ("profile", "model", "fraction"),
    [
        ("3g.40gb", "NVIDIA-A100-SXM4-80GB", 3 / 7),
        ("1g.10gb", "NVIDIA-A100-SXM4-40GB", 1 / 7),  # the double-memory 1g still has one compute slice
        ("7g.80gb", None, 1.0),
        ("2g.12gb", "NVIDIA A30", 2 / 4),
        ("5g.99gb", None, 5 / 7),  # unknown name: the "<g>g." prefix decides
        ("odd", None, 1.0),
    ],
)
def test_mig_fraction(profile: str, model: str | None, fraction: float) -> None:
    assert mig_fraction(profile, model) == pytest.approx(fraction)


def test_mig_gpus_counts_many_instances_with_one_division() -> None:
    # N instances cost N x compute slices / slices, divided once: 3 x 1g is exactly 3/7 (not 3 x (1/7)).
    assert mig_gpus("1g.10gb", None, 3) == 3 / 7
    assert mig_gpus("1g.10gb", "NVIDIA-A100-SXM4-40GB", 6) == 6 / 7
    assert mig_gpus("3g.40gb", "NVIDIA-A100-SXM4-80GB", 2) == 6 / 7
    assert mig_gpus("2g.12gb", "NVIDIA A30", 2) == 1.0  # 4-slice GPU
    assert mig_gpus("odd", None, 2) == 2.0
    for profile, model in (("3g.40gb", None), ("2g.12gb", "NVIDIA A30"), ("5g.99gb", None), ("odd", None)):
        assert mig_gpus(profile, model, 1) == mig_fraction(profile, model)


def test_whole_and_shared() -> None:
    n = node(model="H100")
    _, a = allocate(n, shape(2), 2)
    assert allocation_usage(n, a) == {"H100": 4.0}
    _, a = allocate(n, shape(1, milli=250), 3)
    assert allocation_usage(n, a) == pytest.approx({"H100": 0.75})


def test_mig_detailed_and_mixed() -> None:
    n = node(gpus=1, model="NVIDIA-A100-SXM4-80GB", mig={0: (mig_inst("3g.40gb", 0, 4), mig_inst("3g.40gb", 4, 4))})
    _, a = allocate(n, shape(mig="3g.40gb"), 2)
    assert allocation_usage(n, a) == pytest.approx({"NVIDIA-A100-SXM4-80GB": 6 / 7})
    m = node(gpus=0, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, extended={"nvidia.com/mig-1g.10gb": 7})
    _, a = allocate(m, shape(mig="1g.10gb", mig_count=2))
    assert allocation_usage(m, a) == pytest.approx({"NVIDIA-A100-SXM4-80GB": 2 / 7})


def test_dra_devices_by_product_name() -> None:
    mig_dev = DraDevice(
        "gpu.nvidia.com",
        "p",
        "gpu-9-mig-3g40gb-9-0",
        {"type": "mig", "profile": "3g.40gb", "productName": "NVIDIA H100"},
    )
    n = node(gpus=0, dra=(h200_device(0), h200_device(1), mig_dev))
    _, a = allocate(n, shape(dra=(DraRequest("gpu.nvidia.com", (), 2), DraRequest("mig.nvidia.com", (), 1))))
    assert allocation_usage(n, a) == pytest.approx({"NVIDIA H200": 2.0, "NVIDIA H100": 3 / 7})


def test_gang_placement_reports_usage() -> None:
    nodes = [node("a", model="H100"), node("b", model="H100")]
    p = fit_gang(nodes, job(("head", 1, shape(1, milli=500)), ("w", 3, shape(4))), LEVELS)
    assert isinstance(p, GangPlacement)
    assert p.usage == pytest.approx({"H100": 12.5})
    assert merge_usage([{"a": 1.0}, {"a": 0.5, "b": 2.0}]) == {"a": 1.5, "b": 2.0}


def test_shape_gpus_counts_whole_shared_and_mig_replicas_as_the_quota_does() -> None:
    assert shape_gpus(PodShape(gpus=8)) == 8.0
    assert shape_gpus(PodShape(gpus=1, gpu_milli=250)) == pytest.approx(0.25)
    assert shape_gpus(PodShape(mig_profile="3g.40gb", mig_count=2)) == pytest.approx(mig_gpus("3g.40gb", None, 2))
    assert shape_gpus(PodShape(cpu_milli=1000)) == 0.0
