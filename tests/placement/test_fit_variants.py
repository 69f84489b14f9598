"""Fit variants held to the exact fit (`placement.fit.capacity`) over random nodes and requests.

- the replay's array fit (`GpuArrays.feasible`, what `sim.replay` filters with, on the arrays `sim.trace`
  builds and `GpuArrays.place` updates) says yes exactly where the exact fit does, for everything the arrays
  model (CPU, memory, pod slots, per-device GPU share, GPU model);
- the extender's verdicts (`ShapeVerdict`: one check per fit-equivalence class, scattered by numpy, and
  `check_node` with its per-class memo) pass exactly the nodes where the exact fit has room, refuse the
  others for the exact fit's reason with the refused node's own name, and pass every pod that wants no GPU.

The fleet's upper bound (`fleetplan.arrays`) is held in tests/fleetplan/test_fit_bound.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender import facts as extender_facts
from extender.config import ExtenderConfig
from extender.facts import NodeFacts
from extender.nodefit import Query
from extender.snapshot import Snapshot, code_name
from placement import mig
from placement.fit import capacity
from placement.gpuarrays import GPU_MILLI, GpuArrays, PodDemand
from placement.model import (
    DEFAULT_RACK_LABEL,
    GPU_PRODUCT_LABEL,
    Gpu,
    LabelRequirement,
    MigInstance,
    Node,
    PodShape,
    Taint,
    Toleration,
)
from placement.podspec import NODE_NAME_FIELD
from sim.trace import NodeTable
from tests.placement.builders import GPU_TAINT, GPU_TOLERATION

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MIB = 1 << 20

# --------------------------------------------------------------------------- the replay's array fit

ARRAY_MODELS = ("", "T4", "V100", "A10")  # "" = a node without a GPU model (as the trace's CPU nodes)
SHARES = (100, 250, 300, 500, 810, 1000)


@st.composite
def node_tables(draw: st.DrawFn) -> NodeTable:
    n = draw(st.integers(1, 6))
    gpus = [draw(st.sampled_from([0, 1, 2, 4, 8])) for _ in range(n)]
    return NodeTable(
        tuple(f"n{i}" for i in range(n)),
        tuple(draw(st.sampled_from([0, 2000, 8000, 64000])) for _ in range(n)),
        tuple(draw(st.sampled_from([0, 1024, 16384, 262144])) for _ in range(n)),
        tuple(gpus),
        tuple(draw(st.sampled_from(ARRAY_MODELS[1:])) if g else draw(st.sampled_from(("", "T4"))) for g in gpus),
    )


@st.composite
def demands(draw: st.DrawFn) -> PodDemand:
    cpu = draw(st.sampled_from([0, 500, 1000, 4000, 16000]))
    mem = draw(st.sampled_from([0, 512, 4096, 65536]))
    kind = draw(st.sampled_from(["cpu", "share", "whole", "multi-share"]))
    if kind == "cpu":
        return PodDemand(cpu, mem)
    models = frozenset(draw(st.lists(st.sampled_from(ARRAY_MODELS[1:]), max_size=2)))
    if kind == "share":
        return PodDemand(cpu, mem, 1, draw(st.sampled_from(SHARES)), models)
    if kind == "whole":
        return PodDemand(cpu, mem, draw(st.integers(1, 8)), GPU_MILLI, models)
    return PodDemand(cpu, mem, draw(st.integers(2, 4)), draw(st.sampled_from(SHARES[:-1])), models)


def node_of_row(a: GpuArrays, row: int) -> Node:
    """The node an arrays row stands for, as the exact fit sees it (memory MiB -> bytes, slots -> pods)."""
    model = a.model_names[int(a.model_code[row])]
    count = int(a.gpu_count[row])
    return Node(
        name=a.names[row],
        labels={GPU_PRODUCT_LABEL: model} if model else {},
        cpu_milli_free=int(a.cpu_left[row]),
        memory_free=int(a.mem_left[row]) * MIB,
        pods_free=int(a.max_pods[row] - a.pod_count[row]),
        gpus=tuple(Gpu(k, model, 16384, GPU_MILLI - int(a.gpu_left[row, k])) for k in range(count)),
    )


def shape_of_demand(d: PodDemand) -> PodShape:
    return PodShape(
        gpus=d.gpu_count,
        gpu_milli=d.gpu_milli if d.gpu_count else GPU_MILLI,
        gpu_models=d.models,
        cpu_milli=d.cpu_milli,
        memory=d.mem_mib * MIB,
    )


@SETTINGS
@given(
    node_tables(),
    st.lists(demands(), max_size=12),
    st.lists(demands(), min_size=1, max_size=4),
    st.lists(st.integers(0, 1001), max_size=6),
)
def test_replay_array_fit_equals_the_exact_fit(
    table: NodeTable, placed: list[PodDemand], asked: list[PodDemand], max_pods: list[int]
) -> None:
    a = table.arrays()  # the replay's arrays: every node empty
    for row, limit in enumerate(max_pods[: len(a)]):
        a.max_pods[row] = limit
    for d in placed:  # reach used states the way the replay does: feasible row, best GPUs, place
        rows = a.feasible(d).nonzero()[0]
        if len(rows):
            row = int(rows[len(rows) // 2])
            a.place(row, d, a.select_gpus_best(row, d))
    for d in asked:
        feasible = a.feasible(d)
        shape = shape_of_demand(d)
        for row in range(len(a)):
            exact = capacity(node_of_row(a, row), shape)
            assert bool(feasible[row]) == (exact.count > 0), (row, d, exact)


# --------------------------------------------------------------------------- the extender's verdicts

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
MIG_1G = "1g.10gb"
OTHER_TAINT = Taint("dedicated", "infer", "NoSchedule")
SOFT_TAINT = Taint("spot", "", "PreferNoSchedule")


@st.composite
def mig_gpu(draw: st.DrawFn, index: int) -> Gpu:
    """An A100 in MIG mode: 1g instances on some of its seven 1-slice starts, some of them taken."""
    starts = draw(st.lists(st.integers(0, 6), min_size=1, max_size=7, unique=True))
    profile = draw(st.sampled_from([MIG_1G, "3g.40gb"]))
    if profile == "3g.40gb":
        starts = sorted({0 if s < 4 else 4 for s in starts})
    size = 1 if profile == MIG_1G else 4
    return Gpu(index, A100, 81920, mig=tuple(MigInstance(profile, None, s, size, draw(st.booleans())) for s in starts))


TAINTS = ((), (GPU_TAINT,), (GPU_TAINT,), (GPU_TAINT,), (OTHER_TAINT,), (SOFT_TAINT,))
CPU_FREE = (64000, 64000, 8000, 7999, 0)
MEM_FREE = (512 << 30, 512 << 30, 16 << 30, 1 << 30, 0)
PODS_FREE = (110, 110, 110, 3, 1, 0)
MIG_RESOURCE = mig.resource_name(MIG_1G)


@st.composite
def plain_gpu(draw: st.DrawFn, index: int, model: str) -> Gpu:
    return Gpu(
        index, model, 81920, draw(st.sampled_from([0, 0, 0, 0, 250, 500, 1000])), healthy=draw(st.integers(0, 19)) > 0
    )


@st.composite
def base_nodes(draw: st.DrawFn) -> Node:
    """One kind of node: GPUs (whole, shared, unhealthy, MIG), MIG as extended counts, taints, state."""
    n = draw(st.sampled_from([0, 1, 2, 4, 8, 8]))
    model = draw(st.sampled_from([H100, A100]))
    gpus: list[Gpu] = []
    for i in range(n):
        gpus.append(draw(mig_gpu(i)) if model == A100 and draw(st.integers(0, 4)) == 0 else draw(plain_gpu(i, model)))
    extended = {MIG_RESOURCE: draw(st.integers(0, 14))} if draw(st.integers(0, 2)) == 0 else {}
    return Node(
        name="base",
        labels={GPU_PRODUCT_LABEL: model} if n or extended or draw(st.booleans()) else {},
        taints=draw(st.sampled_from(TAINTS)),
        ready=draw(st.integers(0, 15)) > 0,
        cordoned=draw(st.integers(0, 15)) == 0,
        cpu_milli_allocatable=64000,
        cpu_milli_free=draw(st.sampled_from(CPU_FREE[:1] * 4 + CPU_FREE)),  # mostly roomy: variants tighten
        memory_allocatable=512 << 30,
        memory_free=draw(st.sampled_from(MEM_FREE[:1] * 4 + MEM_FREE)),
        pods_free=draw(st.sampled_from(PODS_FREE[:1] * 4 + PODS_FREE)),
        gpus=tuple(gpus),
        extended_free=extended,
    )


def _other(draw: st.DrawFn, options: Sequence[object], current: object) -> object:
    return draw(st.sampled_from([o for o in options if o != current]))


@st.composite
def variant(draw: st.DrawFn, base: Node) -> Node:
    """`base` with one field the fit reads changed: a fit signature that missed that field would put both
    in one class although their fits differ."""
    field = draw(
        st.sampled_from(
            [
                "labels",
                "taints",
                "ready",
                "cordoned",
                "cpu_milli_free",
                "memory_free",
                "pods_free",
                "gpus",
                "extended_free",
            ]
        )
    )
    value: object
    if field in ("ready", "cordoned"):
        value = not getattr(base, field)
    elif field == "taints":
        value = _other(draw, TAINTS, base.taints)
    elif field == "cpu_milli_free":
        value = _other(draw, CPU_FREE, base.cpu_milli_free)
    elif field == "memory_free":
        value = _other(draw, MEM_FREE, base.memory_free)
    elif field == "pods_free":
        value = _other(draw, PODS_FREE, base.pods_free)
    elif field == "labels":
        value = {GPU_PRODUCT_LABEL: _other(draw, (H100, A100, None), base.labels.get(GPU_PRODUCT_LABEL))}
        value = {k: v for k, v in value.items() if v is not None}
    elif field == "extended_free":
        value = {MIG_RESOURCE: _other(draw, range(8), base.extended_free.get(MIG_RESOURCE, -1))}
    elif base.gpus:  # one GPU used, freed, broken or re-partitioned
        k = draw(st.integers(0, len(base.gpus) - 1))
        gpus = list(base.gpus)
        gpus[k] = draw(mig_gpu(k) if gpus[k].model == A100 and draw(st.booleans()) else plain_gpu(k, gpus[k].model))
        value = tuple(gpus)
    else:
        value = tuple(draw(plain_gpu(k, H100)) for k in range(draw(st.integers(1, 4))))
    changed: dict[str, Any] = {field: value}
    return dataclasses.replace(base, **changed)


@st.composite
def fleets_of_copies(draw: st.DrawFn) -> list[Node]:
    """Copies of a few kinds of node (one base and variants of it), each copy with its own name and rack:
    the equivalence classes the extender forms."""
    base = draw(base_nodes())
    kinds = [base] + draw(st.lists(variant(base), max_size=5))
    out = []
    for i in range(draw(st.integers(1, 40))):
        kind = kinds[draw(st.integers(0, len(kinds) - 1))]
        labels = dict(kind.labels)
        rack = draw(st.sampled_from(["r1", "r2", None]))
        if rack is not None:
            labels[DEFAULT_RACK_LABEL] = rack
        out.append(dataclasses.replace(kind, name=f"node-{i}", labels=labels))
    return out


@st.composite
def gpu_shapes(draw: st.DrawFn) -> PodShape:
    kind = draw(st.sampled_from(["whole", "share", "mig", "mig3", "cpu"]))
    tolerations: tuple[Toleration, ...] = draw(st.sampled_from([(GPU_TOLERATION,)] * 4 + [()]))
    common: dict[str, object] = dict(
        cpu_milli=draw(st.sampled_from([0, 1000, 8000])),
        memory=draw(st.sampled_from([0, 1, 16])) << 30,
        tolerations=tolerations,
    )
    if draw(st.integers(0, 3)) == 0:
        common["gpu_models"] = frozenset(draw(st.lists(st.sampled_from([H100, A100]), min_size=1, max_size=2)))
    selector = draw(st.sampled_from(["", "", "", "rack", "product", "affinity", "name"]))
    if selector == "rack":
        common["node_selector"] = ((DEFAULT_RACK_LABEL, "r1"),)
    elif selector == "product":
        common["node_selector"] = ((GPU_PRODUCT_LABEL, draw(st.sampled_from([H100, A100]))),)
    elif selector == "affinity":
        common["affinity"] = ((LabelRequirement(DEFAULT_RACK_LABEL, "In", ("r2",)),),)
    elif selector == "name":  # matchFields on the node name: every node its own class
        common["affinity"] = ((LabelRequirement(NODE_NAME_FIELD, "NotIn", ("node-0", "node-3")),),)
    if kind == "whole":
        return PodShape(gpus=draw(st.sampled_from([1, 1, 2, 2, 4, 8])), **common)  # type: ignore[arg-type]
    if kind == "share":
        return PodShape(gpus=draw(st.integers(1, 2)), gpu_milli=draw(st.sampled_from([250, 500, 750])), **common)  # type: ignore[arg-type]
    if kind in ("mig", "mig3"):
        return PodShape(mig_profile=MIG_1G if kind == "mig" else "3g.40gb", mig_count=draw(st.integers(1, 3)), **common)  # type: ignore[arg-type]
    common.pop("gpu_models", None)
    return PodShape(**common)  # type: ignore[arg-type]


def facts_of(nodes: list[Node]) -> list[NodeFacts]:
    """The extender's per-node facts for nodes without holds or DRA devices: each gets its fit-signature id."""
    sig_ids: dict[tuple[object, ...], int] = {}
    out = []
    for n in nodes:
        sig = extender_facts.fit_signature(n)
        quoted = orjson.dumps(n.name)
        out.append(
            NodeFacts(
                node=n,
                name=n.name,
                name_json=quoted,
                host_prefix=b'{"Host":' + quoted + b',"Score":',
                holds=(),
                pods=(),
                sig_id=sig_ids.setdefault(sig, len(sig_ids)),
            )
        )
    return out


