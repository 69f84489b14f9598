"""Scoring policies: FGD simulator test vectors, rankings on small node sets, extender range."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from placement.frag import TargetWorkload, TypicalPod
from placement.gpuarrays import GpuArrays, PodDemand
from placement.scoring import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    BestFitPolicy,
    ClusteringPolicy,
    DotProductPolicy,
    FgdPolicy,
    PackingPolicy,
    RandomPolicy,
    TandemFragPolicy,
    choose_node,
    extender_scores,
    make_policy,
)


def nodes(*specs: tuple[int, Sequence[int]], model: str = "X", mem: int = 1 << 20) -> GpuArrays:
    """Nodes from (cpu_left, gpu_left per GPU); every GPU listed is present."""
    width = max(len(left) for _, left in specs)
    left = [list(gl) + [0] * (width - len(gl)) for _, gl in specs]
    return GpuArrays(
        [f"n{i}" for i in range(len(specs))],
        [c for c, _ in specs],
        [mem] * len(specs),
        left,
        [len(gl) for _, gl in specs],
        [0] * len(specs),
        [model],
    )


def share(g: int, cpu: int = 1000) -> PodDemand:
    return PodDemand(cpu, 0, 1, g)


def whole(k: int, cpu: int = 1000) -> PodDemand:
    return PodDemand(cpu, 0, k, 1000)


WORKLOAD = TargetWorkload(
    (
        TypicalPod(1000, 500, 1, frozenset(), 0.5),
        TypicalPod(1000, 1000, 1, frozenset(), 0.5),
    )
)


def all_feasible(a: GpuArrays, d: PodDemand) -> np.ndarray:
    return a.feasible(d)


@pytest.mark.parametrize(
    ("left", "demand", "expected"),
    [
        ([200, 1000, 1000, 500], whole(2), 48),
        ([200, 1000, 1000, 500], PodDemand(1000, 0, 2, 200), 93),
        ([200, 1000, 1000, 500], share(200), 98),
        ([1000] * 4, share(500), 29),
        ([1000] * 8, share(500), 25),
    ],
)
def test_packing_vectors(left: list[int], demand: PodDemand, expected: int) -> None:
    a = nodes((64000, left))
    assert PackingPolicy().score(a, demand, all_feasible(a, demand))[0] == expected


def test_bestfit_prefers_least_leftover() -> None:
    a = nodes((64000, [1000, 1000]), (8000, [1000, 300]), (8000, [600, 0]))
    d = share(300)
    assert choose_node(BestFitPolicy(), a, d, a.feasible(d)) == 2
    assert a.select_gpus_best(1, d) == (1,)


def test_dotproduct_prefers_smallest_product() -> None:
    a = nodes((96000, [1000] * 8), (16000, [1000, 0]))
    d = whole(1, cpu=8000)
    assert choose_node(DotProductPolicy(), a, d, a.feasible(d)) == 1


def test_clustering_prefers_nodes_holding_the_same_shape() -> None:
    a = nodes((64000, [1000, 1000]), (64000, [1000, 1000]), (64000, [1000, 1000]))
    a.place(1, whole(1), (0,))
    a.place(2, share(300), (0,))
    d = whole(1)
    scores = ClusteringPolicy().score(a, d, a.feasible(d))
    assert scores[1] > scores[0] > scores[2]
    assert scores[1] == 75 + 25 * (8000 - 1000) // 8000


def test_random_policy_picks_uniformly_among_feasible() -> None:
    a = nodes((64000, [1000]), (0, [1000]), (64000, [1000]))
    d = whole(1)
    policy = RandomPolicy(np.random.default_rng(0))
    picks = {choose_node(policy, a, d, a.feasible(d)) for _ in range(50)}
    assert picks == {0, 2}


def test_ties_go_to_the_lowest_row() -> None:
    a = nodes((64000, [1000, 1000]), (64000, [1000, 1000]))
    d = whole(1)
    assert choose_node(BestFitPolicy(), a, d, a.feasible(d)) == 0


def test_no_feasible_node_returns_none() -> None:
    a = nodes((64000, [300]))
    d = share(500)
    assert choose_node(BestFitPolicy(), a, d, a.feasible(d)) is None


@pytest.mark.parametrize("policy_name", ["fgd", DEFAULT_POLICY])
def test_fragmentation_policies_fill_the_gap_that_fits_exactly(policy_name: str) -> None:
    # A 500 pod fits a GPU with 500 left exactly; a free GPU would leave a 500 sliver behind.
    a = nodes((64000, [1000, 1000]), (64000, [500, 1000]))
    d = share(500)
    policy = make_policy(policy_name, workload=WORKLOAD)
    row = choose_node(policy, a, d, a.feasible(d))
    assert row == 1
    assert policy.select_gpus(a, 1, d) == (0,)


def test_fgd_scores_are_integer_sigmoid_of_frag_decrease() -> None:
    a = nodes((64000, [1000, 1000]), (64000, [500, 1000]))
    d = share(500)
    scores = FgdPolicy(WORKLOAD).score(a, d, a.feasible(d))
    # Node 0: F 0 -> 250 (500 stranded for the 1000 class); node 1: F 250 -> 0.
    assert list(scores) == [np.floor(100 / (1 + np.exp(0.25))), np.floor(100 / (1 + np.exp(-0.25)))]


def test_tandem_sends_cpu_only_pods_to_nodes_whose_gpus_are_used_up() -> None:
    a = nodes((32000, [1000] * 8), (32000, [0, 0]))
    d = PodDemand(16000)
    policy = TandemFragPolicy(TargetWorkload((TypicalPod(1000, 1000, 1, frozenset(), 1.0),)))
    assert choose_node(policy, a, d, a.feasible(d)) == 1
    # FGD sees no fragmentation change on either node and takes the first.
    assert choose_node(FgdPolicy(policy.frag.workload), a, d, a.feasible(d)) == 0


def test_memo_follows_placements() -> None:
    a = nodes((64000, [1000, 1000]), (64000, [1000, 1000]))
    policy = TandemFragPolicy(WORKLOAD)
    d = share(500)
    first = choose_node(policy, a, d, a.feasible(d))
    assert first == 0
    a.place(0, d, policy.select_gpus(a, 0, d))
    # Now node 0 has an exact 500 gap: the next 500 pod must go there, not to the stale score.
    assert choose_node(policy, a, d, a.feasible(d)) == 0
    assert policy.select_gpus(a, 0, d) == (0,)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_extender_scores_stay_in_range(name: str) -> None:
    a = nodes((64000, [1000, 1000]), (8000, [500, 1000]), (1000, [1000, 0]), (64000, [100, 0]))
    d = share(400, cpu=2000)
    feasible = a.feasible(d)
    policy = make_policy(name, workload=WORKLOAD, rng=np.random.default_rng(1))
    scores = extender_scores(a, d, feasible, policy)
    assert scores.dtype.kind == "i"
    assert ((scores >= 0) & (scores <= 10)).all()
    assert (scores[~feasible] == 0).all()
    assert scores[feasible].max() == 10


def test_extender_scores_rank_like_the_policy() -> None:
    a = nodes((64000, [1000, 1000]), (64000, [500, 1000]))
    d = share(500)
    scores = extender_scores(a, d, a.feasible(d), make_policy(DEFAULT_POLICY, workload=WORKLOAD))
    assert list(scores) == [0, 10]


def test_make_policy_rejects_unknown_and_needs_workload() -> None:
    with pytest.raises(ValueError):
        make_policy("nope")
    with pytest.raises(ValueError):
        make_policy("fgd")


def test_extender_scores_without_feasible_nodes_are_zero() -> None:
    a = nodes((64000, [100, 0]))
    d = share(500)
    scores = extender_scores(a, d, a.feasible(d), make_policy(DEFAULT_POLICY, workload=WORKLOAD))
    assert list(scores) == [0]


def test_tandem_sends_gpu_heavy_pods_to_gpu_rich_nodes() -> None:
    # Both nodes stay fully usable after either choice, so only alignment decides:
    # 8 GPUs with 16 cores wants the 1-core-per-GPU pod, keeping the CPU-rich node's CPU.
    a = nodes((104000, [1000, 1000]), (16000, [1000] * 8))
    d = whole(1, cpu=1000)
    policy = TandemFragPolicy(TargetWorkload((TypicalPod(500, 1000, 1, frozenset(), 1.0),)))
    assert choose_node(policy, a, d, a.feasible(d)) == 1
    assert choose_node(FgdPolicy(policy.frag.workload), a, d, a.feasible(d)) == 0


def test_extender_scores_under_the_default_policy_and_the_array_filter() -> None:
    # As the extender scores a shared-GPU pod: the default policy over the typical pods, feasible nodes only.
    a = nodes((64000, [1000, 1000]), (64000, [500, 1000]), (64000, [300, 0]))
    d = share(500)
    assert list(extender_scores(a, d, a.feasible(d), make_policy(DEFAULT_POLICY, workload=WORKLOAD))) == [0, 10, 0]


def test_extender_gives_ten_only_to_the_policys_own_pick() -> None:
    a = nodes((64000, [1000, 1000]), (64000, [1000, 1000]), (64000, [1000, 1000]))
    d = whole(1)
    policy = BestFitPolicy()
    scores = extender_scores(a, d, a.feasible(d), policy)
    assert list(scores) == [10, 9, 9]
    assert int(np.argmax(scores)) == choose_node(policy, a, d, a.feasible(d))
