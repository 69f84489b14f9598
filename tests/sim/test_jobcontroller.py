"""The Job controller stand-in: pod rendering and sync decisions as tables; whole Jobs against the fake API server."""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sim import jobpods as jp
from sim import kuberesources as kr
from sim.cluster import SimCluster, eventually
from sim.informer import Informer
from sim.jobsync import condition, plan_job
from sim.kubeclient import KubeClient
from tests.fixtures import fixture_json

JSON = dict[str, Any]
NOW = 1_800_000_000.0
UID = "0b5f3c1e-9d7a-4c55-8f1e-2a6b8c9d0e11"


def job(
    name: str = "train-42-1-workers",
    *,
    completions: int = 3,
    parallelism: int | None = None,
    backoff_limit: int = 0,
    replace_failed: bool = True,
    suspend: bool = False,
    deadline: int | None = None,
    indexed: bool = True,
    status: JSON | None = None,
) -> JSON:
    spec: JSON = {
        "completions": completions,
        "parallelism": completions if parallelism is None else parallelism,
        "backoffLimit": backoff_limit,
        "suspend": suspend,
        "template": {
            "metadata": {
                "labels": {
                    "tandem.dev/job": "train-42",
                    "batch.kubernetes.io/controller-uid": UID,
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": UID,
                    "job-name": name,
                }
            },
            "spec": {
                "restartPolicy": "Never",
                "subdomain": "train-42-1",
                "schedulerName": "tandem-scheduler",
                "schedulingGates": [{"name": "tandem.dev/placement"}],
                "containers": [
                    {
                        "name": "trainer",
                        "image": "nvcr.io/nvidia/pytorch:25.10-py3",
                        "env": [{"name": "WORLD_SIZE", "value": "3"}],
                    }
                ],
                "initContainers": [{"name": "fetch", "image": "busybox"}],
            },
        },
    }
    if indexed:
        spec["completionMode"] = "Indexed"
    if replace_failed:
        spec["podReplacementPolicy"] = "Failed"
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "team-a", "uid": UID, "resourceVersion": "10"},
        "spec": spec,
        "status": status or {},
    }


def pod_of(
    j: JSON,
    index: int,
    *,
    phase: str = "Pending",
    deleted: bool = False,
    finalizer: bool = True,
    ready: bool = False,
    uid: str | None = None,
) -> JSON:
    p = jp.render_pod(j, index)
    meta = p["metadata"]
    meta["name"] = meta.pop("generateName") + "abcde"
    meta["uid"] = uid or f"pod-{index}"
    if not finalizer:
        meta["finalizers"] = []
    if deleted:
        meta["deletionTimestamp"] = jp.format_time(NOW - 1)
    p["status"] = {"phase": phase}
    if ready:
        p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return p


def with_status(j: JSON, status: JSON) -> JSON:
    out = copy.deepcopy(j)
    out["status"] = status
    return out


def types(status: JSON) -> list[str]:
    return [c["type"] for c in status.get("conditions") or [] if c["status"] == "True"]


# ---- rendering ----------------------------------------------------------------------------------


