"""What the broker must hear about one attempt, read from its pods and Jobs as the API server returns them.

Pure: raw JSON dicts in, dataclasses out; the caller passes `now` and keeps the first-seen times of
image-pull errors between calls (`AttemptView.first_seen` is the updated map to pass back; without it
the pod's `status.startTime` stands in, which can only fail a stuck pull sooner).

Classification (FLEET-NOTES A-5) is decided at the FIRST pod observation, never by waiting for the
Job's `Failed` (which comes only after every pod has terminated). When several replicas show a
failure at once, the cause is chosen in this order:

1. max runtime: a Job's `FailureTarget`/`Failed` with reason `DeadlineExceeded`, or its
   `activeDeadlineSeconds` past since `status.startTime` (the Job controller then deletes the pods
   without a `DisruptionTarget`; seen first, those deletions must not read as someone else's).
   Reported as APP_FAILED: the broker has no MAX_RUNTIME outcome, and the limit is the job's own —
   INFRA_FAILED would spend retries to hit the same limit again; CANCELLED outside a cancel becomes
   INFRA_FAILED in `broker.domain.lifecycle`. Only APP_FAILED fails the job without a retry.
2. the cluster's doing: `DisruptionTarget` (PreemptionByScheduler → PREEMPTED, any other reason →
   INFRA_FAILED), the pod's node gone or NotReady past a bound, a pod the kubelet failed with a reason
   (Evicted, UnexpectedAdmissionError, OutOf<resource>). These win over application exits, which are
   often their consequence (NCCL peers exit once a node dies; its eviction comes minutes later).
3. the earliest of: a main container terminated non-zero (APP_FAILED with its exit code), an image or
   configuration error past `image_pull_failure_s` (APP_FAILED "configuration"), a pod deleted by
   someone else (INFRA_FAILED "pod deleted"; its request time is deletionTimestamp - grace). A pod being
   deleted contributes no exit code: its exit is the deletion's, not the program's.
4. a Job failed with no pod left to say why (INFRA_FAILED with the Job's condition).

The agent never reports GANG_TIMEOUT: the broker's deadline is the only authority (A-14).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.agent.config import AgentConfig
from extender.agent.model import Order
from extender.agent.podtemplate import GATE
from extender.agent.render import IndexedJobRenderer
from extender.agent.replicas import (
    MESSAGE_LIMIT,
    Pod,
    ReplicaPhase,
    ReplicaView,
    _by_replica,
    _condition,
    _exit,
    _meta,
    _pick,
    _spec,
    _status,
    _true,
    _waiting,
    is_gated,
    parse_time,
    replica_of,
    replica_views,
    truncate,
)
from extender.podreq import pinned_node

__all__ = [
    "ReplicaPhase",
    "WorkloadPhase",
    "Outcome",
    "ReplicaView",
    "AttemptView",
    "PodFeedback",
    "PinTarget",
    "PinState",
    "is_gated",
    "replica_of",
    "replica_views",
    "attempt_view",
    "scheduling_feedback",
    "pin_state",
    "parse_time",
    "truncate",
    "MESSAGE_LIMIT",
    "NOT_READY_BOUND_S",
]

FEEDBACK_LIMIT = 4096
"""Bytes of kube-scheduler's aggregated message kept per pod."""
NOT_READY_BOUND_S = 60.0
"""A replica's node NotReady this long fails the attempt (the taint manager evicts only after 300 s)."""
PULL_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "InvalidImageName"})
PREEMPTION = "PreemptionByScheduler"


class WorkloadPhase(enum.StrEnum):
    """tandem.v1.WorkloadPhase names without the prefix (DELETED is the teardown's, not read from pods)."""

    CREATING = "CREATING"
    GATED = "GATED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class Outcome(enum.StrEnum):
    """The tandem.v1.AttemptOutcome values the agent reports."""

    SUCCEEDED = "SUCCEEDED"
    APP_FAILED = "APP_FAILED"
    INFRA_FAILED = "INFRA_FAILED"
    PREEMPTED = "PREEMPTED"


