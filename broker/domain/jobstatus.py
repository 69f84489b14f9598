"""What GetJob shows beyond the stored rows: rendezvous address, log links and the last scheduling feedback (pure)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from broker.domain.records import AttemptRecord, JobRecord
from broker.domain.states import JobState
from fleetplan.decide import ClusterVerdict

__all__ = ["LogLink", "QueueView", "DEFAULT_PORTS", "PLAIN_PORT", "rendezvous_address", "log_links", "waiting_message"]

PLAIN_PORT = 29400
"""Rendezvous port when neither the spec nor its framework names one (torchrun's c10d default)."""
DEFAULT_PORTS = {"TORCHRUN": 29500, "RAY": 6379, "MPI": 2222}
"""Rendezvous port per framework (JobSpec.framework without its prefix) when the spec sets none."""

_WAITING = frozenset({JobState.ACCEPTED, JobState.STARTING})
"""States in which pods exist but not all run: the extender's verdict explains the wait."""


@dataclass(frozen=True, slots=True)
class QueueView:
    """Where a queued job stands and why it waits (`reason`: a WaitReason name without its prefix), with
    each allowed cluster's verdict when asked for (GetJob)."""

    position: int | None
    reason: str
    message: str
    clusters: tuple[ClusterVerdict, ...] = ()


@dataclass(frozen=True, slots=True)
class LogLink:
    name: str
    url: str
    pod_set: str = ""
    index: int | None = None
    """None for a per-attempt link."""


def rendezvous_address(
    job_id: str, attempt: int, first_pod_set: str, namespace: str, framework: str, port: int = 0
) -> str:
    """``<pod>.<service>.<namespace>.svc:<port>``: replica 0 of the first pod set under the attempt's headless
    Service ``<job>-<attempt>`` (pods carry hostname ``<job>-<attempt>-<pod set>-<index>`` and that subdomain)."""
    workload = f"{job_id}-{attempt}"
    port = port or DEFAULT_PORTS.get(framework, PLAIN_PORT)
    return f"{workload}-{first_pod_set}-0.{workload}.{namespace}.svc:{port}"


def _expand(template: str, values: dict[str, str]) -> str:
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", urllib.parse.quote(value, safe=""))
    return out


def log_links(templates: Sequence[tuple[str, str]], job_id: str, a: AttemptRecord) -> list[LogLink]:
    """One link per template for the attempt; templates naming ``{pod}`` give one per replica with a pod."""
    base = {
        "cluster": a.cluster,
        "namespace": a.namespace,
        "job": job_id,
        "attempt": str(a.number),
        "workload": f"{job_id}-{a.number}",
    }
    out: list[LogLink] = []
    for name, template in templates:
        if "{pod}" not in template:
            out.append(LogLink(name, _expand(template, base)))
            continue
        for r in a.replicas:
            if r.pod:
                vals = dict(base, pod=r.pod, pod_set=r.pod_set, index=str(r.index), node=r.node)
                out.append(LogLink(name, _expand(template, vals), r.pod_set, r.index))
    return out


def waiting_message(job: JobRecord, current: AttemptRecord | None) -> str | None:
    """The extender's last refusal for a pod of the current attempt, while the gang waits to start."""
    if current is None or current.number != job.attempt or job.state not in _WAITING or not current.feedback:
        return None
    if current.feedback_time is not None and current.feedback_time < job.update_time:
        return None  # older than the last transition: no longer what the job waits on
    return f"waiting for kube-scheduler: {current.feedback}"