def test_indexed_pod_is_rendered_like_the_upstream_controller() -> None:
    j = job()
    p = jp.render_pod(j, 2)
    meta, spec = p["metadata"], p["spec"]
    assert meta["generateName"] == "train-42-1-workers-2-"
    assert spec["hostname"] == "train-42-1-workers-2" and spec["subdomain"] == "train-42-1"
    assert meta["labels"]["batch.kubernetes.io/job-completion-index"] == "2"
    assert meta["annotations"]["batch.kubernetes.io/job-completion-index"] == "2"
    assert meta["labels"]["tandem.dev/job"] == "train-42"
    assert {meta["labels"][k] for k in ("batch.kubernetes.io/controller-uid", "controller-uid")} == {UID}
    assert meta["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": j["metadata"]["name"],
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert spec["schedulingGates"] == [{"name": "tandem.dev/placement"}]
    index_env = {
        "name": "JOB_COMPLETION_INDEX",
        "valueFrom": {
            "fieldRef": {
                "apiVersion": "v1",
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
            }
        },
    }
    for c in spec["containers"] + spec["initContainers"]:
        assert index_env in c["env"]
    assert {"name": "WORLD_SIZE", "value": "3"} in spec["containers"][0]["env"]
    assert "JOB_COMPLETION_INDEX" not in str(j["spec"]["template"])  # the Job itself is untouched


@pytest.mark.parametrize(
    "name, index, want",
    [
        ("short", 7, "short-7-"),
        ("a" * 60, 12, "a" * 54 + "-12-"),  # cut so that the server's 5 random characters keep it within 63
        ("j", None, "j-"),
    ],
)
def test_generate_name(name: str, index: int | None, want: str) -> None:
    assert jp.generate_name(name, index) == want
    assert len(want) <= 58


@pytest.mark.parametrize(
    "indexes, text",
    [
        ([], ""),
        ([0], "0"),
        ([0, 1], "0,1"),
        ([0, 1, 2], "0-2"),
        ([5, 0, 1, 2, 7, 8, 9], "0-2,5,7-9"),
    ],
)
def test_completed_indexes_format_round_trips(indexes: list[int], text: str) -> None:
    assert jp.format_intervals(indexes) == text
    assert jp.parse_intervals(text) == set(indexes)


# ---- sync decisions -----------------------------------------------------------------------------


def test_a_new_indexed_job_creates_every_index_and_starts_its_clock() -> None:
    plan = plan_job(job(), [], NOW)
    assert plan.create == [0, 1, 2]
    assert plan.status == {
        "startTime": jp.format_time(NOW),
        "active": 3,
        "ready": 0,
        "terminating": 0,
        "uncountedTerminatedPods": {},
    }


def test_parallelism_limits_creation_and_missing_indexes_are_filled_first() -> None:
    j = job(completions=4, parallelism=2)
    assert plan_job(j, [], NOW).create == [0, 1]
    assert plan_job(j, [pod_of(j, 1)], NOW).create == [0]


def test_a_suspended_job_creates_nothing_and_has_no_start_time() -> None:
    plan = plan_job(job(suspend=True), [], NOW)
    assert plan.create == [] and "startTime" not in plan.status
    assert types(plan.status) == ["Suspended"]


def test_suspending_deletes_the_active_pods() -> None:
    j = job(suspend=True)
    pods = [pod_of(j, i) for i in range(3)]
    assert [p["metadata"]["uid"] for p in plan_job(j, pods, NOW).delete] == ["pod-0", "pod-1", "pod-2"]


def test_a_terminating_pod_holds_its_slot_and_is_not_failed_before_phase_failed() -> None:
    j = job()
    pods = [pod_of(j, 0, deleted=True), pod_of(j, 1), pod_of(j, 2)]
    plan = plan_job(j, pods, NOW)
    assert plan.create == [] and plan.delete == [] and plan.remove_finalizers == []
    assert plan.status["terminating"] == 1 and plan.status["active"] == 2
    assert "failed" not in plan.status and types(plan.status) == []


def test_without_the_replacement_policy_a_deleted_pod_fails_at_once() -> None:
    j = job(replace_failed=False)
    plan = plan_job(j, [pod_of(j, 0, deleted=True), pod_of(j, 1), pod_of(j, 2)], NOW)
    assert types(plan.status) == ["FailureTarget"]
    assert plan.status["uncountedTerminatedPods"] == {"failed": ["pod-0", "pod-1", "pod-2"]}


def test_backoff_limit_zero_the_first_failure_fails_the_job_in_three_steps() -> None:
    j = job()
    pods = [pod_of(j, 0, phase="Failed", deleted=True), pod_of(j, 1, phase="Running", ready=True), pod_of(j, 2)]
    # 1: FailureTarget, the other pods deleted, all counted failed through uncountedTerminatedPods
    first = plan_job(j, pods, NOW)
    ft = condition(first.status, "FailureTarget")
    assert ft is not None and (ft["reason"], ft["message"]) == (
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    assert [p["metadata"]["uid"] for p in first.delete] == ["pod-1", "pod-2"]
    assert {p["metadata"]["uid"] for p in first.remove_finalizers} == {"pod-0", "pod-1", "pod-2"}
    assert first.status["uncountedTerminatedPods"] == {"failed": ["pod-0", "pod-1", "pod-2"]}
    assert first.status["terminating"] == 2 and "active" not in first.status
    assert "Failed" not in types(first.status)
    # 2: the finalizers are gone, the counts move; pod-1 still terminates, so no Failed yet
    j2 = with_status(j, first.status)
    pods2 = [
        pod_of(j, 0, phase="Failed", deleted=True, finalizer=False),
        pod_of(j, 1, phase="Running", deleted=True, finalizer=False),
    ]
    second = plan_job(j2, pods2, NOW + 1)
    assert second.status["failed"] == 3 and second.status["uncountedTerminatedPods"] == {}
    assert second.status["terminating"] == 1 and types(second.status) == ["FailureTarget"]
    # 3: every pod has terminated: Failed, with the FailureTarget's reason
    third = plan_job(
        with_status(j, second.status), [pod_of(j, 0, phase="Failed", deleted=True, finalizer=False)], NOW + 2
    )
    assert types(third.status) == ["FailureTarget", "Failed"]
    failed = condition(third.status, "Failed")
    assert failed is not None and failed["reason"] == "BackoffLimitExceeded"
    assert third.create == []


def test_finalizer_removals_in_flight_are_never_counted_twice() -> None:
    j = job()
    pods = [pod_of(j, 0, phase="Failed"), pod_of(j, 1), pod_of(j, 2)]
    first = plan_job(j, pods, NOW)
    # the status was written, the removals issued, but the cache still shows the finalizers
    second = plan_job(with_status(j, first.status), pods, NOW, finalizers_removed={"pod-0", "pod-1", "pod-2"})
    assert second.status["failed"] == 3
    third = plan_job(with_status(j, second.status), pods, NOW, finalizers_removed={"pod-0", "pod-1", "pod-2"})
    assert third.status["failed"] == 3


def test_all_indexes_succeeded_gives_success_criteria_met_then_complete() -> None:
    j = job()
    pods = [pod_of(j, i, phase="Succeeded") for i in range(3)]
    first = plan_job(j, pods, NOW)
    assert first.status["completedIndexes"] == "0-2" and first.status["succeeded"] == 3
    sc = condition(first.status, "SuccessCriteriaMet")
    assert sc is not None and sc["reason"] == "CompletionsReached"
    assert {p["metadata"]["uid"] for p in first.remove_finalizers} == {"pod-0", "pod-1", "pod-2"}
    done = [pod_of(j, i, phase="Succeeded", finalizer=False) for i in range(3)]
    second = plan_job(with_status(j, first.status), done, NOW + 1)
    assert types(second.status) == ["SuccessCriteriaMet", "Complete"]
    assert second.status["completionTime"] == jp.format_time(NOW + 1)
    assert second.status["succeeded"] == 3 and "active" not in second.status


def test_partial_success_keeps_running_and_records_the_index() -> None:
    j = job()
    pods = [pod_of(j, 0, phase="Succeeded"), pod_of(j, 1, phase="Running"), pod_of(j, 2, phase="Running")]
    plan = plan_job(j, pods, NOW)
    assert plan.status["completedIndexes"] == "0" and plan.status["active"] == 2 and types(plan.status) == []
    assert plan.create == []


def test_active_deadline_counts_from_start_time() -> None:
    j = job(deadline=60, status={"startTime": jp.format_time(NOW - 30)})
    running = [pod_of(j, i, phase="Running") for i in range(3)]
    early = plan_job(j, running, NOW)
    assert early.requeue_after_s == pytest.approx(30.0) and types(early.status) == []
    late = plan_job(j, running, NOW + 31)
    ft = condition(late.status, "FailureTarget")
    assert ft is not None and (ft["reason"], ft["message"]) == (
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    )
    assert len(late.delete) == 3


def test_duplicate_index_pods_are_reduced_to_one() -> None:
    j = job(completions=2)
    keep = pod_of(j, 0, phase="Running", ready=True, uid="keep")
    extra = pod_of(j, 0, uid="extra")
    plan = plan_job(j, [extra, keep, pod_of(j, 1)], NOW)
    assert [p["metadata"]["uid"] for p in plan.delete] == ["extra"] and plan.create == []


def test_after_a_failure_a_tolerant_job_waits_out_the_backoff_before_replacing() -> None:
    j = job(backoff_limit=3)
    pods = [pod_of(j, 0, phase="Failed", finalizer=False), pod_of(j, 1), pod_of(j, 2)]
    status = {"startTime": jp.format_time(NOW), "failed": 1, "uncountedTerminatedPods": {}}
    waiting = plan_job(with_status(j, status), pods, NOW, backoff_remaining_s=5.0)
    assert waiting.create == [] and waiting.requeue_after_s == 5.0
    assert plan_job(with_status(j, status), pods, NOW).create == [0]


def test_a_finished_job_only_releases_leftover_finalizers() -> None:
    j = job(status={"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]})
    leftover = pod_of(j, 0, phase="Failed")
    plan = plan_job(j, [leftover, pod_of(j, 1, finalizer=False)], NOW)
    assert plan.remove_finalizers == [leftover] and plan.create == [] and plan.delete == []


# ---- against the fake API server -----------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
NODES = [o for o in fixture_json("cluster.json")["items"] if o["kind"] == "Node"][:2]
GATE = "tandem.dev/placement"
POD_NAME = re.compile(r"^(?P<job>.+)-(?P<index>\d+)-[a-z0-9]{5}$")


def job_body(
    name: str,
    *,
    count: int = 2,
    gated: bool = False,
    suspend: bool = False,
    deadline: int | None = None,
    grace: int = 30,
) -> JSON:
    pod_spec: JSON = {
        "restartPolicy": "Never",
        "schedulerName": "tandem-scheduler",
        "priorityClassName": "tandem-gang",
        "subdomain": name,
        "terminationGracePeriodSeconds": grace,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "trainer",
                "image": "nvcr.io/nvidia/pytorch:25.10-py3",
                "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
            }
        ],
    }
    if gated:
        pod_spec["schedulingGates"] = [{"name": GATE}]
    spec: JSON = {
        "completionMode": "Indexed",
        "completions": count,
        "parallelism": count,
        "backoffLimit": 0,
        "podReplacementPolicy": "Failed",
        "suspend": suspend,
        "template": {"metadata": {"labels": {"tandem.dev/job": name}}, "spec": pod_spec},
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "team-a"}, "spec": spec}


class Recorded:
    """Every version of the namespace's Jobs and Pods the API server sent, in order."""

    def __init__(self, client: KubeClient) -> None:
        self.jobs = Informer(client, kr.JOBS, namespace="team-a")
        self.pods = Informer(client, kr.PODS, namespace="team-a")
        self.job_versions: list[JSON] = []
        self.pod_uids: set[str] = set()
        self.last_pod_version: dict[str, JSON] = {}
        self.jobs.add_handler(self._job)
        self.pods.add_handler(self._pod)
        self._tasks: list[asyncio.Task[None]] = []

    def _job(self, old: JSON | None, new: JSON | None) -> None:
        if new is not None:
            self.job_versions.append(new)

    def _pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        self.pod_uids.add(obj["metadata"]["uid"])
        self.last_pod_version[obj["metadata"]["name"]] = obj

    async def __aenter__(self) -> Recorded:
        self._tasks = [asyncio.create_task(self.jobs.run()), asyncio.create_task(self.pods.run())]
        await self.jobs.synced.wait()
        await self.pods.synced.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self._tasks:
            t.cancel()

    def statuses(self, name: str) -> list[JSON]:
        return [j.get("status") or {} for j in self.job_versions if j["metadata"]["name"] == name]

    def job(self, name: str) -> JSON:
        return self.jobs.store.get(f"team-a/{name}") or {}

    def pods_of(self, name: str) -> list[JSON]:
        return sorted(
            (
                p
                for p in self.pods.store.values()
                if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == name
            ),
            key=lambda p: p["metadata"]["name"],
        )


@pytest.fixture
async def sim() -> AsyncIterator[tuple[SimCluster, Recorded]]:
    async with SimCluster(NODES, manifests=REPO / "manifests", heartbeat_interval_s=60.0) as c:
        await c.create_namespace("team-a")
        assert c.admin is not None
        async with Recorded(c.admin) as rec:
            yield c, rec


def has(status: JSON, ctype: str) -> bool:
    return condition(status, ctype) is not None


async def test_an_indexed_job_with_a_gate_creates_gated_pods_named_by_index(sim: tuple[SimCluster, Recorded]) -> None:
    c, rec = sim
    assert c.admin is not None
    made = await c.admin.create(kr.JOBS, job_body("train-42-1-workers", count=3, gated=True))

    async def three_active() -> bool:
        return (
            len(rec.pods_of("train-42-1-workers")) == 3
            and rec.job("train-42-1-workers").get("status", {}).get("active") == 3
        )

    await eventually(three_active)
    uid = made["metadata"]["uid"]
    indexes = []
    for p in rec.pods_of("train-42-1-workers"):
        meta, spec = p["metadata"], p["spec"]
        m = POD_NAME.match(meta["name"])
        assert m is not None and m["job"] == "train-42-1-workers"
        index = m["index"]
        indexes.append(index)
        assert spec["hostname"] == f"train-42-1-workers-{index}" and spec["subdomain"] == "train-42-1-workers"
        assert meta["labels"]["batch.kubernetes.io/job-completion-index"] == index
        assert meta["annotations"]["batch.kubernetes.io/job-completion-index"] == index
        assert meta["labels"]["batch.kubernetes.io/controller-uid"] == uid and meta["labels"]["controller-uid"] == uid
        assert meta["labels"]["job-name"] == meta["labels"]["tandem.dev/job"] == "train-42-1-workers"
        assert meta["finalizers"] == ["batch.kubernetes.io/job-tracking"]
        assert meta["ownerReferences"][0] == {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train-42-1-workers",
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert (
            env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
            == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        )
        assert spec["schedulingGates"] == [{"name": GATE}] and "nodeName" not in spec
    assert sorted(indexes) == ["0", "1", "2"]
    assert rec.job("train-42-1-workers")["status"]["startTime"]


async def test_pods_deleted_before_running_fail_the_job_with_failure_target_first(
    sim: tuple[SimCluster, Recorded],
) -> None:
    c, rec = sim
    assert c.admin is not None
    await c.admin.create(kr.JOBS, job_body("gang", count=2, gated=True))

    async def two_pods() -> list[JSON]:
        pods = rec.pods_of("gang")
        return pods if len(pods) == 2 else []

    first = (await eventually(two_pods))[0]
    await c.admin.delete(kr.PODS, first["metadata"]["name"], "team-a")

    async def failed() -> bool:
        return has(rec.job("gang").get("status") or {}, "Failed")

    await eventually(failed)
    statuses = rec.statuses("gang")
    target_first = [s for s in statuses if has(s, "FailureTarget") and not has(s, "Failed")]
    assert target_first, "FailureTarget must be written before Failed"
    final = rec.job("gang")["status"]
    reason = condition(final, "Failed")
    assert reason is not None and reason["reason"] == "BackoffLimitExceeded"
    assert final["failed"] == 2 and final.get("terminating") == 0 and "active" not in final

    async def pods_gone() -> bool:
        return rec.pods_of("gang") == []

    await eventually(pods_gone)
    assert len(rec.pod_uids) == 2  # nothing was ever replaced
    deleted = rec.last_pod_version[first["metadata"]["name"]]
    assert deleted["status"]["phase"] == "Failed"  # marked by PodGC before the finalizer went


async def test_completion_is_success_criteria_met_then_complete(sim: tuple[SimCluster, Recorded]) -> None:
    c, rec = sim
    assert c.admin is not None and c.kubelet is not None
    await c.admin.create(kr.JOBS, job_body("done", count=2))

    async def running() -> list[JSON]:
        pods = rec.pods_of("done")
        return pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else []

    for p in await eventually(running):
        await c.kubelet.complete("team-a", p["metadata"]["name"], exit_code=0)

    async def complete() -> bool:
        return has(rec.job("done").get("status") or {}, "Complete")

    await eventually(complete)
    final = rec.job("done")["status"]
    assert final["succeeded"] == 2 and final["completedIndexes"] == "0,1" and final["completionTime"]
    assert [s for s in rec.statuses("done") if has(s, "SuccessCriteriaMet") and not has(s, "Complete")]
    for p in rec.pods_of("done"):
        assert p["status"]["phase"] == "Succeeded" and "batch.kubernetes.io/job-tracking" not in (
            p["metadata"].get("finalizers") or []
        )


async def test_a_failed_pod_fails_the_job_only_after_the_others_terminated(sim: tuple[SimCluster, Recorded]) -> None:
    c, rec = sim
    assert c.admin is not None and c.kubelet is not None
    c.kubelet.termination_delay_s = 0.5  # the surviving pod takes a while to stop
    await c.admin.create(kr.JOBS, job_body("crash", count=2))

    async def running() -> list[JSON]:
        pods = rec.pods_of("crash")
        return pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else []

    crashed, survivor = await eventually(running)
    await c.kubelet.complete("team-a", crashed["metadata"]["name"], exit_code=3)

    async def failed() -> bool:
        return has(rec.job("crash").get("status") or {}, "Failed")

    await eventually(failed)
    waiting = [
        s
        for s in rec.statuses("crash")
        if has(s, "FailureTarget") and not has(s, "Failed") and s.get("terminating") == 1
    ]
    assert waiting, "the Job must wait in FailureTarget while a pod terminates"
    final = rec.job("crash")["status"]
    assert final["failed"] == 2 and final["terminating"] == 0
    last = rec.last_pod_version[survivor["metadata"]["name"]]["status"]
    assert last["phase"] == "Failed" and last["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


async def test_active_deadline_fails_the_job(sim: tuple[SimCluster, Recorded]) -> None:
    c, rec = sim
    assert c.admin is not None
    await c.admin.create(kr.JOBS, job_body("slow", count=1, deadline=1))

    async def failed() -> JSON | None:
        return condition(rec.job("slow").get("status") or {}, "Failed")

    reason = await eventually(failed)
    assert reason is not None and (reason["reason"], reason["message"]) == (
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    )
    assert [s for s in rec.statuses("slow") if has(s, "FailureTarget") and not has(s, "Failed")]


async def test_a_suspended_job_creates_no_pods_until_resumed(sim: tuple[SimCluster, Recorded]) -> None:
    c, rec = sim
    assert c.admin is not None
    await c.admin.create(kr.JOBS, job_body("later", count=2, suspend=True))

    async def suspended() -> bool:
        return has(rec.job("later").get("status") or {}, "Suspended")

    await eventually(suspended)
    assert rec.pods_of("later") == [] and "startTime" not in rec.job("later")["status"]
    await c.admin.patch(kr.JOBS, "later", {"spec": {"suspend": False}}, patch_type="merge", namespace="team-a")

    async def resumed() -> bool:
        st = rec.job("later").get("status") or {}
        return len(rec.pods_of("later")) == 2 and bool(st.get("startTime")) and not has(st, "Suspended")

    await eventually(resumed)
    cond = next(x for x in rec.job("later")["status"]["conditions"] if x["type"] == "Suspended")
    assert (cond["status"], cond["reason"]) == ("False", "JobResumed")


@pytest.mark.parametrize("policy", ["Background", "Foreground"])
async def test_deleting_a_running_job_takes_its_pods_with_it(sim: tuple[SimCluster, Recorded], policy: str) -> None:
    c, rec = sim
    assert c.admin is not None
    await c.admin.create(kr.JOBS, job_body("bye", count=2))

    async def running() -> bool:
        pods = rec.pods_of("bye")
        return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

    await eventually(running)
    await c.admin.delete(kr.JOBS, "bye", "team-a", propagation_policy=policy)

    async def all_gone() -> bool:  # the kubelet finishes each deletion, the controller releases each finalizer
        return rec.pods_of("bye") == [] and not rec.job("bye")

    await eventually(all_gone)
    assert len(rec.pod_uids) == 2


async def test_a_non_indexed_job_counts_successes_through_uncounted_pods(sim: tuple[SimCluster, Recorded]) -> None:
    c, rec = sim
    assert c.admin is not None and c.kubelet is not None
    body = job_body("plain", count=2)
    del body["spec"]["completionMode"]
    await c.admin.create(kr.JOBS, body)

    async def running() -> list[JSON]:
        pods = rec.pods_of("plain")
        return pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else []

    pods = await eventually(running)
    assert all(re.fullmatch(r"plain-[a-z0-9]{5}", p["metadata"]["name"]) for p in pods)
    assert all("hostname" not in p["spec"] for p in pods)
    for p in pods:
        await c.kubelet.complete("team-a", p["metadata"]["name"])

    async def complete() -> bool:
        return has(rec.job("plain").get("status") or {}, "Complete")

    await eventually(complete)
    assert rec.job("plain")["status"]["succeeded"] == 2
    assert [s for s in rec.statuses("plain") if s.get("uncountedTerminatedPods", {}).get("succeeded")]