@dataclass(frozen=True, slots=True)
class AttemptView:
    phase: WorkloadPhase
    replicas: tuple[ReplicaView, ...]
    outcome: Outcome | None = None
    exit_code: int | None = None
    message: str = ""
    first_seen: Mapping[str, float] = field(default_factory=dict)
    """Pod uid -> when an image/configuration error was first seen: pass it back on the next call."""

    @property
    def running(self) -> int:
        return sum(1 for r in self.replicas if r.phase is ReplicaPhase.RUNNING)


@dataclass(frozen=True, slots=True, order=True)
class _Signal:
    """One sign that the attempt ended; the smallest (group, time, rank) is the cause."""

    group: int
    time: float
    rank: int
    outcome: Outcome = field(compare=False)
    message: str = field(compare=False)
    exit_code: int | None = field(default=None, compare=False)


_MAX_RUNTIME, _CLUSTER, _FIRST, _JOB = range(4)


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the caller knows besides the pods: the clock, the nodes, and what the agent is doing itself."""

    now: float
    nodes: Collection[str] | None
    not_ready_since: Mapping[str, float]
    not_ready_s: float
    pull_bound_s: float
    deleted_by_agent: bool


def _node_signal(node: str, who: str, facts: _Facts) -> _Signal | None:
    if facts.nodes is not None and node not in facts.nodes:
        return _Signal(_CLUSTER, facts.now, 1, Outcome.INFRA_FAILED, f"{who}: node {node} is gone")
    since = facts.not_ready_since.get(node)
    if since is not None and facts.now - since >= facts.not_ready_s:
        return _Signal(
            _CLUSTER,
            since + facts.not_ready_s,
            1,
            Outcome.INFRA_FAILED,
            f"{who}: node {node} NotReady for {int(facts.now - since)} s",
        )
    return None


def _pod_signals(pod: Pod, who: str, facts: _Facts, pulls_since: float | None) -> list[_Signal]:
    """Every sign of failure one pod shows (see the module docstring for the groups)."""
    out: list[_Signal] = []
    st, meta, now = _status(pod), _meta(pod), facts.now
    phase, node, reason = st.get("phase"), str(_spec(pod).get("nodeName") or ""), str(st.get("reason") or "")
    disruption = _true(pod, "DisruptionTarget")
    if reason == "DeadlineExceeded":
        out.append(
            _Signal(_MAX_RUNTIME, now, 0, Outcome.APP_FAILED, f"max runtime exceeded: {who}: {st.get('message', '')}")
        )
    if disruption is not None:
        why, t = str(disruption.get("reason", "")), parse_time(disruption.get("lastTransitionTime")) or now
        preempted = why == PREEMPTION
        out.append(
            _Signal(
                _CLUSTER,
                t,
                0 if preempted else 1,
                Outcome.PREEMPTED if preempted else Outcome.INFRA_FAILED,
                f"{who} {'preempted' if preempted else 'disrupted'} ({why}): {disruption.get('message', '')}",
            )
        )
    elif phase == "Failed" and reason and reason != "DeadlineExceeded":  # the kubelet's doing (Evicted, OutOfcpu...)
        out.append(
            _Signal(
                _CLUSTER, now, 1, Outcome.INFRA_FAILED, f"{who} failed on its node ({reason}): {st.get('message', '')}"
            )
        )
    if node and phase != "Succeeded" and (lost := _node_signal(node, who, facts)) is not None:
        out.append(lost)
    if meta.get("deletionTimestamp"):  # its exit is the deletion's, not the program's
        if not facts.deleted_by_agent and disruption is None:
            asked = (parse_time(meta["deletionTimestamp"]) or now) - float(meta.get("deletionGracePeriodSeconds") or 0)
            state = "gated" if is_gated(pod) else str(phase or "Pending").lower()
            out.append(
                _Signal(_FIRST, asked, 2, Outcome.INFRA_FAILED, f"{who}: pod deleted while {state} (not by Tandem)")
            )
        return out
    ended = _exit(pod)
    if disruption is None and ended is not None and ended.code:
        text = f"{who}: container {ended.container} exited with code {ended.code} ({ended.reason})"
        out.append(
            _Signal(
                _FIRST,
                ended.finished or now,
                0,
                Outcome.APP_FAILED,
                text + (f": {ended.message}" if ended.message else ""),
                ended.code,
            )
        )
    waiting = _waiting(pod, PULL_ERRORS)
    if waiting is not None and pulls_since is not None and now - pulls_since >= facts.pull_bound_s:
        out.append(
            _Signal(
                _FIRST,
                pulls_since,
                1,
                Outcome.APP_FAILED,
                f"configuration: {who}: container {waiting[2]} cannot start for {int(now - pulls_since)} s "
                f"({waiting[0]}): {waiting[1]}",
            )
        )
    return out


def _job_signals(job: Pod, now: float) -> list[_Signal]:
    """A Job's failure conditions, and its activeDeadlineSeconds passed before the condition shows."""
    name = _meta(job).get("name", "")
    out = []
    for kind in ("FailureTarget", "Failed"):
        c = _true(job, kind)
        if c is not None:
            deadline = c.get("reason") == "DeadlineExceeded"
            out.append(
                _Signal(
                    _MAX_RUNTIME if deadline else _JOB,
                    parse_time(c.get("lastTransitionTime")) or now,
                    0,
                    Outcome.APP_FAILED if deadline else Outcome.INFRA_FAILED,
                    f"{'max runtime exceeded' if deadline else 'job failed'}: Job {name} "
                    f"({c.get('reason', '')}): {c.get('message', '')}",
                )
            )
    limit, started = (job.get("spec") or {}).get("activeDeadlineSeconds"), parse_time(_status(job).get("startTime"))
    if limit and started is not None and now >= started + float(limit):
        out.append(
            _Signal(
                _MAX_RUNTIME,
                started + float(limit),
                1,
                Outcome.APP_FAILED,
                f"max runtime exceeded: Job {name} passed its activeDeadlineSeconds ({limit} s)",
            )
        )
    return out


