"""Reading an attempt's pods and Jobs: replica phases, the A-5 outcome table, scheduling feedback, pins at Start."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from extender.agent import wire
from extender.agent.model import Order
from extender.agent.pods import pin_patch
from extender.agent.podtemplate import GATE
from extender.agent.status import (
    MESSAGE_LIMIT,
    Outcome,
    ReplicaPhase,
    WorkloadPhase,
    attempt_view,
    pin_state,
    replica_views,
    scheduling_feedback,
)
from tests.extender.test_agent_render import CONFIG, NOW, RENDERER, apply_patch, order, pod_set, render, server_pod

Pod = dict[str, Any]
IMAGE = "nvcr.io/nvidia/pytorch:25.10-py3"
T0 = NOW - 3600  # the pods were created an hour ago
PLAIN = order()  # two replicas of "workers": index 0 on node-0007, index 1 on node-0008
MPI = order(pod_set("launcher", (("node-0007", 1),)), pod_set("workers"), framework="MPI")
NODES = frozenset({"node-0007", "node-0008", "node-0100"})
DEADLINE = ("FailureTarget", "DeadlineExceeded", "Job was active longer than specified deadline")
BACKOFF = ("FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
MET = ("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods")
COMPLETE = ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
NO_MATCH = "0/12 nodes are available: 12 node(s) didn't match Pod's node affinity/selector."


def ts(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------- pod builders


def gated_pods(o: Order = PLAIN) -> list[Pod]:
    """Every replica's pod as the Job controller created it: gated, unpinned."""
    return [server_pod(job, i, created=ts(T0)) for job in render(o).jobs for i in range(job["spec"]["completions"])]


def _node(pod: Pod) -> str:
    """The node the broker assigned the pod's replica (PLAIN and MPI agree on their "workers")."""
    labels = pod["metadata"]["labels"]
    ps = next(p for o in (PLAIN, MPI) for p in o.pod_sets if p.name == labels["tandem.dev/pod-set"])
    node = ps.node_of(int(labels["batch.kubernetes.io/job-completion-index"]))
    assert node is not None
    return node


def _cstatus(state: dict[str, Any], *, ready: bool = False, name: str = "trainer", restarts: int = 0) -> dict[str, Any]:
    out = {
        "name": name,
        "image": IMAGE,
        "imageID": "",
        "ready": ready,
        "restartCount": restarts,
        "started": ready,
        "state": state,
        "lastState": {},
    }
    if "waiting" not in state:
        out.update(imageID=f"{IMAGE.split(':')[0]}@sha256:{'ab' * 32}", containerID=f"containerd://{'cd' * 32}")
    return out


def ungated(pod: Pod, message: str = NO_MATCH) -> Pod:
    pod = copy.deepcopy(pod)
    pod["spec"]["schedulingGates"] = [g for g in pod["spec"]["schedulingGates"] if g["name"] != GATE]
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": ts(T0 + 60),
        }
    ]
    return pod


