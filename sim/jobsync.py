"""One sync of a ``batch/v1`` Job as a pure function: the new status and the pod writes it needs.

Kube 1.31+ semantics for what Tandem uses (see upstream ``pkg/controller/job``):

* Finished pods are counted through ``status.uncountedTerminatedPods``: a pod's UID is written
  there first, then its tracking finalizer is removed, then (next sync) it moves to
  ``failed``/``succeeded``; Indexed successes go straight to ``completedIndexes``.
* ``podReplacementPolicy: Failed``: a deleted pod counts as failed only once its phase is Failed,
  and no replacement is made while it terminates; otherwise a deleted unfinished pod is failed.
* ``backoffLimit`` counts failures over all indexes; the deadline runs from ``startTime``.
* ``FailureTarget`` / ``SuccessCriteriaMet`` first (the remaining pods are deleted and, for a
  failure, counted failed), ``Failed`` / ``Complete`` only when nothing is left uncounted or
  terminating.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sim import jobpods as jp

__all__ = ["JobPlan", "plan_job", "is_finished", "condition"]

JSON = dict[str, Any]

BACKOFF_LIMIT_DEFAULT = 6
MAX_POD_CREATE_DELETE_PER_SYNC = 500
REASON_BACKOFF = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
REASON_DEADLINE = ("DeadlineExceeded", "Job was active longer than specified deadline")
REASON_COMPLETIONS = ("CompletionsReached", "Reached expected number of succeeded pods")


@dataclasses.dataclass
class JobPlan:
    """What to do for one Job: create pods for ``create`` (indexes; None for NonIndexed), delete
    ``delete``, write ``status`` (when it differs), then remove the finalizer of ``remove_finalizers``."""

    status: JSON
    create: list[int | None] = dataclasses.field(default_factory=list)
    delete: list[JSON] = dataclasses.field(default_factory=list)
    remove_finalizers: list[JSON] = dataclasses.field(default_factory=list)
    requeue_after_s: float | None = None


def condition(status: Mapping[str, Any], ctype: str) -> JSON | None:
    """The condition of that type with status True, if any."""
    for c in status.get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return dict(c)
    return None


def is_finished(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    return condition(status, "Complete") is not None or condition(status, "Failed") is not None


def _new_condition(ctype: str, reason: str, message: str, now: str, status: str = "True") -> JSON:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastProbeTime": now,
        "lastTransitionTime": now,
    }


def _set_condition(
    conds: list[JSON], ctype: str, status: str, reason: str, message: str, now: str, add_if_missing: bool = True
) -> bool:
    """``ensureJobConditionStatus``: update in place or append; True if something changed."""
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") == status and c.get("reason") == reason and c.get("message") == message:
                return False
            if c.get("status") != status:
                c["lastTransitionTime"] = now
            c.update({"status": status, "reason": reason, "message": message, "lastProbeTime": now})
            return True
    if not add_if_missing:
        return False
    conds.append(_new_condition(ctype, reason, message, now, status))
    return True


def _uid(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def _restarts(pods: Sequence[JSON]) -> int:
    total = 0
    for p in pods:
        if jp.phase(p) in ("Running", "Pending"):
            st = p.get("status") or {}
            for cs in list(st.get("initContainerStatuses") or []) + list(st.get("containerStatuses") or []):
                total += int(cs.get("restartCount") or 0)
    return total


def _keep_rank(pod: JSON) -> tuple[int, int, int, str]:
    """Which of two active pods of one index to keep (lower is kept): ready, running, bound, older."""
    return (
        0 if jp.is_ready(pod) else 1,
        0 if jp.phase(pod) == "Running" else 1,
        0 if (pod.get("spec") or {}).get("nodeName") else 1,
        str((pod.get("metadata") or {}).get("creationTimestamp") or ""),
    )


def _indexed_extras(active: Sequence[JSON], completions: int, succeeded: Collection[int]) -> list[JSON]:
    """Active pods to remove: bad or out-of-range index, index already succeeded, duplicates of an index."""
    extras: list[JSON] = []
    by_index: dict[int, list[JSON]] = {}
    for p in active:
        ix = jp.completion_index(p)
        if ix is None or ix >= completions or ix in succeeded:
            extras.append(p)
        else:
            by_index.setdefault(ix, []).append(p)
    for group in by_index.values():
        group.sort(key=_keep_rank)
        extras.extend(group[1:])
    return extras


def plan_job(
    job: Mapping[str, Any],
    pods: Sequence[JSON],
    now: float,
    *,
    finalizers_removed: Collection[str] = (),
    backoff_remaining_s: float = 0.0,
) -> JobPlan:
    """One sync. ``pods`` are the Job's pods as cached; ``finalizers_removed`` are UIDs whose
    finalizer removal was issued but not yet seen (treated as removed, so nothing counts twice);
    ``backoff_remaining_s`` delays pod creation after failures."""
    spec = job.get("spec") or {}
    status: JSON = copy.deepcopy(dict(job.get("status") or {}))
    now_s = jp.format_time(now)

    def tracked(p: JSON) -> bool:
        return jp.has_finalizer(p) and _uid(p) not in finalizers_removed

    if is_finished(job):
        return JobPlan(status=status, remove_finalizers=[p for p in pods if tracked(p)])

    indexed = spec.get("completionMode") == "Indexed"
    completions: int | None = spec.get("completions")
    parallelism = int(spec.get("parallelism", 1))
    backoff_limit = int(spec.get("backoffLimit", BACKOFF_LIMIT_DEFAULT))
    only_failed = spec.get("podReplacementPolicy") == "Failed" or bool(spec.get("podFailurePolicy"))
    suspended = bool(spec.get("suspend"))
    deleting = bool((job.get("metadata") or {}).get("deletionTimestamp"))
    by_uid = {_uid(p): p for p in pods}

    def is_failed(p: JSON) -> bool:
        if only_failed:
            return jp.phase(p) == "Failed"
        return jp.phase(p) == "Failed" or (jp.is_terminating(p) and jp.phase(p) != "Succeeded")

    def valid_index(p: JSON) -> bool:
        ix = jp.completion_index(p)
        return not indexed or (ix is not None and completions is not None and ix < completions)

    # Flush: uncounted pods whose finalizer is gone (or that are gone) move into the counts.
    uncounted = status.get("uncountedTerminatedPods") or {}
    unc_succ, unc_fail = set(uncounted.get("succeeded") or []), set(uncounted.get("failed") or [])
    flushed_s = {u for u in unc_succ if u not in by_uid or not tracked(by_uid[u])}
    flushed_f = {u for u in unc_fail if u not in by_uid or not tracked(by_uid[u])}
    unc_succ -= flushed_s
    unc_fail -= flushed_f
    flushed_succeeded = int(status.get("succeeded") or 0) + len(flushed_s)
    flushed_failed = int(status.get("failed") or 0) + len(flushed_f)

    active = [p for p in pods if jp.is_active(p)]
    terminating = sum(1 for p in pods if jp.is_terminating(p))
    succeeded_idx = jp.parse_intervals(status.get("completedIndexes")) if indexed else set()
    new_succ, new_fail = [], []
    for p in pods:
        if not tracked(p) or _uid(p) in unc_succ or _uid(p) in unc_fail or not valid_index(p):
            continue
        if jp.phase(p) == "Succeeded":
            new_succ.append(p)
        elif is_failed(p):
            new_fail.append(p)
    if indexed:
        succeeded_idx |= {ix for ix in (jp.completion_index(p) for p in new_succ) if ix is not None}
        succeeded = len(succeeded_idx)
    else:
        succeeded = flushed_succeeded + len(unc_succ) + len(new_succ)
    failed = flushed_failed + len(unc_fail) + len(new_fail)

    if not status.get("startTime") and not suspended:
        status["startTime"] = now_s
    conds: list[JSON] = [dict(c) for c in status.get("conditions") or []]
    plan = JobPlan(status=status)

    final, interim, plan.requeue_after_s = _finish(status, spec, active, failed, backoff_limit, suspended, now)
    failing = (final is not None and final[0] == "Failed") or interim is not None

    if final is not None or interim is not None:
        plan.delete = list(active)
    else:
        if not deleting:
            if suspended:
                plan.delete = list(active)
            else:
                held = [p for p in pods if jp.is_terminating(p)] if only_failed else []
                _manage(
                    plan, active, held, indexed, completions, parallelism, succeeded, succeeded_idx, backoff_remaining_s
                )
        remaining_active = len(active) - len(plan.delete) + len(plan.create)
        if indexed and completions is not None:
            complete = len(succeeded_idx) >= completions
        elif completions is None:
            complete = succeeded > 0 and remaining_active == 0
        else:
            complete = succeeded >= completions and remaining_active == 0
        if complete:
            interim = _new_condition("SuccessCriteriaMet", *REASON_COMPLETIONS, now_s)
        elif deleting:
            pass
        elif suspended:
            _set_condition(conds, "Suspended", "True", "JobSuspended", "Job suspended", now_s)
        elif _set_condition(conds, "Suspended", "False", "JobResumed", "Job resumed", now_s, add_if_missing=False):
            status["startTime"] = now_s
    deleted_uids = {_uid(p) for p in plan.delete}

    # Count and release the finished pods (all unfinished ones too once the Job is failing).
    finishing = final is not None or interim is not None
    for p in pods:
        if not tracked(p):
            continue
        uid, ph = _uid(p), jp.phase(p)
        if uid in unc_succ or uid in unc_fail:
            plan.remove_finalizers.append(p)  # written as uncounted earlier; the removal is still due
            continue
        considered_failed = is_failed(p)
        if not (finishing or ph == "Succeeded" or considered_failed):
            continue
        plan.remove_finalizers.append(p)
        if ph == "Succeeded":
            if not indexed:
                unc_succ.add(uid)
        elif (considered_failed or failing) and valid_index(p):
            unc_fail.add(uid)

    terminating += len(deleted_uids)
    still_active = [p for p in active if _uid(p) not in deleted_uids]
    if interim is not None and condition({"conditions": conds}, interim["type"]) is None:
        conds.append(interim)
    if final is not None and not unc_succ and not unc_fail and terminating == 0 and not plan.remove_finalizers:
        _set_condition(conds, final[0], "True", final[1], final[2], now_s)
        if final[0] == "Complete":
            status["completionTime"] = now_s
    _write_counts(
        status,
        len(still_active) + len(plan.create),
        sum(1 for p in still_active if jp.is_ready(p)),
        terminating,
        len(succeeded_idx) if indexed else flushed_succeeded,
        flushed_failed,
        succeeded_idx if indexed else None,
        unc_succ,
        unc_fail,
    )
    status["conditions"] = conds
    if not conds:
        del status["conditions"]
    return plan


def _finish(
    status: JSON,
    spec: Mapping[str, Any],
    active: Sequence[JSON],
    failed: int,
    backoff_limit: int,
    suspended: bool,
    now: float,
) -> tuple[tuple[str, str, str] | None, JSON | None, float | None]:
    """(final condition due, interim condition to add, seconds until the deadline).

    An interim condition written earlier makes the final one (same reason) due; otherwise too
    many failures (or container restarts under ``OnFailure``) or a passed deadline start one.
    """
    if (ft := condition(status, "FailureTarget")) is not None:
        return ("Failed", str(ft.get("reason", "")), str(ft.get("message", ""))), None, None
    if (sc := condition(status, "SuccessCriteriaMet")) is not None:
        return ("Complete", str(sc.get("reason", "")), str(sc.get("message", ""))), None, None
    now_s = jp.format_time(now)
    on_failure = (spec.get("template") or {}).get("spec", {}).get("restartPolicy") == "OnFailure"
    restarts = _restarts(active) if on_failure else 0
    past_restarts = on_failure and (restarts > 0 if backoff_limit == 0 else restarts >= backoff_limit)
    if failed > backoff_limit or past_restarts:
        return None, _new_condition("FailureTarget", *REASON_BACKOFF, now_s), None
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is None or not status.get("startTime") or suspended:
        return None, None, None
    left = float(deadline) - (now - jp.parse_time(str(status["startTime"])))
    if left <= 0:
        return None, _new_condition("FailureTarget", *REASON_DEADLINE, now_s), None
    return None, None, left


def _manage(
    plan: JobPlan,
    active: Sequence[JSON],
    held: Sequence[JSON],
    indexed: bool,
    completions: int | None,
    parallelism: int,
    succeeded: int,
    succeeded_idx: Collection[int],
    backoff_remaining_s: float,
) -> None:
    """``manageJob``: remove surplus pods, else create up to the wanted number (never while backing off).

    ``held`` are the terminating pods that still hold their slot (``podReplacementPolicy: Failed``).
    """
    if completions is None:
        want = len(active) if succeeded > 0 else parallelism
    else:
        want = max(0, min(parallelism, completions - succeeded))
    surplus = _indexed_extras(active, completions or 0, succeeded_idx) if indexed else []
    keep = [p for p in active if p not in surplus]
    extra = len(keep) - want
    if extra > 0:
        surplus.extend(sorted(keep, key=_keep_rank, reverse=True)[:extra])
    if surplus:
        plan.delete = surplus[:MAX_POD_CREATE_DELETE_PER_SYNC]
        return
    missing = min(want - len(active) - len(held), MAX_POD_CREATE_DELETE_PER_SYNC)
    if missing <= 0:
        return
    if backoff_remaining_s > 0:
        plan.requeue_after_s = (
            backoff_remaining_s if plan.requeue_after_s is None else min(plan.requeue_after_s, backoff_remaining_s)
        )
        return
    if not indexed:
        plan.create = [None] * missing
        return
    busy = set(succeeded_idx)
    busy |= {ix for ix in (jp.completion_index(p) for p in list(active) + list(held)) if ix is not None}
    pending = [i for i in range(completions or 0) if i not in busy]
    plan.create = list(pending[:missing])


def _write_counts(
    status: JSON,
    active: int,
    ready: int,
    terminating: int,
    succeeded: int,
    failed: int,
    succeeded_idx: Collection[int] | None,
    unc_succ: Collection[str],
    unc_fail: Collection[str],
) -> None:
    """Counters as the controller writes them: zero counts omitted, ``ready``/``terminating`` always."""
    for key, value in (("active", active), ("succeeded", succeeded), ("failed", failed)):
        if value:
            status[key] = value
        else:
            status.pop(key, None)
    status["ready"] = ready
    status["terminating"] = terminating
    if succeeded_idx is not None:
        text = jp.format_intervals(succeeded_idx)
        if text:
            status["completedIndexes"] = text
        else:
            status.pop("completedIndexes", None)
    unc: JSON = {}
    if unc_succ:
        unc["succeeded"] = sorted(unc_succ)
    if unc_fail:
        unc["failed"] = sorted(unc_fail)
    status["uncountedTerminatedPods"] = unc