def _complete(job: Pod | None) -> bool:
    return job is not None and (_true(job, "Complete") is not None or _true(job, "SuccessCriteriaMet") is not None)


def _uid(pod: Pod) -> str:
    meta = _meta(pod)
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def _pull_errors(
    found: Mapping[tuple[str, int], list[Pod]], first_seen: Mapping[str, float] | None, now: float
) -> dict[str, float]:
    """Pod uid -> first sighting of its image/configuration error. Without a memory (None) the pod's
    status.startTime stands in: the pull began then, so this is never later than the first sighting."""
    seen: dict[str, float] = {}
    for group in found.values():
        for pod in group:
            if _waiting(pod, PULL_ERRORS) is not None and not _meta(pod).get("deletionTimestamp"):
                fallback = now if first_seen is not None else parse_time(_status(pod).get("startTime")) or now
                seen[_uid(pod)] = (first_seen or {}).get(_uid(pod), fallback)
    return seen


def attempt_view(
    order: Order,
    pods: Iterable[Pod],
    jobs: Iterable[Pod],
    nodes: Collection[str] | None,
    config: AgentConfig,
    *,
    now: float,
    success_pod_sets: Collection[str] | None = None,
    first_seen: Mapping[str, float] | None = None,
    not_ready_since: Mapping[str, float] | None = None,
    not_ready_s: float = NOT_READY_BOUND_S,
    deleted_by_agent: bool = False,
) -> AttemptView:
    """The attempt's phase and, when terminal, its outcome (see the module docstring).

    `nodes`: the names of every node that exists (None: unknown, not judged); `not_ready_since`: node ->
    since when it is NotReady. `success_pod_sets`: the renderer's success rule (None: the Indexed-Job
    renderer's). `first_seen`: the previous view's `first_seen`. `deleted_by_agent`: the agent itself is
    tearing the attempt down, so deletions are no failure."""
    pods = list(pods)
    found = _by_replica(order, pods, config)
    views = replica_views(order, pods, config)
    by_name = {str(_meta(j).get("name")): j for j in jobs}
    seen = _pull_errors(found, first_seen, now)
    wanted_names = IndexedJobRenderer(config).success_pod_sets(order) if success_pod_sets is None else success_pod_sets
    wanted = [ps for ps in order.pod_sets if ps.name in wanted_names]
    if not wanted:
        raise ValueError(f"success_pod_sets {sorted(wanted_names)} names no pod set of {order.name}")
    if all(
        _complete(by_name.get(order.job_name(ps.name)))
        or all(
            any(_status(p).get("phase") == "Succeeded" for p in found.get((ps.name, i), ())) for i in range(ps.count)
        )
        for ps in wanted
    ):
        return AttemptView(WorkloadPhase.SUCCEEDED, views, Outcome.SUCCEEDED, 0, "succeeded", seen)
    facts = _Facts(now, nodes, not_ready_since or {}, not_ready_s, config.image_pull_failure_s, deleted_by_agent)
    position = {(v.pod_set, v.index): n for n, v in enumerate(views)}
    signals = [
        (s, position[key])
        for key, group in found.items()
        for pod in group
        for s in _pod_signals(
            pod, f"replica {key[0]}-{key[1]} (pod {_meta(pod).get('name', '')})", facts, seen.get(_uid(pod))
        )
    ]
    signals += [
        (s, -1)
        for ps in order.pod_sets
        if (job := by_name.get(order.job_name(ps.name))) is not None
        for s in _job_signals(job, now)
    ]
    if signals:
        cause = min(signals, key=lambda s: (s[0], s[1]))[0]
        return AttemptView(WorkloadPhase.FAILED, views, cause.outcome, cause.exit_code, truncate(cause.message), seen)
    phases = [v.phase for v in views]
    absent = phases.count(ReplicaPhase.ABSENT)
    running = sum(1 for p in phases if p in (ReplicaPhase.RUNNING, ReplicaPhase.SUCCEEDED))
    if absent:
        phase, message = WorkloadPhase.CREATING, f"{len(views) - absent}/{len(views)} pods exist"
    elif all(p is ReplicaPhase.GATED for p in phases):
        phase, message = WorkloadPhase.GATED, "every pod exists, gated: waiting for Start"
    elif running == len(views):
        phase, message = WorkloadPhase.RUNNING, f"{len(views)} replicas running"
    else:
        phase, message = WorkloadPhase.STARTING, f"{running}/{len(views)} replicas running"
    return AttemptView(phase, views, message=message, first_seen=seen)


