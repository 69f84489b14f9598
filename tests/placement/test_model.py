"""Model semantics: tolerations, label requirements, DRA attribute names, topology levels, reasons."""

import pytest

from placement.model import (
    DraDevice,
    DraVersion,
    Gpu,
    JobRequest,
    LabelRequirement,
    PodSet,
    PodShape,
    Taint,
    Toleration,
    TopologyLevels,
)
from placement.reasons import Reason
from tests.placement.builders import node

NOSCHED = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("tol", "taint", "ok"),
    [
        (Toleration("nvidia.com/gpu", "Exists"), NOSCHED, True),
        (Toleration("nvidia.com/gpu", "Equal", "present"), NOSCHED, True),
        (Toleration("nvidia.com/gpu", "Equal", "absent"), NOSCHED, False),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoExecute"), NOSCHED, False),
        (Toleration("", "Exists"), NOSCHED, True),
        (Toleration("", "Equal"), NOSCHED, False),
        (Toleration("other", "Exists"), NOSCHED, False),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"), NOSCHED, True),
    ],
)
def test_toleration_rules(tol: Toleration, taint: Taint, ok: bool) -> None:
    assert tol.tolerates(taint) is ok


LABELS = {"zone": "a", "gen": "5"}


@pytest.mark.parametrize(
    ("req", "ok"),
    [
        (LabelRequirement("zone", "In", ("a", "b")), True),
        (LabelRequirement("zone", "In", ("b",)), False),
        (LabelRequirement("zone", "NotIn", ("b",)), True),
        (LabelRequirement("missing", "NotIn", ("b",)), True),
        (LabelRequirement("zone", "Exists"), True),
        (LabelRequirement("missing", "Exists"), False),
        (LabelRequirement("missing", "DoesNotExist"), True),
        (LabelRequirement("gen", "Gt", ("4",)), True),
        (LabelRequirement("gen", "Lt", ("4",)), False),
        (LabelRequirement("zone", "Gt", ("4",)), False),
        (LabelRequirement("zone", "Bogus", ("a",)), False),
    ],
)
def test_label_requirement(req: LabelRequirement, ok: bool) -> None:
    assert req.matches(LABELS) is ok


def test_dra_attribute_resolves_qualified_and_short_names() -> None:
    d = DraDevice(
        "gpu.nvidia.com",
        "p",
        "gpu-0",
        {"productName": "NVIDIA H200", "resource.kubernetes.io/numaNode": 1, "driverVersion": DraVersion("580.95.5")},
    )
    assert d.attribute("productName") == "NVIDIA H200"
    assert d.attribute("gpu.nvidia.com/productName") == "NVIDIA H200"
    assert d.attribute("resource.kubernetes.io/numaNode") == 1
    assert d.attribute("numaNode") is None
    assert d.attribute("other.com/productName") is None
    assert d.attribute("driverVersion") == DraVersion("580.95.5")
    assert d.key == ("gpu.nvidia.com", "p", "gpu-0")


def test_node_helpers() -> None:
    n = node(gpus=4, model="H100", used=[0], milli={1: 250})
    assert n.gpu_model == "H100"
    assert n.free_whole_gpus == 2
    assert n.total_gpus == 4
    assert n.gpu_memory_mib == 81559
    assert node(gpus=0).gpu_model is None
    assert Gpu(0, "H100", 1, milli_used=300).milli_free == 700
    assert Gpu(0, "H100", 1, healthy=False).milli_free == 0


def test_topology_levels_default_and_custom_labels() -> None:
    default = TopologyLevels.default()
    assert default.keys == (
        "topology.kubernetes.io/zone",
        "network.example.com/block",
        "network.example.com/rack",
        "nvidia.com/gpu.clique",
        "kubernetes.io/hostname",
    )
    custom = TopologyLevels.default(block_label="acme.io/pod", rack_label="acme.io/rack")
    assert custom.keys[1:3] == ("acme.io/pod", "acme.io/rack")
    assert custom.path({"acme.io/rack": "r9", "kubernetes.io/hostname": "h"}) == (None, None, "r9", None, "h")
    assert custom.index("acme.io/rack") == 2


def test_job_min_replicas() -> None:
    s = PodShape(gpus=1)
    j = JobRequest("j", (PodSet("head", 1, s), PodSet("w", 8, s)), min_available=3)
    assert (j.total_replicas, j.min_replicas) == (9, 3)
    assert JobRequest("j", (PodSet("w", 8, s),)).min_replicas == 8
    assert JobRequest("j", (PodSet("h", 1, s), PodSet("w", 8, s)), min_available=1).min_replicas == 2


def test_shape_is_hashable_for_caching() -> None:
    assert hash(PodShape(gpus=2)) == hash(PodShape(gpus=2))


def test_reasons_have_unique_codes_and_fixability() -> None:
    codes = [r.code for r in Reason]
    assert len(codes) == len(set(codes))
    assert Reason.from_code("InsufficientGpus") is Reason.INSUFFICIENT_GPUS
    fixable = {r for r in Reason if r.preemptible}
    assert Reason.INSUFFICIENT_CPU in fixable and Reason.INSUFFICIENT_MIG in fixable
    assert Reason.GPU_MODEL_MISMATCH not in fixable and Reason.TAINT_NOT_TOLERATED not in fixable
    assert Reason.NOT_READY not in fixable and Reason.RESERVED_FOR_GANG not in fixable


def test_reason_message_fills_and_tolerates_missing_fields() -> None:
    assert Reason.INSUFFICIENT_GPUS.message(node="n1", have=2, want=4) == "node n1 has 2 free GPUs, pod needs 4"
    assert Reason.INSUFFICIENT_GPUS.message(node="n1") == "node n1 has ? free GPUs, pod needs ?"
