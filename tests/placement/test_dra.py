"""DRA CEL selectors: Kubernetes examples, quantity/semver adapters, error policy."""

import pytest

from placement.dra import DraEvaluator, check_selector, device_slices
from placement.errors import SelectorError
from placement.model import DraDevice, DraVersion
from tests.placement.builders import GIB, h200_device

H200 = DraDevice(
    "gpu.nvidia.com",
    "h200-dra-1",
    "gpu-0",
    {
        "type": "gpu",
        "productName": "NVIDIA H200",
        "architecture": "Hopper",
        "driverVersion": DraVersion("580.95.5"),
        "resource.kubernetes.io/numaNode": 0,
        "cudaComputeCapability": DraVersion("9.0.0"),
    },
    {"memory": 141 * GIB},
)


@pytest.mark.parametrize(
    ("expr", "result"),
    [
        ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'", True),
        ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100'", False),
        ("device.driver == 'gpu.nvidia.com'", True),
        ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0", True),
        ("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('200Gi'))", False),
        ("device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('200Gi'))", True),
        ("device.capacity['gpu.nvidia.com'].memory == quantity('144384Mi')", True),
        ("device.capacity['gpu.nvidia.com'].memory.asInteger() == 151397597184", True),
        ("quantity('1Gi') == quantity('1024Mi')", True),
        ("device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.0.0'))", True),
        ("device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('9.0.0')) == 0", True),
        ("device.attributes['gpu.nvidia.com'].driverVersion.major() == 580", True),
        ("device.attributes['resource.kubernetes.io'].numaNode == 0", True),
        ("'gpu.nvidia.com' in device.attributes", True),
        ("'other.example.com' in device.attributes", False),
        ("'profile' in device.attributes['gpu.nvidia.com']", False),
        (
            "'profile' in device.attributes['gpu.nvidia.com'] && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
            False,
        ),
        ("device.attributes['gpu.nvidia.com'].profile == '1g.10gb' || true", True),
        # an unknown domain is an empty map (Kubernetes rule), so this is false, not an error
        ("'x' in device.attributes['vendor.example.com']", False),
    ],
)
def test_selector_results(expr: str, result: bool) -> None:
    assert DraEvaluator().evaluate(H200, expr) is result


@pytest.mark.parametrize(
    "expr",
    [
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",  # missing attribute
        "device.attributes['gpu.nvidia.com'].productName",  # not a bool
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(semver('1.0.0'))",  # type mix
        "quantity('12 Gi') == quantity('1Gi')",  # bad quantity
    ],
)
def test_runtime_errors_are_reported_not_raised(expr: str) -> None:
    r = DraEvaluator().evaluate(H200, expr)
    assert isinstance(r, str) and r


def test_compile_error_raises_selector_error() -> None:
    with pytest.raises(SelectorError) as err:
        check_selector("device.(")
    assert err.value.expression == "device.("
    with pytest.raises(SelectorError):
        DraEvaluator().evaluate(H200, "device.attributes[")


def test_match_applies_class_and_request_selectors_and_counts_errors() -> None:
    ev = DraEvaluator()
    devices = [h200_device(0), h200_device(1, product="NVIDIA H100"), h200_device(2, allocated=True)]
    m = ev.match(devices, "gpu.nvidia.com", ["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"])
    assert [d.name for d in m.devices] == ["gpu-0", "gpu-2"]  # allocation is fit's business
    assert m.errors == 0
    m = ev.match(devices, "gpu.nvidia.com", ["device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"])
    assert m.devices == () and m.errors == 3 and "profile" in m.first_error
    assert ev.match(devices, "mig.nvidia.com").devices == ()
    assert ev.match(devices, "nope.example.com").unknown_class


def test_cache_sees_changed_attributes() -> None:
    ev = DraEvaluator()
    expr = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
    assert ev.evaluate(h200_device(0), expr) is True
    assert ev.evaluate(h200_device(0, product="NVIDIA H100"), expr) is False


def test_custom_device_classes() -> None:
    ev = DraEvaluator({"big-gpu": ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('100Gi')) > 0",)})
    small = h200_device(1, memory=80 * GIB)
    assert [d.name for d in ev.match([h200_device(0), small], "big-gpu").devices] == ["gpu-0"]


@pytest.mark.parametrize(
    ("device", "slices"),
    [
        (DraDevice("gpu.nvidia.com", "p", "gpu-0", {"type": "gpu", "uuid": "U0"}), ("U0", 0xFF)),
        (
            DraDevice("gpu.nvidia.com", "p", "gpu-0-mig-3g40gb-9-4", {"type": "mig", "parentUUID": "U0"}),
            ("U0", 0xF0),
        ),
        (DraDevice("gpu.nvidia.com", "p", "gpu-1-mig-19-4-1", {"type": "mig"}), ("minor-1", 0x10)),
        (
            DraDevice(
                "gpu.nvidia.com", "p", "gpu-0-mig-1g10gb-19-3", {"type": "mig", "parentUUID": "U0"}, {"memorySlice3": 1}
            ),
            ("U0", 0x08),
        ),
        (DraDevice("other.com", "p", "nic-0", {}), None),
    ],
)
def test_device_slices(device: DraDevice, slices: tuple[str, int] | None) -> None:
    assert device_slices(device) == slices


def test_compile_error_is_a_whole_request_error_even_through_fit() -> None:
    from placement.fit import capacity
    from placement.model import DraRequest
    from tests.placement.builders import node, shape

    ev = DraEvaluator()
    with pytest.raises(SelectorError):
        ev.match([h200_device(0), h200_device(1)], "gpu.nvidia.com", ["device.attributes["])
    with pytest.raises(SelectorError) as err:
        capacity(node(gpus=0, dra=(h200_device(0),)), shape(dra=(DraRequest("gpu.nvidia.com", ("device.(",), 1),)))
    assert err.value.expression == "device.("
    # the same on a node without devices: the answer does not depend on which node is asked
    with pytest.raises(SelectorError):
        capacity(node(gpus=0), shape(dra=(DraRequest("gpu.nvidia.com", ("device.(",), 1),)))