@dataclass(frozen=True, slots=True)
class PodFeedback:
    """kube-scheduler's verdict on an ungated, unbound Tandem pod (A-10): what the broker shows. It carries no
    time: the agent stamps it when seen (`wire.scheduling_feedback`), as the condition's lastTransitionTime stays
    at the pod's creation while its status stays False (SchedulingGated -> Unschedulable)."""

    pod_set: str
    index: int
    pod: str
    reason: str
    message: str


def scheduling_feedback(pods: Iterable[Pod]) -> list[PodFeedback]:
    """`PodScheduled=False` of every ungated, unbound, live gang pod (SchedulingGated is no verdict), in pod
    set and index order. The message aggregates the extender's FailedNodes with the in-tree filters'."""
    out = []
    for pod in pods:
        key, cond = replica_of(pod), _condition(pod, "PodScheduled")
        if (
            key is None
            or cond is None
            or cond.get("status") != "False"
            or cond.get("reason") == "SchedulingGated"
            or _spec(pod).get("schedulingGates")
            or _spec(pod).get("nodeName")
            or _meta(pod).get("deletionTimestamp")
            or _status(pod).get("phase", "Pending") != "Pending"
        ):
            continue
        out.append(
            PodFeedback(
                key[0],
                key[1],
                str(_meta(pod).get("name", "")),
                str(cond.get("reason", "")),
                truncate(str(cond.get("message", "")), FEEDBACK_LIMIT),
            )
        )
    return sorted(out, key=lambda f: (f.pod_set, f.index, f.pod))


