"""`vacate` frees what replicas of a shape hold when only their node is known: the inverse of `allocate`
up to device identity, which the gang fit does not see."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.allocation import allocate, vacate
from placement.fit import capacity
from placement.model import MigInstance, PodShape
from tests.placement.builders import node

SHAPES = [
    PodShape(gpus=1),
    PodShape(gpus=2),
    PodShape(gpus=4, cpu_milli=8000),
    PodShape(gpus=8),
    PodShape(gpus=1, gpu_milli=500),
    PodShape(cpu_milli=2000, memory=1 << 30),
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SHAPES), st.sampled_from(SHAPES), st.integers(1, 8), st.integers(0, 7))
def test_vacating_what_was_allocated_gives_back_the_same_capacity(shape, probe, k, busy) -> None:  # type: ignore[no-untyped-def]
    base = node(used=range(busy), taints=())
    k = min(k, capacity(base, shape).count)
    if k == 0:
        return
    assert capacity(base, probe).count > 0 or busy == 8 or probe.gpus > 8 - busy
    taken, _ = allocate(base, shape, k)
    back = vacate(taken, shape, k)
    assert capacity(back, probe).count == capacity(base, probe).count
    assert (back.cpu_milli_free, back.memory_free, back.pods_free) == (
        base.cpu_milli_free,
        base.memory_free,
        base.pods_free,
    )


def test_vacating_frees_busy_gpus_and_never_more_than_asked() -> None:
    busy = node(used=range(8), taints=())
    assert capacity(busy, PodShape(gpus=4)).count == 0
    freed = vacate(busy, PodShape(gpus=4))
    assert capacity(freed, PodShape(gpus=4)).count == 1 and capacity(freed, PodShape(gpus=8)).count == 0


def test_vacating_mig_instances() -> None:
    insts = tuple(MigInstance("1g.10gb", 19, i, 1, used=True) for i in range(7))
    n = node(gpus=1, mig={0: insts}, taints=())
    shape = PodShape(mig_profile="1g.10gb", mig_count=2)
    assert capacity(n, shape).count == 0
    assert capacity(vacate(n, shape), shape).count == 1
