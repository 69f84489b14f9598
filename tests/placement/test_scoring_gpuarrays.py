"""The columnar node view the scorers run on: feasibility, GPU choice, placement, versions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.gpuarrays import GpuArrays, PodDemand


def cluster() -> GpuArrays:
    return GpuArrays.from_nodes(
        ["a", "b", "c"], [16000, 64000, 8000], [65536, 65536, 4096], [2, 8, 0], ["T4", "G2", ""]
    )


def test_from_nodes_masks_absent_gpus() -> None:
    a = cluster()
    assert a.gpu_left.shape == (3, 8)
    assert list(a.gpu_total_left) == [2000, 8000, 0]
    assert a.present[0].tolist() == [True, True] + [False] * 6


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        (PodDemand(4000, 1024), [True, True, True]),
        (PodDemand(4000, 1024, 1, 500), [True, True, False]),
        (PodDemand(4000, 1024, 4, 1000), [False, True, False]),
        (PodDemand(4000, 1024, 1, 500, frozenset({"T4"})), [True, False, False]),
        (PodDemand(32000, 1024, 1, 500), [False, True, False]),
        (PodDemand(1000, 8192), [True, True, False]),
    ],
)
def test_feasible(demand: PodDemand, expected: list[bool]) -> None:
    assert cluster().feasible(demand).tolist() == expected


def test_place_updates_row_and_version_only() -> None:
    a = cluster()
    before = a.version.copy()
    a.place(1, PodDemand(4000, 1024, 2, 1000), (0, 1))
    assert a.cpu_left[1] == 60000 and a.mem_left[1] == 65536 - 1024
    assert a.gpu_left[1, :3].tolist() == [0, 0, 1000]
    assert a.version[1] != before[1] and a.version[0] == before[0]
    assert a.pod_count[1] == 1 and a.pod_tags[1] == 1 << 2


def test_placed_leaves_the_original_unchanged() -> None:
    a = cluster()
    b = a.placed(0, PodDemand(1000, 0, 1, 300), (1,))
    assert a.gpu_left[0, 1] == 1000 and b.gpu_left[0, 1] == 700
    assert a.version[0] != b.version[0]


def test_best_gpu_choice() -> None:
    a = cluster()
    a.place(1, PodDemand(1000, 0, 1, 300), (3,))
    a.place(1, PodDemand(1000, 0, 1, 600), (5,))
    assert a.select_gpus_best(1, PodDemand(1000, 0, 1, 300)) == (5,)
    assert a.select_gpus_best(1, PodDemand(1000, 0, 1, 500)) == (3,)
    assert a.select_gpus_best(1, PodDemand(1000, 0, 2, 1000)) == (0, 1)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        PodDemand(1000, 0, 1, 1500)
    with pytest.raises(ValueError):
        PodDemand(1000, 0, 1, 0)
    a = cluster()
    with pytest.raises(ValueError):
        a.place(0, PodDemand(1000, 0, 1, 500), (4,))  # absent GPU


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([100, 250, 500, 810, 1000]), st.integers(0, 8000)), max_size=40
    )
)
def test_best_choice_never_over_allocates(pods: list[tuple[int, int, int]]) -> None:
    a = cluster()
    for k, g, cpu in pods:
        d = PodDemand(cpu, 0, k, g if k else 0)
        rows = np.flatnonzero(a.feasible(d))
        if len(rows):
            a.place(int(rows[0]), d, a.select_gpus_best(int(rows[0]), d))
    assert (a.gpu_left >= 0).all() and (a.cpu_left >= 0).all() and (a.mem_left >= 0).all()
    assert (a.gpu_left[~a.present] == 0).all()