@dataclass(frozen=True, slots=True)
class PinTarget:
    pod_set: str
    index: int
    pod: str
    node: str
    """The node the broker assigned."""
    manifest: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The pod as read (what `pods.pin_patch` needs)."""


@dataclass(frozen=True, slots=True)
class PinState:
    need_pin: tuple[PinTarget, ...]
    wrong: tuple[PinTarget, ...]
    """Pinned to another node: a pin cannot be changed (A-1), the attempt cannot start as planned."""
    missing: tuple[tuple[str, int], ...]
    problems: tuple[str, ...]
    """Why the gang cannot start (wrong pins, gates lifted before Start, pods terminating)."""

    @property
    def ready_to_start(self) -> bool:
        """A-7's check at Start: every pod exists, is pinned to its node and still gated."""
        return not (self.need_pin or self.wrong or self.missing or self.problems)

    @property
    def to_pin(self) -> tuple[tuple[Mapping[str, Any], str], ...]:
        """(pod, node) for each pod still to pin."""
        return tuple((t.manifest, t.node) for t in self.need_pin)

    @property
    def problem(self) -> str:
        """One line for a message: what stands between the gang and its Start."""
        parts = list(self.problems)
        if self.missing:
            names = ", ".join(f"{ps}-{i}" for ps, i in self.missing[:5])
            parts.append(f"{len(self.missing)} pod(s) missing: {names}" + (" ..." if len(self.missing) > 5 else ""))
        if self.need_pin:
            parts.append(f"{len(self.need_pin)} pod(s) not pinned yet")
        return "; ".join(parts)


def pin_state(
    pods: Iterable[Pod], order: Order, config: AgentConfig | None = None, pod_sets: Collection[str] | None = None
) -> PinState:
    """Which pods of the attempt (or of `pod_sets`, one start group) still need their pin, and whether the
    group may be ungated. Replica i of a pod set goes to `PodSetOrder.node_of(i)`. The pods are the
    attempt's; with `config` they are also checked for its job and attempt labels."""
    found = _by_replica(order, pods, config)
    need, wrong, missing, problems = [], [], [], []
    for ps in order.pod_sets:
        if pod_sets is not None and ps.name not in pod_sets:
            continue
        for i in range(ps.count):
            node = ps.node_of(i)
            if (ps.name, i) not in found:
                missing.append((ps.name, i))
                continue
            pod = _pick(found[(ps.name, i)])
            who, pinned = f"replica {ps.name}-{i} (pod {_meta(pod).get('name', '')})", pinned_node(pod)
            if node is None:
                problems.append(f"{who} has no node assigned")
            elif _meta(pod).get("deletionTimestamp"):
                problems.append(f"{who} is terminating")
            elif not is_gated(pod):
                problems.append(f"{who} lost its {GATE} gate before Start")
            elif pinned is not None and pinned != node:
                wrong.append(PinTarget(ps.name, i, str(_meta(pod).get("name", "")), node, pod))
                problems.append(f"{who} is pinned to {pinned}, assigned {node}")
            elif pinned is None:
                need.append(PinTarget(ps.name, i, str(_meta(pod).get("name", "")), node, pod))
    return PinState(tuple(need), tuple(wrong), tuple(missing), tuple(problems))