def _conditions(ready: bool, scheduled_at: float) -> list[dict[str, Any]]:
    out = [
        {
            "type": kind,
            "status": "True" if ready or kind in ("Initialized", "PodScheduled") else "False",
            "lastProbeTime": None,
            "lastTransitionTime": ts(scheduled_at),
        }
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return out


def bound(pod: Pod, *, waiting: str = "ContainerCreating", message: str = "") -> Pod:
    pod = ungated(pod)
    pod["spec"]["nodeName"] = _node(pod)
    w = {"reason": waiting, **({"message": message} if message else {})}
    pod["status"].update(
        phase="Pending",
        conditions=_conditions(False, T0 + 70),
        hostIP="10.0.7.11",
        startTime=ts(T0 + 70),
        containerStatuses=[_cstatus({"waiting": w})],
    )
    return pod


def running(pod: Pod, started: float = T0 + 300) -> Pod:
    pod = bound(pod)
    pod["status"].update(
        phase="Running",
        conditions=_conditions(True, T0 + 70),
        podIP="10.244.7.23",
        containerStatuses=[_cstatus({"running": {"startedAt": ts(started)}}, ready=True)],
    )
    return pod


def ended(pod: Pod, code: int, *, at: float = NOW - 60, reason: str = "", message: str = "") -> Pod:
    pod = running(pod)
    term = {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "startedAt": ts(T0 + 300),
        "finishedAt": ts(at),
        "containerID": f"containerd://{'cd' * 32}",
        **({"message": message} if message else {}),
    }
    pod["status"].update(
        phase="Succeeded" if code == 0 else "Failed",
        conditions=_conditions(False, at),
        containerStatuses=[_cstatus({"terminated": term})],
    )
    return pod


def disrupted(pod: Pod, reason: str, message: str = "", at: float = NOW - 30) -> Pod:
    pod = copy.deepcopy(pod)
    pod["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": message or f"{reason}: disrupted",
            "lastProbeTime": None,
            "lastTransitionTime": ts(at),
        }
    )
    return pod


def deleted(pod: Pod, asked: float = NOW - 20, grace: int = 30) -> Pod:
    pod = copy.deepcopy(pod)
    pod["metadata"].update(deletionTimestamp=ts(asked + grace), deletionGracePeriodSeconds=grace)
    return pod


def server_job(
    o: Order, i: int = 0, *conditions: tuple[str, str, str], deadline_s: int | None = None, started: float = T0
) -> Pod:
    job: Pod = copy.deepcopy(render(o).jobs[i])
    job["metadata"].update(
        uid=f"0b6e2b4c-5a7d-4e8f-9c1d-{i:012d}", resourceVersion="5120", creationTimestamp=ts(T0), generation=1
    )
    if deadline_s is not None:
        job["spec"]["activeDeadlineSeconds"] = deadline_s
    job["status"] = {
        "startTime": ts(started),
        "active": job["spec"]["completions"],
        "ready": 0,
        "terminating": 0,
        "uncountedTerminatedPods": {},
        "conditions": [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastProbeTime": ts(NOW - 10),
                "lastTransitionTime": ts(NOW - 10),
            }
            for kind, reason, message in conditions
        ],
    }
    return job


def view(
    pods: list[Pod], o: Order = PLAIN, jobs: list[Pod] | None = None, nodes: frozenset[str] = NODES, **kw: Any
) -> Any:
    return attempt_view(o, pods, jobs or [], nodes, CONFIG, now=NOW, **kw)


A, B = gated_pods()


# ----------------------------------------------------------------------------------------- replicas


def _sidecar_crashed(pod: Pod) -> Pod:
    pod = running(pod)
    pod["spec"]["initContainers"] = [
        {"name": "log-shipper", "image": "fluent/fluent-bit:3.2", "restartPolicy": "Always"}
    ]
    crashed = {"terminated": {"exitCode": 2, "reason": "Error", "startedAt": ts(NOW - 5), "finishedAt": ts(NOW - 1)}}
    pod["status"]["initContainerStatuses"] = [_cstatus(crashed, name="log-shipper", restarts=3)]
    return pod


def _init_failed(pod: Pod) -> Pod:
    pod = bound(pod)
    pod["spec"]["initContainers"] = [{"name": "fetch-dataset", "image": "busybox:1.36"}]
    pod["status"].update(
        phase="Failed",
        initContainerStatuses=[
            _cstatus(
                {
                    "terminated": {
                        "exitCode": 2,
                        "reason": "Error",
                        "startedAt": ts(NOW - 90),
                        "finishedAt": ts(NOW - 80),
                    }
                },
                name="fetch-dataset",
            )
        ],
    )
    return pod


def _evicted(pod: Pod) -> Pod:
    pod = ended(pod, 137)
    pod["status"].update(reason="Evicted", message="The node was low on resource: memory.")
    return pod


