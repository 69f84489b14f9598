"""filter, prioritize and preempt as functions of (inventory snapshot, decoded request) -> reply bytes.

No I/O, no clock, no logging: the app times, logs and counts what these return.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from extender.errors import BadRequest, NotSynced
from extender.inventory import Inventory
from extender.names import RawNames, ends_with_member, find_raw_names
from extender.nodefit import Query
from extender.podreq import gang_of
from extender.protocol import (
    ExtenderArgs,
    PreemptionArgs,
    VictimSet,
    encode_filter_result,
    encode_preemption_result,
    host_prefix,
)
from extender.snapshot import Snapshot, code_name
from placement import dra as core_dra
from placement import podspec
from placement.errors import PlacementError
from placement.model import DraRequest

__all__ = ["Decision", "query_for", "decide_filter", "decide_prioritize", "decide_preempt"]

UNKNOWN_NODE = "UnknownNode"


@dataclass(slots=True)
class Decision:
    """A reply body plus what it decided, for metrics and logs (reason code -> node count)."""

    body: bytes
    passed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


def _claim_resolver(
    pod: dict[str, Any], inv: Inventory
) -> tuple[dict[str, tuple[DraRequest, ...]], frozenset[str] | None]:
    """Device requests of the pod's claims (empty for claims already allocated) and the nodes the
    allocated ones pin the pod to."""
    refs = pod["spec"].get("resourceClaims") or []
    if not refs:
        return {}, None
    if not isinstance(refs, list):
        raise BadRequest("Pod.spec.resourceClaims must be a list")
    ns = pod["metadata"].get("namespace") or "default"  # a string: checked with the pod
    generated = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    if not isinstance(generated, list):
        raise BadRequest("Pod.status.resourceClaimStatuses must be a list")
    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in generated
        if isinstance(s, dict) and isinstance(s.get("name"), str)
    }
    out: dict[str, tuple[DraRequest, ...]] = {}
    allowed: frozenset[str] | None = None
    for ref in refs:
        if not isinstance(ref, dict):
            raise BadRequest("Pod.spec.resourceClaims entries must be objects")
        entry = ref.get("name")
        name = ref.get("resourceClaimName") or (statuses.get(entry) if isinstance(entry, str) else None)
        if not isinstance(entry, str) or not isinstance(name, (str, type(None))):
            raise BadRequest("Pod.spec.resourceClaims entries need a name and string claim names")
        if not name:
            template = ref.get("resourceClaimTemplateName")
            if template:
                raise BadRequest(
                    f"claim {entry!r} from template {str(template)[:253]!r} "
                    "is not created yet (pod.status.resourceClaimStatuses has no name)"
                )
            raise BadRequest(f"resourceClaims entry {entry!r} names no claim")
        claim = inv.claim(ns, name)
        if claim is None:
            raise BadRequest(f"ResourceClaim {ns}/{name} is not in the inventory")
        alloc = (claim.get("status") or {}).get("allocation")
        if alloc:
            nodes: set[str] = set()
            for term in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
                for mf in term.get("matchFields") or []:
                    if mf.get("key") == "metadata.name" and mf.get("operator") == "In":
                        nodes.update(str(v) for v in mf.get("values") or [])
            if nodes:
                allowed = frozenset(nodes) if allowed is None else allowed & nodes
            out[name] = ()
            continue
        try:
            out[name] = podspec.requests_from_claim(claim)
        except PlacementError as e:
            raise BadRequest(f"ResourceClaim {ns}/{name}: {e}") from e
    return out, allowed


_QUERY_CACHE_LIMIT = 1024


def _fingerprint(pod: dict[str, Any]) -> bytes | None:
    """A digest of everything a Query is computed from (spec, labels, namespace, generated claim
    names). None: too deeply nested to write, so not cached."""
    meta, status = pod["metadata"], pod.get("status") or {}
    try:
        blob = orjson.dumps(
            [pod["spec"], meta.get("labels"), meta.get("namespace"), status.get("resourceClaimStatuses")]
        )
    except orjson.JSONEncodeError:
        return None
    return hashlib.blake2b(blob, digest_size=16).digest()


def query_for(pod: dict[str, Any], inv: Inventory) -> Query:
    """The question a pod asks, cached per (uid, resourceVersion) and, for pods with claims, the
    claims' version: filter and prioritize of one cycle, and retries, parse the pod once. The entry
    also holds a digest of the pod's content, so a body that reuses a real pod's uid and version
    with another spec gets its own answer and leaves the real pod's alone."""
    meta = pod["metadata"]
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if not isinstance(uid, str) or not isinstance(rv, str) or not uid or not rv:
        return _query_for(pod, inv)
    fp = _fingerprint(pod)
    if fp is None:
        return _query_for(pod, inv)
    cache = inv.query_cache
    key = (uid, rv, inv.claims_version if pod["spec"].get("resourceClaims") else -1)
    hit = cache.get(key)
    if hit is not None and hit[0] == fp:
        q: Query = hit[1]
        return q
    q = _query_for(pod, inv)
    if len(cache) >= _QUERY_CACHE_LIMIT:
        cache.clear()
    cache[key] = (fp, q)
    return q


