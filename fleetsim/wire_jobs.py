"""What wire mode says to the broker and reads back: the job a launcher submits for an item, what becomes of a
submitted item (its attempts read from the broker's job), and the pipeline latency measured against the budget
(FLEET-NOTES S-1)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetsim.model import Outcome, WorkItem
from fleetsim.wire_pods import GPU_TOLERATIONS, Gang, NodeLabels
from placement import mig
from placement.podspec import GPU_MILLI_RESOURCE, GPU_RESOURCE
from tandem.v1 import job_pb2

__all__ = [
    "PIPELINE_BUDGET",
    "PROMPT_PLACEMENT_S",
    "TERMINAL_STATES",
    "Tracked",
    "broker_times",
    "false_dispatch_causes",
    "fill_outcome",
    "job_spec",
    "proto_seconds",
    "wire_notes",
]

PIPELINE_BUDGET = 0.02
"""S-1: the pipeline latency (submit -> all bound) should stay under this share of the median job duration."""
PROMPT_PLACEMENT_S = 1.0
"""An item reserved this soon (real seconds) after submission was placed on arrival, not held for capacity
(the placer rescans waiting jobs every 20 x 50 ms)."""
TERMINAL_STATES = frozenset({job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED})
_NOT_STARTED = frozenset(
    {
        job_pb2.ATTEMPT_OUTCOME_REJECTED,
        job_pb2.ATTEMPT_OUTCOME_GANG_TIMEOUT,
        job_pb2.ATTEMPT_OUTCOME_INFRA_FAILED,
        job_pb2.ATTEMPT_OUTCOME_LOST,
    }
)
"""Outcomes of an attempt that never ran and is re-planned: a false dispatch when it was dispatched."""


def job_spec(item: WorkItem, compression: float = 0.0) -> job_pb2.JobSpec:
    """One pod set of `item.replicas` with the item's shape and a pod template that requests exactly it; with a
    `compression` factor, the item's declared max runtime in compressed time (0: none is sent)."""
    spec = job_pb2.JobSpec(
        tenant=item.tenant,
        queue="default",
        priority=max(-1000, min(1000, item.priority)),
        preemptible=item.preemptible,
        display_name=item.name,
        framework=job_pb2.FRAMEWORK_TORCHRUN if item.replicas > 1 else job_pb2.FRAMEWORK_PLAIN,
    )
    resources: dict[str, str] = {"cpu": f"{item.cpu_milli}m", "memory": str(item.memory_bytes)}
    ps = spec.pod_sets.add(name="workers", count=item.replicas)
    shape = ps.shape
    shape.cpu_milli = item.cpu_milli
    shape.memory_bytes = item.memory_bytes
    shape.allowed_gpu_models.extend(item.gpu_models)
    if item.mig_profile:
        shape.mig_profile = item.mig_profile
        shape.mig_count = item.mig_count
        resources[mig.resource_name(item.mig_profile)] = str(item.mig_count)
    elif item.gpus and item.gpu_milli < 1000:
        shape.gpu_count = 1  # a share is asked of one GPU
        shape.gpu_milli = item.gpu_milli
        resources[GPU_MILLI_RESOURCE] = str(item.gpu_milli)
    elif item.gpus:
        shape.gpu_count = item.gpus
        resources[GPU_RESOURCE] = str(item.gpus)
    container = {
        "name": "main",
        "image": "registry.example.com/fleetsim/workload:1",
        "resources": {"requests": resources, "limits": dict(resources)},
    }
    ps.pod_template_json = json.dumps({"spec": {"containers": [container], "tolerations": GPU_TOLERATIONS}})
    if item.required_level:
        spec.topology.required_level = item.required_level
    if item.min_replicas and item.min_replicas < item.replicas:
        spec.min_available = item.min_replicas
    if item.max_runtime_s is not None and compression > 0:
        spec.max_runtime.FromMilliseconds(max(1000, int(1000 * item.max_runtime_s / compression)))
    return spec


def proto_seconds(ts: Any) -> float | None:
    """A protobuf Timestamp in seconds since the epoch; None when unset."""
    nanos = int(ts.ToNanoseconds())
    return nanos / 1e9 if nanos else None


@dataclass
class Tracked:
    """One item of the run as the launchers know it: its job, when it was submitted, placed and bound."""

    item: WorkItem
    outcome: Outcome
    submitted_at: float = 0.0
    job_id: str = ""
    done: bool = False
    first_placed_at: float | None = None
    bound_at: float | None = None
    """Wall-clock times of the first reservation and of the gang of the last attempt all bound."""
    attempts: int = 0