def _unknown(pod: Pod) -> Pod:
    pod = running(pod)
    pod["status"]["phase"] = "Unknown"
    return pod


def _other_gate(pod: Pod) -> Pod:
    pod = ungated(pod)
    pod["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    return pod


@pytest.mark.parametrize(
    ("make", "phase", "node", "exit_code", "reason"),
    [
        (lambda p: p, ReplicaPhase.GATED, "", None, "SchedulingGated"),
        (ungated, ReplicaPhase.PENDING, "", None, "Unschedulable"),
        (_other_gate, ReplicaPhase.PENDING, "", None, "Unschedulable"),
        (bound, ReplicaPhase.BOUND, "node-0008", None, "ContainerCreating"),
        (running, ReplicaPhase.RUNNING, "node-0008", None, ""),
        (lambda p: ended(p, 0), ReplicaPhase.SUCCEEDED, "node-0008", 0, "Completed"),
        (lambda p: ended(p, 1), ReplicaPhase.FAILED, "node-0008", 1, "Error"),
        (lambda p: ended(p, 137, reason="OOMKilled"), ReplicaPhase.FAILED, "node-0008", 137, "OOMKilled"),
        (_evicted, ReplicaPhase.FAILED, "node-0008", 137, "Evicted"),
        (_unknown, ReplicaPhase.UNKNOWN, "node-0008", None, ""),
        (_sidecar_crashed, ReplicaPhase.RUNNING, "node-0008", None, ""),  # never a sidecar's exit code
        (_init_failed, ReplicaPhase.FAILED, "node-0008", 2, "Error"),
    ],
)
def test_replica_views(
    make: Callable[[Pod], Pod], phase: ReplicaPhase, node: str, exit_code: int | None, reason: str
) -> None:
    first, second = replica_views(PLAIN, [A, make(B)], CONFIG)
    assert (first.pod_set, first.index, first.phase) == ("workers", 0, ReplicaPhase.GATED)
    assert (second.index, second.pod, second.phase) == (1, B["metadata"]["name"], phase)
    assert (second.node, second.exit_code, second.reason, second.restarts) == (node, exit_code, reason, 0)


def test_replica_times_and_absent_replicas() -> None:
    (absent, done) = replica_views(PLAIN, [ended(B, 0, at=NOW - 60)], CONFIG)
    assert (absent.phase, absent.pod, absent.node) == (ReplicaPhase.ABSENT, "", "")
    assert (done.start_time, done.finish_time) == (T0 + 300, NOW - 60)


def test_replica_messages_are_cut_at_one_kib_without_splitting_a_character() -> None:
    (_, failed) = replica_views(PLAIN, [A, ended(B, 1, message="é" * 3000)], CONFIG)
    assert len(failed.message.encode()) <= MESSAGE_LIMIT and failed.message == "é" * (MESSAGE_LIMIT // 2)


def test_the_live_pod_of_an_index_is_reported_else_the_newest() -> None:
    old = deleted(running(B))
    new = copy.deepcopy(B)
    new["metadata"].update(
        name="train-42-3-workers-1-q9w8e", uid="6d1f0c3a-0000-4000-8000-0000000000ff", creationTimestamp=ts(NOW - 5)
    )
    assert replica_views(PLAIN, [A, new, old], CONFIG)[1].pod == "train-42-3-workers-1-q9w8e"
    assert replica_views(PLAIN, [A, old, ended(new, 1)], CONFIG)[1].pod == "train-42-3-workers-1-q9w8e"
    stranger = copy.deepcopy(new)
    stranger["metadata"]["labels"]["tandem.dev/attempt"] = "2"  # another attempt's pod is not this replica
    assert replica_views(PLAIN, [A, stranger], CONFIG)[1].phase is ReplicaPhase.ABSENT


# ----------------------------------------------------------------------------------------- the A-5 table

PULL_BOUND = CONFIG.image_pull_failure_s


def _disrupted_row(reason: str) -> Callable[[], dict[str, Any]]:
    return lambda: dict(pods=[running(A), disrupted(ended(B, 137), reason)])


def _pull_row(reason: str) -> Callable[[], dict[str, Any]]:
    return lambda: dict(
        pods=[running(A), bound(B, waiting=reason, message="not found")],
        first_seen={B["metadata"]["uid"]: NOW - PULL_BOUND},
    )


ROWS: dict[str, tuple[Callable[[], dict[str, Any]], Outcome | None, int | None, str]] = {
    "main container exits non-zero": (
        lambda: dict(pods=[running(A), ended(B, 1)]),
        Outcome.APP_FAILED,
        1,
        "exited with code 1",
    ),
    "OOMKilled": (
        lambda: dict(pods=[running(A), ended(B, 137, reason="OOMKilled")]),
        Outcome.APP_FAILED,
        137,
        "OOMKilled",
    ),
    "regular init container fails": (
        lambda: dict(pods=[running(A), _init_failed(B)]),
        Outcome.APP_FAILED,
        2,
        "fetch-dataset",
    ),
    "a native sidecar crashing is no failure": (lambda: dict(pods=[running(A), _sidecar_crashed(B)]), None, None, ""),
    "preempted by the scheduler": (
        lambda: dict(pods=[running(A), deleted(disrupted(ended(B, 143), "PreemptionByScheduler"))]),
        Outcome.PREEMPTED,
        None,
        "preempted",
    ),
    **{
        f"disrupted: {reason}": (_disrupted_row(reason), Outcome.INFRA_FAILED, None, reason)
        for reason in ("DeletionByTaintManager", "EvictionByEvictionAPI", "DeletionByPodGC", "TerminationByKubelet")
    },
    "node gone": (
        lambda: dict(pods=[running(A), running(B)], nodes=frozenset({"node-0007"})),
        Outcome.INFRA_FAILED,
        None,
        "node node-0008 is gone",
    ),
    "node NotReady past the bound": (
        lambda: dict(pods=[running(A), running(B)], not_ready_since={"node-0008": NOW - 61}),
        Outcome.INFRA_FAILED,
        None,
        "NotReady for 61 s",
    ),
    "node NotReady within the bound": (
        lambda: dict(pods=[running(A), running(B)], not_ready_since={"node-0008": NOW - 30}),
        None,
        None,
        "",
    ),
    "kubelet refused the pod": (
        lambda: dict(pods=[running(A), _kubelet_refused(B)]),
        Outcome.INFRA_FAILED,
        None,
        "UnexpectedAdmissionError",
    ),
    **{
        f"{reason} past the bound": (
            _pull_row(reason),
            Outcome.APP_FAILED,
            None,
            f"configuration: replica workers-1 (pod {B['metadata']['name']}): container trainer",
        )
        for reason in ("ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "InvalidImageName")
    },
    "image pull error, no memory: timed from the pod's start": (
        lambda: dict(pods=[running(A), bound(B, waiting="ErrImagePull")]),
        Outcome.APP_FAILED,
        None,
        "for 3530 s",
    ),
    "image pull error within the bound": (
        lambda: dict(pods=[running(A), bound(B, waiting="ErrImagePull")], first_seen={B["metadata"]["uid"]: NOW - 10}),
        None,
        None,
        "",
    ),
    "Job DeadlineExceeded, pods being deleted": (
        lambda: dict(pods=[deleted(running(A)), deleted(running(B))], jobs=[server_job(PLAIN, 0, DEADLINE)]),
        Outcome.APP_FAILED,
        None,
        "max runtime exceeded",
    ),
    "Job deadline passed, condition not seen yet": (
        lambda: dict(pods=[deleted(running(A)), running(B)], jobs=[server_job(PLAIN, 0, deadline_s=3500)]),
        Outcome.APP_FAILED,
        None,
        "max runtime exceeded: Job train-42-3-workers passed its activeDeadlineSeconds",
    ),
    "gated pod deleted by someone else": (
        lambda: dict(pods=[A, deleted(B)]),
        Outcome.INFRA_FAILED,
        None,
        "pod deleted while gated",
    ),
    "gated pod deleted by the agent": (lambda: dict(pods=[A, deleted(B)], deleted_by_agent=True), None, None, ""),
    "an app exit with a node gone elsewhere is the node's fault": (
        lambda: dict(pods=[ended(A, 1), running(B)], nodes=frozenset({"node-0008"})),
        Outcome.INFRA_FAILED,
        None,
        "gone",
    ),
    "the first app exit, then the Job's teardown": (
        lambda: dict(
            pods=[ended(A, 1, at=NOW - 60), deleted(ended(B, 143, at=NOW - 30), asked=NOW - 59)],
            jobs=[server_job(PLAIN, 0, BACKOFF)],
        ),
        Outcome.APP_FAILED,
        1,
        "replica workers-0",
    ),
    "a pod deleted by a user, then its peer exits": (
        lambda: dict(pods=[ended(A, 1, at=NOW - 50), deleted(running(B), asked=NOW - 55)]),
        Outcome.INFRA_FAILED,
        None,
        "pod deleted while running",
    ),
    "the Job failed and no pod says why": (
        lambda: dict(pods=[], jobs=[server_job(PLAIN, 0, BACKOFF)]),
        Outcome.INFRA_FAILED,
        None,
        "job failed: Job train-42-3-workers (BackoffLimitExceeded)",
    ),
}


def _kubelet_refused(pod: Pod) -> Pod:
    pod = bound(pod)
    pod["status"].update(
        phase="Failed",
        reason="UnexpectedAdmissionError",
        containerStatuses=[],
        message="Allocate failed due to requested number of devices unavailable for nvidia.com/gpu",
    )
    return pod


@pytest.mark.parametrize(("case", "outcome", "exit_code", "message"), list(ROWS.values()), ids=list(ROWS))
def test_the_a5_classification_table(
    case: Callable[[], dict[str, Any]], outcome: Outcome | None, exit_code: int | None, message: str
) -> None:
    kw = case()
    v = view(kw.pop("pods"), jobs=kw.pop("jobs", None), **kw)
    assert (v.outcome, v.exit_code) == (outcome, exit_code), v.message
    assert (v.phase is WorkloadPhase.FAILED) == (outcome is not None)
    assert message in v.message


def test_image_pull_errors_are_timed_from_their_first_sighting() -> None:
    stuck = [running(A), bound(B, waiting="ImagePullBackOff", message="Back-off pulling image")]
    first = view(stuck, first_seen={})
    assert (first.phase, dict(first.first_seen)) == (WorkloadPhase.STARTING, {B["metadata"]["uid"]: NOW})
    later = attempt_view(PLAIN, stuck, [], NODES, CONFIG, now=NOW + PULL_BOUND, first_seen=first.first_seen)
    assert (later.outcome, dict(later.first_seen)) == (Outcome.APP_FAILED, {B["metadata"]["uid"]: NOW})
    assert "for 120 s (ImagePullBackOff): Back-off pulling image" in later.message
    cleared = view([running(A), running(B)], first_seen=first.first_seen)
    assert (cleared.phase, dict(cleared.first_seen)) == (WorkloadPhase.RUNNING, {})


# ----------------------------------------------------------------------------------------- phases


def _mpi(launcher: Callable[[Pod], Pod], worker: Callable[[Pod], Pod]) -> list[Pod]:
    first, *workers = gated_pods(MPI)
    return [launcher(first), *(worker(w) for w in workers)]


PHASES: dict[str, tuple[Callable[[], dict[str, Any]], WorkloadPhase, str]] = {
    "no pod yet": (lambda: dict(pods=[]), WorkloadPhase.CREATING, "0/2 pods exist"),
    "one pod yet": (lambda: dict(pods=[A]), WorkloadPhase.CREATING, "1/2 pods exist"),
    "all gated": (lambda: dict(pods=[A, B]), WorkloadPhase.GATED, "waiting for Start"),
    "ungating": (lambda: dict(pods=[ungated(A), B]), WorkloadPhase.STARTING, "0/2 replicas running"),
    "bound": (lambda: dict(pods=[running(A), bound(B)]), WorkloadPhase.STARTING, "1/2 replicas running"),
    "running": (lambda: dict(pods=[running(A), running(B)]), WorkloadPhase.RUNNING, "2 replicas running"),
    "one done, one running": (lambda: dict(pods=[ended(A, 0), running(B)]), WorkloadPhase.RUNNING, ""),
    "all succeeded": (lambda: dict(pods=[ended(A, 0), ended(B, 0)]), WorkloadPhase.SUCCEEDED, "succeeded"),
    "Job Complete, pods gone": (
        lambda: dict(pods=[], jobs=[server_job(PLAIN, 0, MET, COMPLETE)]),
        WorkloadPhase.SUCCEEDED,
        "",
    ),
    "Job SuccessCriteriaMet, pods terminating": (
        lambda: dict(pods=[ended(A, 0), deleted(running(B))], jobs=[server_job(PLAIN, 0, MET)]),
        WorkloadPhase.SUCCEEDED,
        "",
    ),
    "MPI launcher done, workers torn down": (
        lambda: dict(o=MPI, pods=_mpi(lambda p: ended(p, 0), lambda p: deleted(ended(p, 143)))),
        WorkloadPhase.SUCCEEDED,
        "",
    ),
    "MPI workers running, launcher gated": (
        lambda: dict(o=MPI, pods=_mpi(lambda p: p, running)),
        WorkloadPhase.STARTING,
        "",
    ),
    "MPI workers done, launcher running": (
        lambda: dict(o=MPI, pods=_mpi(running, lambda p: ended(p, 0))),
        WorkloadPhase.RUNNING,
        "",
    ),
}


@pytest.mark.parametrize(("case", "phase", "message"), list(PHASES.values()), ids=list(PHASES))
def test_attempt_phases(case: Callable[[], dict[str, Any]], phase: WorkloadPhase, message: str) -> None:
    kw = case()
    o = kw.pop("o", PLAIN)
    v = view(kw.pop("pods"), o, kw.pop("jobs", None))
    assert v.phase is phase, v.message
    assert message in v.message
    assert v.outcome is (Outcome.SUCCEEDED if phase is WorkloadPhase.SUCCEEDED else None)
    assert len(v.replicas) == o.total_replicas


# ----------------------------------------------------------------------------------------- scheduling feedback

UNSCHEDULABLE = (
    "0/12 nodes are available: 1 rack r7 holds 6 free GPUs for gang train-42, needs 8, "
    "11 node(s) didn't match Pod's node affinity/selector."
)


def _scheduled(pod: Pod) -> Pod:
    pod = ungated(pod)
    pod["status"]["conditions"][0]["status"] = "True"
    pod["status"]["conditions"][0].pop("reason")
    return pod


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: ungated(p, UNSCHEDULABLE), [("workers", 1, "Unschedulable", UNSCHEDULABLE)]),
        (lambda p: p, []),  # SchedulingGated is not a verdict
        (_other_gate, []),  # still gated by another controller: kube-scheduler has not judged it
        (bound, []),
        (_scheduled, []),
        (lambda p: deleted(ungated(p)), []),
    ],
)
def test_scheduling_feedback_is_kube_schedulers_verdict_on_ungated_unbound_pods(
    make: Callable[[Pod], Pod], expected: list[tuple[str, int, str, str]]
) -> None:
    got = scheduling_feedback([A, make(B)])
    assert [(f.pod_set, f.index, f.reason, f.message) for f in got] == expected
    assert all(f.pod == B["metadata"]["name"] for f in got)