def _query_for(pod: dict[str, Any], inv: Inventory) -> Query:
    claims, claim_nodes = _claim_resolver(pod, inv)
    try:
        shape = podspec.shape_from_pod(pod, claims)
    except PlacementError as e:
        raise BadRequest(f"Pod {e}") from e
    for req in shape.dra:  # a selector that does not compile is the request's fault, not a node's
        for expr in req.selectors:
            try:
                core_dra.check_selector(expr)
            except PlacementError as e:
                raise BadRequest(f"ResourceClaim of class {req.device_class}: {e}") from e
    try:
        gang = gang_of(pod, inv.config)
    except ValueError as e:  # e.g. a replica-index label of digits int() does not read ("²")
        raise BadRequest(f"Pod gang labels: {e}") from e
    return Query(
        shape=shape,
        gang=None if gang is None else (gang.job, gang.attempt),
        pinned=None if gang is None else gang.node,
        claim_nodes=claim_nodes,
    )


def _require_ready(inv: Inventory) -> Snapshot:
    if not inv.ready:
        raise NotSynced("the extender's inventory has not finished its first sync")
    return inv.snapshot()


def _raw_names(args: ExtenderArgs) -> RawNames | None:
    """Where the body holds its NodeNames as Go writes them (names mode only)."""
    if args.raw_names is not None or args.nodes is not None:
        return args.raw_names
    return find_raw_names(args.raw, args.count)


def _positions(snap: Snapshot, args: ExtenderArgs, span: RawNames | None) -> np.ndarray:
    """Snapshot row of each candidate (-1: unknown); BadRequest for a name that is no string."""
    if span is not None:  # Go's plain array: all names at once from the body's bytes
        got = snap.name_table().lookup(args.raw, span)
        if got is not None:
            rows, left = got
            if len(left):
                index, names = snap.index, args.node_names
                for j in left.tolist():
                    rows[j] = index.get(names[j], -1)
            return rows
    names = args.node_names
    try:
        pos = snap.positions(names)
    except TypeError as e:  # an unhashable element
        raise BadRequest("NodeNames must be a list of strings") from e
    if (pos < 0).any() and not all(type(names[j]) is str for j in np.flatnonzero(pos < 0).tolist()):
        raise BadRequest("NodeNames must be a list of strings")
    return pos