def false_dispatch_causes(attempts: Sequence[job_pb2.Attempt]) -> tuple[str, ...]:
    """Why each re-planned attempt that was dispatched never ran (the last attempt is not re-planned)."""
    causes = []
    for a in attempts[:-1]:
        if a.dispatch_time.ToNanoseconds() and not a.running_time.ToNanoseconds() and a.outcome in _NOT_STARTED:
            cause = job_pb2.AttemptOutcome.Name(a.outcome).removeprefix("ATTEMPT_OUTCOME_")
            if a.outcome == job_pb2.ATTEMPT_OUTCOME_REJECTED:
                reason = job_pb2.DispatchRejectReason.Name(a.rejection.reason)
                cause += ":" + reason.removeprefix("DISPATCH_REJECT_REASON_")
            causes.append(cause)
    return tuple(causes)


def fill_outcome(
    tracked: Tracked,
    job: job_pb2.Job,
    gangs: Mapping[tuple[str, int], Gang],
    sim_time: Callable[[float], float],
    node_labels: NodeLabels,
) -> None:
    """The item's outcome from the broker's attempts and what the clusters showed of the pods (`gangs`, by job
    and attempt); `sim_time` turns a wall-clock time into the run's simulated seconds."""
    out = tracked.outcome
    attempts = list(job.status.attempts)
    out.dispatches = sum(1 for a in attempts if a.dispatch_time.ToNanoseconds())
    out.false_dispatch_causes = false_dispatch_causes(attempts)
    out.false_dispatches = len(out.false_dispatch_causes)
    if not attempts:
        return
    tracked.attempts = len(attempts)
    tracked.first_placed_at = proto_seconds(attempts[0].reserve_time)
    last = attempts[-1]
    out.cluster = last.cluster
    if (reserved := proto_seconds(last.reserve_time)) is not None:
        out.placed_s = sim_time(reserved)
    gang = gangs.get((job.job_id, last.number))
    if gang is not None and gang.bound_at is not None:
        tracked.bound_at = gang.bound_at
        out.started_s = sim_time(gang.bound_at)
    elif (running := proto_seconds(last.running_time)) is not None:
        out.started_s = sim_time(running)
    if job.status.state == job_pb2.JOB_STATE_SUCCEEDED and (ended := proto_seconds(last.end_time)) is not None:
        out.finished_s = sim_time(ended)
    nodes = list(gang.nodes.values()) if gang is not None and gang.nodes else [r.node for r in last.replicas if r.node]
    level = tracked.item.required_level
    if level and nodes:
        out.domains = node_labels.domains(last.cluster, level, nodes)


def broker_times(compression: float) -> dict[str, Any]:
    """The broker's fairness and grace periods in compressed time, as they are in simulated time."""
    c = compression
    return {
        "grace_period_s": 30.0 / c,
        "fairness": {
            "min_runtime_s": 900.0 / c,
            "release_timeout_s": max(120.0 / c, 5.0),
            "hold_after_s": 1800.0 / c,
            "max_hold_s": 4 * 3600.0 / c,
        },
    }


def wire_notes(tracked: Sequence[Tracked], compression: float) -> list[str]:
    """The run's notes on its time compression and on the pipeline's latency in real seconds: submit -> all bound
    against the median job, and placement -> all bound."""
    notes = [
        (
            f"wire mode: real broker, extender and agent processes; time compressed {compression:g}x "
            f"(1 real second = {compression:g} simulated seconds)"
        ),
        (
            "wire mode: the broker's grace period, minimum runtime before fair-share preemption, "
            "hold bound and hold length are compressed likewise; a preempted job runs its whole "
            "duration again (no checkpoints)"
        ),
    ]
    durations = [t.item.duration_s / compression for t in tracked]
    median = statistics.median(durations) if durations else 0.0
    # S-1's figure is submit -> all bound; only an item the broker placed on arrival (not held for
    # capacity) and that started on its first attempt shows the pipeline rather than queueing.
    prompt = [
        t.bound_at - t.submitted_at
        for t in tracked
        if t.bound_at is not None
        and t.first_placed_at is not None
        and t.attempts == 1
        and t.first_placed_at - t.submitted_at <= PROMPT_PLACEMENT_S
    ]
    if prompt and median > 0:
        p50 = statistics.median(prompt)
        verdict = "within" if p50 / median < PIPELINE_BUDGET else "ABOVE"
        notes.append(
            f"pipeline latency (submit -> all pods bound, {len(prompt)} items placed on arrival) p50 "
            f"{p50 * 1000:.0f} ms real = {p50 / median:.1%} of the median job duration "
            f"({median:.1f} s real): {verdict} the {PIPELINE_BUDGET:.0%} budget (S-1)"
        )
    elif tracked:
        notes.append("pipeline latency: no item was placed on arrival and started at once (all queued)")
    outcomes = [t.outcome for t in tracked]
    binding = [
        (o.started_s - o.placed_s) / compression for o in outcomes if o.started_s is not None and o.placed_s is not None
    ]
    if binding:
        notes.append(
            f"placement -> all pods bound p50 {statistics.median(binding) * 1000:.0f} ms real "
            "(dispatch, create, pin, start, bind)"
        )
    return notes