def test_scheduling_feedback_goes_to_the_broker_stamped_when_seen() -> None:
    [verdict] = scheduling_feedback([A, ungated(B, UNSCHEDULABLE)])
    msg = wire.scheduling_feedback(("j1", 3), [verdict], NOW)
    [p] = msg.pods
    assert (p.attempt.job_id, p.attempt.attempt) == ("j1", 3)
    assert (p.pod_set, p.index, p.pod_name, p.reason, p.message) == (
        "workers",
        1,
        B["metadata"]["name"],
        "Unschedulable",
        UNSCHEDULABLE,
    )
    assert p.time.ToDatetime(dt.UTC).timestamp() == pytest.approx(NOW)  # not the condition's time, an hour old


# ----------------------------------------------------------------------------------------- pins at Start


def pinned(pod: Pod, node: str | None = None) -> Pod:
    return apply_patch(pod, pin_patch(pod, node or _node(pod)))


PINS: dict[str, tuple[Callable[[], list[Pod]], int, int, int, int]] = {
    # pods, need_pin, wrong, missing, problems
    "fresh gang": (lambda: [A, B], 2, 0, 0, 0),
    "half pinned": (lambda: [pinned(A), B], 1, 0, 0, 0),
    "all pinned": (lambda: [pinned(A), pinned(B)], 0, 0, 0, 0),
    "pinned elsewhere": (lambda: [pinned(A), pinned(B, "node-0099")], 0, 1, 0, 1),
    "a pod missing": (lambda: [pinned(A)], 0, 0, 1, 0),
    "gate lifted before Start": (lambda: [pinned(A), ungated(pinned(B))], 0, 0, 0, 1),
    "a pod terminating": (lambda: [pinned(A), deleted(pinned(B))], 0, 0, 0, 1),
}


