"""Does one replica fit on one node right now: one typed verdict with a human reason.

Checks run in a fixed order (node state, assignment, selectors, GPUs / MIG / DRA, reservations,
CPU and memory) and the first failure is the verdict, so messages name the most basic lack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from extender.facts import NodeFacts
from placement import dra as core_dra
from placement.model import WHOLE_GPU_MILLI, DraDevice, DraRequest, PodShape
from placement.reasons import Reason

__all__ = ["Query", "Verdict", "OK", "check_node", "dra_free_matches"]


@dataclass(frozen=True, slots=True)
class Query:
    """What is asked of every node (hashable: the per-shape verdict cache key).

    gang: (job, attempt) of a gang pod, whose own reservation it may use; pinned: the node the
    agent assigned it; claim_nodes: nodes allowed by the pod's already-allocated claims.
    """

    shape: PodShape
    gang: tuple[str, str] | None = None
    pinned: str | None = None
    claim_nodes: frozenset[str] | None = None

    @property
    def wants_gpu(self) -> bool:
        return self.shape.wants_gpu

    @property
    def gang_name(self) -> str:
        return "" if self.gang is None else f"{self.gang[0]} (attempt {self.gang[1]})"


@dataclass(frozen=True, slots=True)
class Verdict:
    """reason None = fits. unresolvable: evicting pods on the node could not fix it."""

    reason: Reason | None
    unresolvable: bool = False
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None


OK = Verdict(None)


def _fail(reason: Reason, **fields: object) -> Verdict:
    return Verdict(reason, not reason.preemptible, reason.message(**fields))


def _held(f: NodeFacts, q: Query, what: str) -> str:
    others = [h for h in f.holds if (h.job, h.attempt) != q.gang]
    parts = []
    for h in others:
        where = f" in {h.domain}" if h.domain else ""
        parts.append(f"{h.replicas} replica(s) of gang {h.job} (attempt {h.attempt}){where}")
    return f"{what} held for " + ", ".join(parts)


def _selector_ok(f: NodeFacts, shape: PodShape) -> tuple[bool, str]:
    labels = f.labels
    for k, v in shape.node_selector:
        if labels.get(k) != v:
            return False, f"{k}={v}"
    if shape.affinity:
        for term in shape.affinity:
            if all((r.values and f.name in r.values if r.operator == "In" else f.name not in r.values)
                   if r.key == "metadata.name" else r.matches(labels) for r in term):
                return True, ""
        return False, "required node affinity"
    return True, ""


def dra_free_matches(
    f: NodeFacts, req: DraRequest, classes: Mapping[str, tuple[str, ...]], ev: core_dra.DraEvaluator,
    taken: set[tuple[str, str, str]],
) -> tuple[list[DraDevice], int, str]:
    """Unallocated devices of the node that pass the class and request selectors, minus `taken`
    and minus devices whose memory slices overlap an allocated device of the same GPU."""
    busy: dict[str, int] = {}
    for d in f.dra_devices:
        if d.allocated or d.key in taken:
            sl = core_dra.device_slices(d)
            if sl is not None:
                busy[sl[0]] = busy.get(sl[0], 0) | sl[1]
    free = []
    for d in f.dra_devices:
        if d.allocated or d.key in taken:
            continue
        sl = core_dra.device_slices(d)
        if sl is not None and busy.get(sl[0], 0) & sl[1]:
            continue
        free.append(d)
    ev.classes = classes
    m = ev.match(free, req.device_class, req.selectors)
    return list(m.devices), m.errors, m.first_error


def _check_dra(f: NodeFacts, q: Query, classes: Mapping[str, tuple[str, ...]], ev: core_dra.DraEvaluator) -> Verdict:
    taken: set[tuple[str, str, str]] = set()
    for req in q.shape.dra:
        if req.device_class not in classes:
            return _fail(Reason.DRA_CLASS_UNKNOWN, want=req.device_class)
        matches, errors, first = dra_free_matches(f, req, classes, ev, taken)
        need = req.count if req.count > 0 else max(len(matches), 1)
        if req.count == 0:  # allocationMode All: every matching device, allocated or not, must be free
            allm = ev.match(f.dra_devices, req.device_class, req.selectors)
            if any(d.allocated for d in allm.devices) or not allm.devices:
                have = sum(1 for d in allm.devices if not d.allocated)
                return _fail(Reason.INSUFFICIENT_DRA_DEVICES, node=f.name, have=have, want=req.device_class,
                             need=f"all {len(allm.devices)}")
        if len(matches) >= need:
            for d in matches[:need]:
                taken.add(d.key)
            continue
        if errors and not matches:
            return _fail(Reason.DRA_SELECTOR_ERROR, node=f.name, detail=first)
        total = len(ev.match(f.dra_devices, req.device_class, req.selectors).devices)
        want = req.device_class + "".join(f" where {s}" for s in req.selectors)
        if total < need:
            v = _fail(Reason.NO_DRA_DEVICES, node=f.name, want=want)
            if total:
                v = Verdict(Reason.NO_DRA_DEVICES, True,
                            f"node {f.name} has only {total} DRA devices matching {want}, pod needs {need}")
            return v
        return _fail(Reason.INSUFFICIENT_DRA_DEVICES, node=f.name, have=len(matches), want=want, need=need)
    return OK


def check_node(
    f: NodeFacts, q: Query, classes: Mapping[str, tuple[str, ...]], ev: core_dra.DraEvaluator
) -> Verdict:
    """The verdict for one node. Pods that want no GPU pass everywhere (not ours to judge)."""
    s = q.shape
    if not s.wants_gpu:
        return OK
    if not f.ready:
        return _fail(Reason.NOT_READY, node=f.name)
    if f.cordoned:
        return _fail(Reason.CORDONED, node=f.name)
    if q.pinned is not None and f.name != q.pinned:
        return Verdict(Reason.NOT_ASSIGNED_TO_GANG, True,
                       f"node {f.name} is not the node assigned to this replica of gang {q.gang_name} ({q.pinned})")
    if q.claim_nodes is not None and f.name not in q.claim_nodes:
        return Verdict(Reason.NODE_SELECTOR_MISMATCH, True,
                       f"node {f.name} is not where the pod's allocated ResourceClaim lives")
    ok, detail = _selector_ok(f, s)
    if not ok:
        if detail.startswith("nvidia.com/gpu.product="):
            if f.gpu_model is None:
                return Verdict(Reason.GPU_MODEL_MISMATCH, True,
                               f"node {f.name} has no GPU model label, pod wants {detail.partition('=')[2]}")
            return _fail(Reason.GPU_MODEL_MISMATCH, node=f.name, have=f.gpu_model, want=detail.partition("=")[2])
        return _fail(Reason.NODE_SELECTOR_MISMATCH, node=f.name, detail=detail)
    if s.gpus:
        if f.gpu_total == 0:
            if f.mig_total:
                return Verdict(Reason.NO_GPU, True, f"node {f.name} has no whole GPUs (MIG instances only: "
                               f"{', '.join(sorted(f.mig_total))})")
            return _fail(Reason.NO_GPU, node=f.name)
        if s.gpu_models and f.gpu_model not in s.gpu_models:
            return _fail(Reason.GPU_MODEL_MISMATCH, node=f.name, have=f.gpu_model or "unknown",
                         want=" or ".join(sorted(s.gpu_models)))
        if s.min_gpu_memory_mib and f.gpu_memory_mib < s.min_gpu_memory_mib:
            return _fail(Reason.GPU_MEMORY_TOO_SMALL, node=f.name, have=f.gpu_memory_mib, want=s.min_gpu_memory_mib)
        if s.gpu_milli >= WHOLE_GPU_MILLI:
            if f.gpu_total < s.gpus:
                return _fail(Reason.GPU_COUNT_TOO_LARGE, node=f.name, have=f.gpu_total, want=s.gpus)
            free = f.whole_free
            if free < s.gpus:
                return _fail(Reason.INSUFFICIENT_GPUS, node=f.name, have=free, want=s.gpus)
            held = f.held_gpus(q.gang)
            if free - held < s.gpus:
                return Verdict(Reason.RESERVED_FOR_GANG, True,
                               f"node {f.name} has {free} free GPUs but {_held(f, q, f'{held} are')}; "
                               f"{max(free - held, 0)} left, pod needs {s.gpus}")
        else:
            best = f.best_share_free
            if best < s.gpu_milli:
                return _fail(Reason.INSUFFICIENT_GPU_SHARE, node=f.name, have=best, want=s.gpu_milli)
            held = f.held_gpus(q.gang)
            if held and f.whole_free - held < 1 and max(
                    (WHOLE_GPU_MILLI - u for u in f.gpu_milli_used if u > 0), default=0) < s.gpu_milli:
                return Verdict(Reason.RESERVED_FOR_GANG, True,
                               f"node {f.name}: the GPU share it could give is {_held(f, q, f'{held} GPUs')}")
    if s.mig_profile is not None:
        prof = s.mig_profile
        total = f.mig_total.get(prof, 0)
        if total == 0:
            offered = ", ".join(sorted(f.mig_total)) or "none"
            return Verdict(Reason.NO_MIG_PROFILE, True,
                           Reason.NO_MIG_PROFILE.message(node=f.name, want=prof) + f" (offers: {offered})")
        free = f.mig_free.get(prof, 0)
        if free < s.mig_count:
            return _fail(Reason.INSUFFICIENT_MIG, node=f.name, have=free, profile=prof, want=s.mig_count)
        held = f.held_mig(prof, q.gang)
        if free - held < s.mig_count:
            return Verdict(Reason.RESERVED_FOR_GANG, True,
                           f"node {f.name} has {free} free MIG {prof} but {_held(f, q, f'{held} are')}; "
                           f"pod needs {s.mig_count}")
    if s.dra:
        v = _check_dra(f, q, classes, ev)
        if not v.ok:
            return v
    held_cpu = sum(h.replicas * h.cpu_milli for h in f.holds if (h.job, h.attempt) != q.gang)
    held_mem = sum(h.replicas * h.memory for h in f.holds if (h.job, h.attempt) != q.gang)
    if f.cpu_free - held_cpu < s.cpu_milli:
        return _fail(Reason.INSUFFICIENT_CPU, node=f.name, have=f.cpu_free - held_cpu, want=s.cpu_milli)
    if f.memory_free - held_mem < s.memory:
        return _fail(Reason.INSUFFICIENT_MEMORY, node=f.name, have=f.memory_free - held_mem, want=s.memory)
    if f.pods_free < 1:
        return _fail(Reason.TOO_MANY_PODS, node=f.name)
    return OK