def decide_filter(inv: Inventory, args: ExtenderArgs) -> Decision:
    """ExtenderFilterResult: the candidates that fit, the others with a reason each.

    A candidate the inventory does not know (a node the watch has not delivered yet) is refused in
    FailedAndUnresolvableNodes, "not in the extender's inventory yet", even when no candidate is
    known: the pod is then Unschedulable with that reason and is retried when nodes change, where
    a whole-request Error from a non-ignorable extender would fail the cycle and retry with
    back-off like an outage (FLEET-NOTES H-6). Error is kept for requests the extender cannot
    judge at all: inventory not synced yet, a pod it cannot read."""
    snap = _require_ready(inv)
    q = query_for(args.pod, inv)
    sv = snap.verdict(q)
    count = args.count
    span = _raw_names(args)
    pos = _positions(snap, args, span)
    known = pos >= 0
    all_known = bool(known.all())
    try:
        sv.ensure(pos if all_known else pos[known])
    except PlacementError as e:  # e.g. a DRA selector that does not compile
        raise BadRequest(str(e)) from e
    if all_known:
        ok = sv.ok[pos]
    else:  # -1 must not index a row (nor an empty snapshot)
        ok = np.zeros(count, np.bool_)
        ok[known] = sv.ok[pos[known]]
    passed_at = np.flatnonzero(ok)
    every = all_known and count == len(snap) and _names_every_row(snap, pos)
    passed_names = passed_nodes = None
    if args.nodes is None:
        passed_rows = pos[passed_at]
        if span is not None and len(passed_at) == count:  # all passed: the request's own list
            passed_names = args.raw[span.start : span.end]
        else:
            passed_names = snap.names_csv(passed_rows)
        snap.last_passed = (q, b'"NodeNames":[' + passed_names + b"]", passed_rows, every)
    else:
        nodes = args.nodes
        passed_nodes = [nodes[j] for j in passed_at.tolist()]
    failed = unres = b""
    reasons: Counter[str] = Counter()
    if len(passed_at) < count and every and q.pinned is None:
        # The usual ignoredByScheduler call: every node a candidate. Its refusals are the same
        # for every such request of this (version, query), joined once (map entries in row order).
        ref = sv.refusals_of_all()
        failed, unres = ref.failed, ref.unresolvable
        reasons.update(ref.reasons)
    elif len(passed_at) < count:
        rows = pos[~ok if all_known else ~ok & known]
        u = sv.unresolvable[rows]
        frags = sv.frags
        pinned_row = snap.index.get(q.pinned) if q.pinned is not None else None
        if pinned_row is not None and q.gang is not None and not sv.ok[pinned_row] and sv.done[pinned_row]:
            note = _gang_domain_note(inv, snap, q)
            if note:  # say how the gang's whole reserved domain stands, not only this node
                v = sv.verdicts[pinned_row]
                frags = frags.copy()
                frags[pinned_row] = (
                    snap.name_json[pinned_row] + b":" + orjson.dumps(f"{note}; {v.message if v is not None else ''}")
                )
        failed = b",".join(frags[rows[~u]].tolist())
        unres_parts = frags[rows[u]].tolist()
        counts = np.bincount(sv.codes[rows])
        for c in np.flatnonzero(counts).tolist():
            reasons[code_name(c)] = int(counts[c])
        if not all_known:
            names = args.node_names
            missing = [names[j] for j in np.flatnonzero(~known).tolist()]
            unres_parts += [
                orjson.dumps(n) + b":" + orjson.dumps(f"node {n} is not in the extender's inventory yet")
                for n in missing
            ]
            reasons[UNKNOWN_NODE] += len(missing)
        unres = b",".join(unres_parts)
    body = encode_filter_result(passed_names=passed_names, passed_nodes=passed_nodes, failed=failed, unresolvable=unres)
    return Decision(body, len(passed_at), reasons)


def _names_every_row(snap: Snapshot, pos: np.ndarray) -> bool:
    """True when the (all known) candidates are each node of the snapshot exactly once."""
    n = len(snap)
    if len(pos) != n:
        return False
    seen = np.zeros(n, np.bool_)
    seen[pos] = True
    return bool(seen.all())


def _gang_domain_note(inv: Inventory, snap: Snapshot, q: Query) -> str:
    """ "rack r7 holds 3 free GPUs for gang train-42, needs 4": free GPUs the gang could use on the
    nodes of its reservation against what its replicas not yet bound still need."""
    assert q.gang is not None
    notes = []
    for r in inv.reservations_of(*q.gang):
        if not r.gpus:
            continue  # only whole-GPU gangs get the free-GPU arithmetic
        free = need = 0
        for name in r.nodes:
            f = snap.facts_by_name(name)
            if f is None:
                continue
            free += f.effective(q.gang, snap.evaluator).free_whole_gpus
            need += sum(h.replicas * h.shape.gpus for h in f.holds if h.gang == q.gang)
        where = r.domain_label or f"{len(r.nodes)} reserved node(s)"
        notes.append(f"{where} holds {free} free GPUs for gang {q.gang[0]}, needs {need}")
    return "; ".join(notes)


