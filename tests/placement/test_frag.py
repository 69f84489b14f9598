"""FGD's fragmentation measure against the published simulator's test vectors, and typical pods."""

from __future__ import annotations

import numpy as np
import pytest

from placement.frag import (
    FragEvaluator,
    TargetWorkload,
    TypicalPod,
    frag_single,
    typical_pods,
    without_memory,
)
from placement.gpuarrays import GpuArrays, PodDemand

# (cpu milli, gpu milli, gpu count, model or "", percent) - the 35 classes of FGD's frag_test.go.
FGD_TEST_CLASSES = [
    (6000, 465, 1, "", 9.33),
    (8000, 440, 1, "2080", 9.15),
    (8000, 475, 1, "T4", 8.76),
    (8000, 440, 1, "P100", 8.72),
    (2000, 465, 1, "", 8.68),
    (12000, 900, 1, "", 8.65),
    (4000, 900, 1, "", 8.43),
    (16000, 678, 1, "T4", 8.36),
    (8000, 500, 1, "", 8.29),
    (6000, 511, 1, "", 8.11),
    (14000, 1000, 2, "2080", 0.54),
    (4000, 1000, 1, "2080", 0.43),
    (32000, 1000, 2, "T4", 0.43),
    (16000, 1000, 1, "V100M16", 0.40),
    (64000, 1000, 2, "", 0.40),
    (10000, 1000, 2, "", 0.40),
    (11400, 1000, 1, "T4", 0.36),
    (16000, 1000, 1, "T4", 0.36),
    (4000, 1000, 2, "", 0.36),
    (14000, 1000, 2, "V100M16", 0.36),
    (8000, 1000, 4, "", 0.36),
    (16000, 1000, 2, "", 0.32),
    (2000, 1000, 1, "T4", 0.32),
    (6000, 1000, 1, "", 0.32),
    (4000, 1000, 1, "", 0.32),
    (5000, 1000, 1, "", 0.32),
    (32000, 1000, 4, "V100M16", 0.32),
    (32000, 1000, 2, "", 0.32),
    (24000, 1000, 8, "2080", 0.32),
    (40000, 1000, 4, "", 0.29),
    (32000, 1000, 8, "", 0.29),
    (32000, 1000, 1, "T4", 0.29),
    (16000, 1000, 1, "", 0.25),
    (7000, 1000, 1, "V100M16", 0.25),
    (24000, 1000, 1, "T4", 0.25),
]


def workload(rows: list[tuple[int, int, int, str, float]]) -> TargetWorkload:
    return TargetWorkload(
        tuple(TypicalPod(c, g, k, frozenset([m]) if m else frozenset(), pct / 100) for c, g, k, m, pct in rows)
    )


def test_single_class_lacking_cpu_counts_all_idle_gpu() -> None:
    w = workload([(6000, 465, 1, "", 9.33)])
    assert frag_single(1000, [200, 1000, 1000, 500], "1080", w) == pytest.approx(251.91, abs=0.01)


@pytest.mark.parametrize(
    ("cpu", "left", "expected"),
    [
        (1000, [200, 1000, 1000, 500], 2566.62),
        (1000, [1000] * 4, 3802.40),
        (1000, [1000] * 8, 7604.80),
    ],
)
def test_35_class_vectors(cpu: int, left: list[int], expected: float) -> None:
    assert sum(c[4] for c in FGD_TEST_CLASSES) == pytest.approx(95.06)
    assert frag_single(cpu, left, "1080", workload(FGD_TEST_CLASSES)) == pytest.approx(expected, abs=0.01)


def test_satisfied_class_counts_only_gpus_too_small() -> None:
    w = workload([(1000, 500, 1, "", 100.0)])
    # Room for the class: only the 200 and 300 slivers are stranded.
    assert frag_single(8000, [200, 300, 1000, 0], "X", w) == pytest.approx(500.0)
    # Model constraint not met: all idle GPU counts.
    w_t4 = workload([(1000, 500, 1, "T4", 100.0)])
    assert frag_single(8000, [200, 300, 1000, 0], "A10", w_t4) == pytest.approx(1500.0)
    assert frag_single(8000, [200, 300, 1000, 0], "T4", w_t4) == pytest.approx(500.0)


def test_multi_gpu_class_needs_k_fitting_gpus() -> None:
    w = workload([(1000, 1000, 2, "", 100.0)])
    assert frag_single(8000, [1000, 600, 0, 0], "X", w) == pytest.approx(1600.0)
    assert frag_single(8000, [1000, 1000, 600, 0], "X", w) == pytest.approx(600.0)


def test_cpu_only_class_counts_all_idle_gpu() -> None:
    w = workload([(1000, 0, 0, "", 100.0)])
    assert frag_single(64000, [1000, 300], "X", w) == pytest.approx(1300.0)


def test_memory_counts_only_when_classes_carry_it() -> None:
    with_mem = TargetWorkload((TypicalPod(1000, 500, 1, frozenset(), 1.0, mem_mib=4096),))
    arrays = GpuArrays(["a"], [8000], [1024], [[1000]], [1], [0], ["X"])
    rows = np.array([0])
    assert FragEvaluator(with_mem).current(arrays, rows)[0] == pytest.approx(1000.0)
    assert FragEvaluator(without_memory(with_mem)).current(arrays, rows)[0] == pytest.approx(0.0)


def test_typical_pods_takes_most_popular_until_threshold() -> None:
    demands = [PodDemand(4000, 0, 1, 500)] * 6 + [PodDemand(8000, 0, 1, 1000)] * 3 + [PodDemand(2000)] * 1
    w = typical_pods(demands, threshold=0.9)
    assert [(c.cpu_milli, c.gpu_milli, c.gpu_count) for c in w.classes] == [(4000, 500, 1), (8000, 1000, 1)]
    assert [c.prob for c in w.classes] == pytest.approx([6 / 9, 3 / 9])


def test_typical_pods_breaks_count_ties_by_larger_cpu_then_gpu() -> None:
    demands = [PodDemand(1000, 0, 1, 300), PodDemand(2000, 0, 1, 200), PodDemand(2000, 0, 1, 400)]
    w = typical_pods(demands, threshold=0.5)
    assert [(c.cpu_milli, c.gpu_milli) for c in w.classes] == [(2000, 400), (2000, 200)]


def test_evaluator_recomputes_only_changed_rows() -> None:
    w = workload([(1000, 500, 1, "", 100.0)])
    arrays = GpuArrays.from_nodes(["a", "b"], [8000, 8000], [1024, 1024], [2, 2], ["X", "X"])
    ev = FragEvaluator(w)
    rows = np.array([0, 1])
    assert list(ev.current(arrays, rows)) == [0.0, 0.0]
    arrays.place(0, PodDemand(1000, 0, 1, 700), (0,))
    assert list(ev.current(arrays, rows)) == [300.0, 0.0]
    share = ev.after_share(arrays, rows, PodDemand(1000, 0, 1, 600))
    assert np.isnan(share[0, 0]) and share[0, 1] == pytest.approx(300.0 + 400.0)