@pytest.mark.parametrize(("pods", "need", "wrong", "missing", "problems"), list(PINS.values()), ids=list(PINS))
def test_pin_state_and_ready_to_start(
    pods: Callable[[], list[Pod]], need: int, wrong: int, missing: int, problems: int
) -> None:
    state = pin_state(pods(), PLAIN, CONFIG)
    counts = (len(state.need_pin), len(state.wrong), len(state.missing), len(state.problems))
    assert counts == (need, wrong, missing, problems)
    assert state.ready_to_start is (need == wrong == missing == problems == 0)
    assert (state.problem == "") is state.ready_to_start
    assert pin_state(pods(), PLAIN) == state  # the caller's pods are the attempt's: labels need no config


def test_applying_the_needed_pins_makes_the_gang_ready() -> None:
    pods = {p["metadata"]["name"]: p for p in (A, B)}
    state = pin_state(pods.values(), PLAIN, CONFIG)
    assert [(t.index, t.node) for t in state.need_pin] == [(0, "node-0007"), (1, "node-0008")]
    assert state.problem == "2 pod(s) not pinned yet"
    for pod, node in state.to_pin:
        pods[pod["metadata"]["name"]] = apply_patch(dict(pod), pin_patch(pod, node))
    assert pin_state(pods.values(), PLAIN, CONFIG).ready_to_start


def test_the_problem_at_start_names_what_is_wrong() -> None:
    state = pin_state([pinned(A, "node-0099")], PLAIN, CONFIG)
    name = A["metadata"]["name"]
    assert state.problem == (
        f"replica workers-0 (pod {name}) is pinned to node-0099, assigned node-0007; 1 pod(s) missing: workers-1"
    )


def test_pin_state_of_one_start_group() -> None:
    launcher, *workers = gated_pods(MPI)
    pods = [pinned(w, node) for w, node in zip(workers, ("node-0007", "node-0008"))]
    workers_first, launcher_last = RENDERER.start_groups(MPI)
    assert pin_state(pods, MPI, CONFIG, workers_first).ready_to_start
    assert pin_state(pods, MPI, CONFIG, launcher_last).missing == (("launcher", 0),)
    assert not pin_state(pods, MPI, CONFIG).ready_to_start