@SETTINGS
@given(fleets_of_copies(), st.lists(gpu_shapes(), min_size=1, max_size=6), st.data())
def test_extender_verdicts_equal_the_exact_fit(nodes: list[Node], shapes: list[PodShape], data: st.DataObject) -> None:
    import numpy as np

    facts = facts_of(nodes)
    snap = Snapshot.build(1, [f.name for f in facts], facts, {}, previous=None, config=ExtenderConfig())
    for shape in shapes:
        sv = snap.verdict(Query(shape))
        # Some rows first (node by node, sharing the per-class memo), then every row (classes scattered by numpy).
        first = data.draw(st.lists(st.integers(0, len(nodes) - 1), max_size=len(nodes)))
        sv.ensure(np.array(first, np.intp))
        sv.ensure_all()
        for i, n in enumerate(nodes):
            exact = capacity(n, shape)
            if not shape.wants_gpu:
                assert sv.ok[i], n.name  # not the extender's to judge: kube-scheduler checks the rest
                continue
            assert bool(sv.ok[i]) == (exact.count > 0), (n.name, shape, exact)
            if exact.count > 0:
                continue
            assert exact.reason is not None
            assert code_name(int(sv.codes[i])) == exact.reason.code, n.name
            assert bool(sv.unresolvable[i]) == (not exact.reason.preemptible), n.name
            ((name, message),) = orjson.loads(b"{" + sv.frags[i] + b"}").items()
            assert name == n.name and message.startswith(exact.detail), (message, exact.detail)