def _remembered_rows(snap: Snapshot, q: Query, args: ExtenderArgs) -> tuple[np.ndarray, bool] | None:
    """The rows of the list the last filter passed, when this body carries exactly that list, and
    whether they are all the nodes that fit (that filter named every node).

    "Carries" means the remembered `"NodeNames":[...]` is the body's last top-level member, byte
    for byte (one comparison from the end, where Go writes it): the parse read that member as
    NodeNames (the last duplicate wins), so the rows are the names asked, wherever else the bytes
    occur (inside the pod, in an earlier duplicate). Anything else is looked up name by name."""
    last = snap.last_passed
    if last is None or last[0] != q or args.nodes is not None or args.count != len(last[2]):
        return None
    return (last[2], last[3]) if ends_with_member(args.raw, last[1]) else None


def decide_prioritize(inv: Inventory, args: ExtenderArgs) -> Decision:
    """HostPriorityList for the candidates, one entry each in request order (0..10; 0 for nodes that
    do not fit or that the inventory does not know). kube-scheduler adds an extender's score to each
    host it names and nothing for a host left out, so 0 and omission weigh the same; one entry per
    node asked keeps the reply checkable against the request."""
    snap = _require_ready(inv)
    q = query_for(args.pod, inv)
    hit = _remembered_rows(snap, q, args)
    pos = hit[0] if hit is not None else _positions(snap, args, _raw_names(args))
    known = pos >= 0
    rows = pos if known.all() else pos[known]
    try:
        if hit is not None and hit[1]:  # all the nodes that fit, in some order: scored once per version
            scores = snap.verdict(q).fitting_scores()[rows]
        else:
            scores = snap.scores(q, rows)
    except PlacementError as e:
        raise BadRequest(str(e)) from e
    if len(rows) == len(pos):
        return Decision(snap.priorities_body(rows, scores), args.count)
    names = args.node_names
    by_row = dict(zip(rows.tolist(), snap.entries(rows, scores)))
    parts = [by_row[i] if i >= 0 else host_prefix(n) + b"0}" for i, n in zip(pos.tolist(), names)]
    return Decision(b"[" + b",".join(parts) + b"]", int(known.sum()))


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _is_gang_member(inv: Inventory, uid: str, full: dict[str, dict[str, Any]]) -> bool:
    pod = inv.pod_by_uid(uid) or full.get(uid)
    if pod is None:
        return False
    labels = _obj(_obj(pod.get("metadata")).get("labels"))  # a victim sent in full may be any shape
    phase = _obj(pod.get("status")).get("phase")
    bound = bool(_obj(pod.get("spec")).get("nodeName"))
    return inv.config.gang_job_label in labels and bound and phase not in ("Succeeded", "Failed")


def decide_preempt(inv: Inventory, args: PreemptionArgs) -> Decision:
    """Keep a node only if its victims spare every running gang member and removing them makes the
    preemptor fit; every node kept keeps at least one victim. A node the inventory does not know is
    dropped, as filter refuses it as unresolvable: nothing says evictions there would help."""
    snap = _require_ready(inv)
    q = query_for(args.pod, inv)
    kept: dict[str, VictimSet] = {}
    reasons: Counter[str] = Counter()
    for node, victims in args.victims.items():
        if not victims.uids:
            reasons["NoVictims"] += 1
            continue
        if snap.facts_by_name(node) is None:
            reasons[UNKNOWN_NODE] += 1
            continue
        full = {str((p.get("metadata") or {}).get("uid")): p for p in victims.pods}
        if any(_is_gang_member(inv, u, full) for u in victims.uids):
            reasons["VictimIsGangMember"] += 1
            continue
        after = inv.facts_for(node, without=frozenset(victims.uids))
        if after is None:
            reasons[UNKNOWN_NODE] += 1
            continue
        v = snap.check_one(after, q)
        if not v.ok:
            reasons[v.reason.code if v.reason is not None else "?"] += 1
            continue
        kept[node] = victims
    return Decision(encode_preemption_result(kept), len(kept), reasons)
