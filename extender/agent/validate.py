"""Does a dispatched assignment still fit the cluster as the extender sees it now? (pure)

The broker planned on a report that may be a few hundred milliseconds old. Before creating anything the
agent runs the core's own fit on the same facts the extender's filter uses: every assigned node exists,
lies in the dispatched domain, and can take its replicas with every other gang's reservation held (the
order's own reservation, after an agent restart, is not counted against it). A refusal names the nodes,
so the broker re-plans without them until a newer report.
"""

from __future__ import annotations

from extender.agent.model import Order
from extender.agent.wire import NodeResult, Rejection
from extender.snapshot import Snapshot
from placement.allocation import allocate
from placement.errors import CapacityError
from placement.fit import capacity
from placement.reasons import Reason

__all__ = ["validate_order"]


def validate_order(order: Order, snap: Snapshot, level_keys: tuple[str, ...]) -> Rejection | None:
    """None when the whole assignment fits now; else the rejection (NODE_NOT_FOUND, TOPOLOGY_MISMATCH or
    DOES_NOT_FIT) with the nodes at fault."""
    per_node: dict[str, list[tuple[int, int]]] = {}  # node -> (pod set position, replicas)
    for i, ps in enumerate(order.pod_sets):
        for assigned, n in ps.per_node().items():
            per_node.setdefault(assigned, []).append((i, n))
    missing = sorted(n for n in per_node if snap.facts_by_name(n) is None)
    if missing:
        return Rejection(
            "NODE_NOT_FOUND",
            f"{len(missing)} assigned node(s) do not exist here: {', '.join(missing[:5])}",
            tuple(missing),
            tuple(NodeResult(n, ("NODE_NOT_FOUND",), "no such node") for n in missing),
        )
    outside: list[NodeResult] = []
    failed: list[NodeResult] = []
    gang = (order.job_id, str(order.attempt))
    for node_name in sorted(per_node):
        facts = snap.facts_by_name(node_name)
        assert facts is not None
        path = facts.node.topology
        for depth, want in enumerate(order.domain[: len(level_keys)]):
            have = path[depth] if depth < len(path) else None
            if (have or "") != want:
                outside.append(
                    NodeResult(
                        node_name,
                        ("OUTSIDE_ASSIGNED_DOMAIN",),
                        f"{level_keys[depth]}={have or '(none)'}, the gang's domain has {want or '(none)'}",
                    )
                )
                break
        else:
            node = facts.effective(gang, snap.evaluator)  # every other gang's unbound reservation held
            for i, n in per_node[node_name]:
                shape = order.pod_sets[i].shape
                try:
                    node, _ = allocate(node, shape, n, dra=snap.evaluator)
                except CapacityError as e:
                    fit = capacity(node, shape, dra=snap.evaluator)
                    reason = e.reason if isinstance(e.reason, Reason) else fit.reason or Reason.NO_FEASIBLE_NODE
                    failed.append(
                        NodeResult(
                            node_name,
                            (reason.name,),
                            f"pod set {order.pod_sets[i].name}: needs {n}, "
                            f"{fit.count} fit now: {e.detail or fit.detail}",
                        )
                    )
                    break
    if outside:
        return Rejection(
            "TOPOLOGY_MISMATCH",
            f"{len(outside)} node(s) lie outside the dispatched domain {'/'.join(order.domain)}",
            tuple(r.node for r in outside),
            tuple(outside),
        )
    if failed:
        first = failed[0]
        return Rejection(
            "DOES_NOT_FIT",
            f"{len(failed)} node(s) no longer fit: {first.node}: {first.message}",
            tuple(r.node for r in failed),
            tuple(failed),
        )
    return None
