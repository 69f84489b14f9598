"""Small builders for placement tests: node(gpus=8, model="H100", rack="r1"), shape(gpus=4), job(...)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from placement.model import (
    GPU_PRODUCT_LABEL,
    DraDevice,
    DraRequest,
    Gpu,
    JobRequest,
    MigInstance,
    Node,
    PodSet,
    PodShape,
    Taint,
    Toleration,
    TopologyLevels,
)
from tests.fixtures import fixture_json as fixture  # noqa: F401 - re-exported: the placement tests' name for it

GIB = 2**30
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
GPU_TOLERATION = Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule")
LEVELS = TopologyLevels.default()
ZONE, BLOCK, RACK, CLIQUE, HOST = LEVELS.keys


def node(
    name: str = "n1",
    *,
    gpus: int = 8,
    model: str = "H100",
    memory_mib: int = 81559,
    used: Iterable[int] = (),
    milli: Mapping[int, int] | None = None,
    mig: Mapping[int, tuple[MigInstance, ...]] | None = None,
    unhealthy: Iterable[int] = (),
    cpu: int = 128,
    mem_gib: int = 1024,
    pods: int = 110,
    zone: str | None = "z1",
    block: str | None = "b1",
    rack: str | None = "r1",
    clique: str | None = None,
    taints: tuple[Taint, ...] = (GPU_TAINT,),
    ready: bool = True,
    cordoned: bool = False,
    labels: Mapping[str, str] | None = None,
    extended: Mapping[str, int] | None = None,
    dra: tuple[DraDevice, ...] = (),
) -> Node:
    """A node with `gpus` GPUs of `model`; `used` GPU indices are wholly taken."""
    used_set, bad = set(used), set(unhealthy)
    milli = milli or {}
    mig = mig or {}
    devs = tuple(
        Gpu(
            i,
            model,
            memory_mib,
            1000 if i in used_set else milli.get(i, 0),
            mig.get(i, ()),
            i not in bad,
        )
        for i in range(gpus)
    )
    all_labels = {HOST: name}
    for key, value in ((ZONE, zone), (BLOCK, block), (RACK, rack), (CLIQUE, clique)):
        if value is not None:
            all_labels[key] = value
    if gpus:
        all_labels[GPU_PRODUCT_LABEL] = model
    all_labels.update(labels or {})
    return Node(
        name=name,
        labels=all_labels,
        taints=taints if gpus or dra or extended else (),
        ready=ready,
        cordoned=cordoned,
        cpu_milli_allocatable=cpu * 1000,
        cpu_milli_free=cpu * 1000,
        memory_allocatable=mem_gib * GIB,
        memory_free=mem_gib * GIB,
        pods_free=pods,
        gpus=devs,
        extended_free=dict(extended or {}),
        dra_devices=dra,
        topology=LEVELS.path(all_labels),
    )


def shape(
    gpus: int = 0,
    *,
    milli: int = 1000,
    models: Iterable[str] = (),
    min_mem: int = 0,
    mig: str | None = None,
    mig_count: int = 1,
    dra: tuple[DraRequest, ...] = (),
    cpu: int = 1,
    mem_gib: int = 1,
    tolerate: bool = True,
    selector: Mapping[str, str] | None = None,
    extended: Mapping[str, int] | None = None,
) -> PodShape:
    """One replica's needs: cpu in cores, memory in GiB."""
    return PodShape(
        gpus=gpus,
        gpu_milli=milli,
        gpu_models=frozenset(models),
        min_gpu_memory_mib=min_mem,
        mig_profile=mig,
        mig_count=mig_count if mig else 0,
        dra=dra,
        cpu_milli=cpu * 1000,
        memory=mem_gib * GIB,
        extended=tuple(sorted((extended or {}).items())),
        tolerations=(GPU_TOLERATION,) if tolerate else (),
        node_selector=tuple(sorted((selector or {}).items())),
    )


def job(
    *sets: tuple[str, int, PodShape],
    job_id: str = "train-42",
    required: str | None = None,
    preferred: str | None = None,
    min_available: int | None = None,
) -> JobRequest:
    """A job from (name, count, shape) pod sets."""
    return JobRequest(
        job_id=job_id,
        pod_sets=tuple(PodSet(n, c, s) for n, c, s in sets),
        required_level=required,
        preferred_level=preferred,
        min_available=min_available,
    )


def mig_inst(profile: str, start: int, size: int, used: bool = False, gi: int | None = None) -> MigInstance:
    return MigInstance(profile, gi, start, size, used)


def h200_device(i: int, *, allocated: bool = False, memory: int = 141 * GIB, product: str = "NVIDIA H200") -> DraDevice:
    """A full H200 as the NVIDIA DRA driver publishes it."""
    return DraDevice(
        "gpu.nvidia.com",
        "pool-1",
        f"gpu-{i}",
        {"type": "gpu", "uuid": f"GPU-{i}", "productName": product, "resource.kubernetes.io/numaNode": i // 4},
        {"memory": memory},
        allocated,
    )
