"""The agent's renderer: the objects of an attempt (A-2, A-4, A-15, A-22, H-4), the pin and ungate patches (A-1, A-7)."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest

from extender.agent.config import AgentConfig
from extender.agent.model import INDEX_MAX, DeviceRequestSpec, NodeCount, Order, PodSetOrder, check_name_budget
from extender.agent.pods import admitted_shape_problem, json_pointer, pin_patch, pod_for_dry_run, ungate_patch
from extender.agent.podtemplate import GATE
from extender.agent.render import IndexedJobRenderer
from extender.podreq import INDEX_LABEL, pinned_node
from extender.reservations import parse_reservation
from placement.model import DraRequest, PodShape
from placement.podspec import shape_from_pod
from tests.fixtures import fixture_json

K8S_VERSION = "1.36.0"
NAMESPACE = "team-a"
CONFIG = AgentConfig(
    cluster_name="gpu-east-1", tenants={"research": [NAMESPACE]}, priority_classes={"high": "tandem-gang-high"}
)
RENDERER = IndexedJobRenderer(CONFIG)
NOW = 1_795_000_000.0
ZONE, BLOCK, RACK, CLIQUE, HOST = CONFIG.extender.topology.keys
TERMS = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")


# ----------------------------------------------------------------------------------------- builders


def template(gpus: int = 8, **spec: Any) -> dict[str, Any]:
    """A submitted PodTemplateSpec: the fixture's `want-4-h100` pod spec with `gpus` GPUs (it carries server
    defaults such as schedulerName, priority and preemptionPolicy, which the renderer must own)."""
    pod = next(p for p in fixture_json("pending-pods.json")["items"] if p["metadata"]["name"] == "want-4-h100")
    body = copy.deepcopy(pod["spec"])
    for kind in ("requests", "limits"):
        body["containers"][0]["resources"][kind].pop("nvidia.com/gpu")
        if gpus:
            body["containers"][0]["resources"][kind]["nvidia.com/gpu"] = str(gpus)
    body.update(spec)
    return {"metadata": {"labels": {"team": "vision"}}, "spec": body}


def shape_of(tpl: dict[str, Any]) -> PodShape:
    return shape_from_pod({"spec": tpl["spec"]})


def pod_set(
    name: str = "workers",
    nodes: tuple[tuple[str, int], ...] = (("node-0007", 1), ("node-0008", 1)),
    tpl: dict[str, Any] | None = None,
    **changes: Any,
) -> PodSetOrder:
    tpl = tpl or template()
    count = sum(n for _, n in nodes)
    shape = changes.pop("shape", None) or shape_of(tpl)
    return PodSetOrder(name, count, shape, tpl, tuple(NodeCount(node, n) for node, n in nodes), **changes)


def order(*pod_sets: PodSetOrder, **changes: Any) -> Order:
    base = Order(
        job_id="train-42",
        attempt=3,
        tenant="research",
        pod_sets=pod_sets or (pod_set(),),
        domain=("us-east-1a", "b1", "r7"),
        start_deadline=NOW + 600,
        dispatch_id="4f1c2d/train-42/3",
        job_set="llama-sweep",
        queue="research-main",
        rendezvous_port=29500,
    )
    return replace(base, **changes)


def render(o: Order | None = None) -> Any:
    return RENDERER.render(o or order(), NAMESPACE, now=NOW)


def pod_template(o: Order | None = None, i: int = 0) -> dict[str, Any]:
    tpl: dict[str, Any] = render(o).jobs[i]["spec"]["template"]
    return tpl


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def server_pod(
    job: dict[str, Any], index: int, *, rv: str = "4711", created: str = "2026-11-30T06:00:00Z"
) -> dict[str, Any]:
    """The pod the Job controller created for `index`, as the API server returns it right after creation."""
    pod = pod_for_dry_run(job, index)
    meta = pod["metadata"]
    meta.update(
        name=f"{meta['generateName']}x7k2p",
        uid=f"6d1f0c3a-0000-4000-8000-{index:012d}",
        resourceVersion=rv,
        creationTimestamp=created,
    )
    meta["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job["metadata"]["name"],
            "uid": "0b6e2b4c-5a7d-4e8f-9c1d-2e3f4a5b6c7d",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pod["spec"]["priority"] = 1000
    pod["status"] = {
        "phase": "Pending",
        "qosClass": "Burstable",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "lastProbeTime": None,
                "lastTransitionTime": created,
                "message": "Scheduling is blocked due to non-empty scheduling gates",
            }
        ],
    }
    return pod


class PatchFailed(Exception):
    """A `test` operation failed or a path does not exist (the API server answers 422)."""


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add / remove / test, strictly: a missing parent is an error, as on the real server."""
    out = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = out
        try:
            for p in parts[:-1]:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            last = parts[-1]
            if op["op"] == "test":
                if (parent[int(last)] if isinstance(parent, list) else parent[last]) != op["value"]:
                    raise PatchFailed(op["path"])
            elif op["op"] == "add" and isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            elif op["op"] == "add":
                parent[last] = op["value"]
            elif op["op"] == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            else:
                raise PatchFailed(f"unsupported op {op['op']}")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise PatchFailed(op["path"]) from e
    return out


# ----------------------------------------------------------------------------------------- names (A-2)

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
H200 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
LONG_JOB = "j" + "0123456789abcdefghijklmnopqrstuvwxyz012"  # 40 characters
LONG_SET = "workersabcde"  # 12 characters


def long_order() -> Order:
    dra = DeviceRequestSpec("gpus", "gpu.nvidia.com", (H200,), 4)
    return order(
        pod_set(LONG_SET, (("node-0007", 2),), device_requests=(dra,)),
        job_id=LONG_JOB,
        attempt=20,
        dispatch_id=f"4f1c2d/{LONG_JOB}/20",
    )


def _names(r: Any) -> list[tuple[str, str, re.Pattern[str], int]]:
    o = long_order()
    job = r.jobs[0]
    out = [
        ("Service", r.service["metadata"]["name"], DNS1035, 63),
        ("ConfigMap", r.reservation["metadata"]["name"], DNS1123_SUBDOMAIN, 253),
        ("Job", job["metadata"]["name"], DNS1123_LABEL, 63),  # its name is also the job-name label's value
        ("subdomain", job["spec"]["template"]["spec"]["subdomain"], DNS1035, 63),
        ("hostname", f"{job['metadata']['name']}-{INDEX_MAX}", DNS1123_LABEL, 63),
        ("generateName", pod_for_dry_run(job, 1)["metadata"]["generateName"] + "x7k2p", DNS1123_SUBDOMAIN, 63),
        ("rendezvous host", r.rendezvous.split(":")[0].split(".")[0], DNS1123_LABEL, 63),
    ]
    out += [("ResourceClaimTemplate", c["metadata"]["name"], DNS1123_SUBDOMAIN, 253) for c in r.claim_templates]
    labels = {**job["metadata"]["labels"], **job["spec"]["template"]["metadata"]["labels"]}
    out += [(f"label {k}", v, LABEL_VALUE, 63) for k, v in labels.items()]
    assert o.job_id == LONG_JOB and len(LONG_JOB) == 40 and len(LONG_SET) == 12
    return out


@pytest.mark.parametrize(
    ("kind", "name", "pattern", "limit"), _names(RENDERER.render(long_order(), NAMESPACE, now=NOW))
)
def test_the_name_budget_holds_for_the_longest_names(
    kind: str, name: str, pattern: re.Pattern[str], limit: int
) -> None:
    check_name_budget()
    assert len(name) <= limit, (kind, name, len(name))
    assert pattern.fullmatch(name), (kind, name)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (order(job_id="j" * 56), "hostname"),
        (order(pod_set("Workers")), "DNS-1035"),
        (order(pod_set(), pod_set()), "unique"),
        (order(rendezvous_port=0), "port"),
        (order(domain=("a", "b", "c", "d", "e", "f")), "levels"),
        (order(pod_set(tpl={"metadata": {}, "spec": {"containers": []}})), "no containers"),
        (order(replace(pod_set(), count=3)), "nodes hold 2 replicas, not 3"),
        (order(pod_set(device_requests=(DeviceRequestSpec("GPUs", "gpu.nvidia.com"),))), "device request"),
    ],
)
def test_orders_the_api_server_would_refuse_are_refused_before_anything_is_created(bad: Order, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        render(bad)


# ----------------------------------------------------------------------------------------- the pod template (H-4)

UNTRUSTED = template(
    schedulerName="default-scheduler",
    nodeName="node-0001",
    priorityClassName="system-node-critical",
    priority=2_000_000_000,
    preemptionPolicy="PreemptLowerPriority",
    hostname="evil",
    subdomain="other-svc",
    restartPolicy="Always",
    activeDeadlineSeconds=5,
    schedulingGates=[{"name": "example.com/hold"}],
    overhead={"cpu": "250m"},
    terminationGracePeriodSeconds=3600,
)
UNTRUSTED["metadata"] = {"name": "x", "namespace": "kube-system", "labels": {"tandem.dev/job": "someone-else"}}


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("schedulerName", "tandem-scheduler"),
        ("nodeName", None),
        ("priorityClassName", "tandem-gang"),
        ("priority", None),
        ("preemptionPolicy", None),
        ("hostname", None),  # the Job controller writes <job>-<index>
        ("subdomain", "train-42-3"),
        ("restartPolicy", "Never"),
        ("activeDeadlineSeconds", None),
        ("schedulingGates", [{"name": GATE}]),
        ("overhead", None),
        ("terminationGracePeriodSeconds", 45),
        ("tolerations", UNTRUSTED["spec"]["tolerations"]),  # kept: the broker judged them
        ("nodeSelector", UNTRUSTED["spec"]["nodeSelector"]),
    ],
)
def test_an_untrusted_template_loses_every_field_the_agent_owns(field: str, expected: Any) -> None:
    spec = pod_template(order(pod_set(tpl=UNTRUSTED), grace_s=44.5))["spec"]
    assert spec.get(field) == expected


@pytest.mark.parametrize(
    ("o", "expected"),
    [
        (order(), "tandem-gang"),
        (order(priority_band="high"), "tandem-gang-high"),
        (order(priority_band="high", preemptible=True), "tandem-gang-preemptible"),
    ],
)
def test_the_priority_class_follows_band_and_preemptibility(o: Order, expected: str) -> None:
    assert pod_template(o)["spec"]["priorityClassName"] == expected


def test_grace_falls_back_to_the_configured_default() -> None:
    assert pod_template(order())["spec"]["terminationGracePeriodSeconds"] == 30


RESERVED_TEMPLATE = template()
RESERVED_TEMPLATE["metadata"] = {
    "labels": {
        "tandem.dev/job": "someone-else",
        "kueue.x-k8s.io/queue-name": "q",
        "team": "vision",
        "batch.kubernetes.io/job-name": "x",
        "kubernetes.io/hostname": "h",
        "jobset.sigs.k8s.io/jobset-name": "j",
        "k8s.io/x": "y",
        "app.kubernetes.io/name": "trainer",
        "node.kubernetes.io/instance-type": "h100",
        "topology.k8s.io/zone": "z",
        "NODE.Kubernetes.IO/x": "y",
        "app.kubernetes.io/managed-by": "me",
        "x-k8s.io/team": "a",
    },
    "annotations": {"tandem.dev/dispatch": "forged", "kubectl.kubernetes.io/default-container": "trainer"},
}


@pytest.mark.parametrize(
    ("where", "key", "expected"),
    [
        ("labels", "tandem.dev/job", "train-42"),
        ("labels", "tandem.dev/attempt", "3"),
        ("labels", "tandem.dev/pod-set", "workers"),
        ("labels", "app.kubernetes.io/managed-by", "tandem"),
        ("labels", "kueue.x-k8s.io/queue-name", None),  # would hand the Job to Kueue, which suspends it
        ("labels", "batch.kubernetes.io/job-name", None),
        ("labels", "kubernetes.io/hostname", None),
        ("labels", "jobset.sigs.k8s.io/jobset-name", None),
        ("labels", "k8s.io/x", None),
        ("labels", "team", "vision"),
        ("labels", "app.kubernetes.io/name", "trainer"),
        ("labels", "owner", "alice"),  # order.labels
        ("labels", "tandem.dev/preemptible", None),
        ("annotations", "tandem.dev/dispatch", "4f1c2d/train-42/3"),
        ("annotations", "tandem.dev/job-set", "llama-sweep"),
        ("annotations", "tandem.dev/queue", "research-main"),
        ("annotations", "kubectl.kubernetes.io/default-container", "trainer"),
        ("labels", "node.kubernetes.io/instance-type", None),  # a subdomain of a reserved domain
        ("labels", "topology.k8s.io/zone", None),
        ("labels", "NODE.Kubernetes.IO/x", None),  # domains are case-insensitive
        ("labels", "x-k8s.io/team", "a"),  # not a subdomain of k8s.io
        ("annotations", "example.com/note", "hi"),  # order.annotations
    ],
)
def test_labels_and_annotations_drop_reserved_prefixes_and_carry_tandems(
    where: str, key: str, expected: str | None
) -> None:
    o = order(
        pod_set(tpl=RESERVED_TEMPLATE),
        labels={"owner": "alice", "tandem.dev/job": "x"},
        annotations={"example.com/note": "hi"},
    )
    assert pod_template(o)["metadata"][where].get(key) == expected


def test_every_object_names_the_dispatch_and_the_attempt() -> None:
    r = render()
    for obj in r.objects():
        meta = obj["metadata"]
        assert meta["annotations"]["tandem.dev/dispatch"] == "4f1c2d/train-42/3", obj["kind"]
        assert (meta["labels"]["tandem.dev/job"], meta["labels"]["tandem.dev/attempt"]) == ("train-42", "3")
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "tandem"
    assert [o["kind"] for o in r.objects()] == ["ConfigMap", "Service", "Job"]


def test_preemptible_attempts_label_their_pods() -> None:
    assert pod_template(order(preemptible=True))["metadata"]["labels"]["tandem.dev/preemptible"] == "true"


# ----------------------------------------------------------------------------------------- domain affinity

IN_RACK = {"key": RACK, "operator": "In", "values": ["r7"]}
DOMAIN = [
    {"key": ZONE, "operator": "In", "values": ["us-east-1a"]},
    {"key": BLOCK, "operator": "In", "values": ["b1"]},
    IN_RACK,
]
ARM = {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}
AMD = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
FIELD = {"key": "metadata.name", "operator": "NotIn", "values": ["node-0001"]}
PREFERRED = [{"weight": 10, "preference": {"matchExpressions": [ARM]}}]


def _with_affinity(affinity: dict[str, Any] | None) -> dict[str, Any]:
    return {"affinity": affinity} if affinity is not None else {}


def _affinity(*terms: dict[str, Any], preferred: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    if preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"nodeAffinity": node}


@pytest.mark.parametrize(
    ("affinity", "domain", "expected_terms"),
    [
        (None, ("us-east-1a", "b1", "r7"), [{"matchExpressions": DOMAIN}]),
        (_affinity({"matchExpressions": [ARM]}), ("us-east-1a", "b1", "r7"), [{"matchExpressions": [ARM, *DOMAIN]}]),
        (
            _affinity({"matchExpressions": [ARM]}, {"matchExpressions": [AMD], "matchFields": [FIELD]}),
            ("us-east-1a",),
            [{"matchExpressions": [ARM, DOMAIN[0]]}, {"matchExpressions": [AMD, DOMAIN[0]], "matchFields": [FIELD]}],
        ),
        (
            {"podAffinity": {}},
            ("us-east-1a", "", "r7"),
            [{"matchExpressions": [DOMAIN[0], {"key": BLOCK, "operator": "DoesNotExist"}, IN_RACK]}],
        ),
        (None, (), None),  # unconstrained: no term (the pin then creates the one term)
    ],
)
def test_domain_requirements_are_anded_into_every_required_term(
    affinity: dict[str, Any] | None, domain: tuple[str, ...], expected_terms: list[dict[str, Any]] | None
) -> None:
    tpl = template(**_with_affinity(affinity))
    spec = pod_template(order(pod_set(tpl=tpl), domain=domain))["spec"]
    terms = spec.get("affinity", {}).get("nodeAffinity", {}).get(TERMS[2], {}).get(TERMS[3])
    assert terms == expected_terms


def test_preferred_affinity_stays_as_the_template_had_it() -> None:
    tpl = template(affinity=_affinity({"matchExpressions": [ARM]}, preferred=PREFERRED))
    node = pod_template(order(pod_set(tpl=tpl)))["spec"]["affinity"]["nodeAffinity"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == PREFERRED


def test_the_narrowest_domain_level_names_the_reservation() -> None:
    assert parse_reservation(render().reservation).domain == f"{RACK}=r7"
    assert parse_reservation(render(order(domain=("us-east-1a", ""))).reservation).domain == f"{ZONE}=us-east-1a"


# ----------------------------------------------------------------------------------------- Jobs (A-4)


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("completionMode", "Indexed"),
        ("completions", 2),
        ("parallelism", 2),
        ("backoffLimit", 0),
        ("podReplacementPolicy", "Failed"),
        ("suspend", False),
        ("ttlSecondsAfterFinished", 604800),
        ("selector", None),
        ("manualSelector", None),
        ("activeDeadlineSeconds", None),
    ],
)
def test_the_job_spec_is_exactly_a4(field: str, expected: Any) -> None:
    assert render().jobs[0]["spec"].get(field) == expected


@pytest.mark.parametrize(
    ("max_runtime", "start_timeout", "expected"),
    [
        (86_400.0, 900.0, 87_300),
        (3600.5, 600.0, 4201),
        (None, 600.0, None),
    ],
)
def test_the_jobs_deadline_adds_the_start_timeout(
    max_runtime: float | None, start_timeout: float, expected: int | None
) -> None:
    job = render(order(max_runtime_s=max_runtime, start_timeout_s=start_timeout)).jobs[0]
    assert job["spec"].get("activeDeadlineSeconds") == expected


def test_one_job_per_pod_set_in_pod_set_order() -> None:
    r = render(order(pod_set("head", (("node-0007", 1),)), pod_set("workers")))
    assert [j["metadata"]["name"] for j in r.jobs] == ["train-42-3-head", "train-42-3-workers"]
    assert [j["spec"]["template"]["metadata"]["labels"]["tandem.dev/pod-set"] for j in r.jobs] == ["head", "workers"]


def test_the_service_is_headless_and_selects_the_attempt() -> None:
    svc = render().service
    assert svc["metadata"]["name"] == "train-42-3"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"tandem.dev/job": "train-42", "tandem.dev/attempt": "3"}
    assert svc["spec"]["ports"] == [{"name": "rendezvous", "protocol": "TCP", "port": 29500, "targetPort": 29500}]
    assert render().rendezvous == "train-42-3-workers-0.train-42-3:29500"


def test_the_reservation_reads_back_as_the_orders_placement() -> None:
    o = order(pod_set("head", (("node-0007", 1),)), pod_set("workers", (("node-0007", 1), ("node-0008", 3))))
    held = parse_reservation(render(o).reservation)
    assert held.key == ("tandem-system", "train-42-3")
    assert (held.job, held.attempt, held.dispatch_id) == ("train-42", "3", "4f1c2d/train-42/3")
    assert held.expires_at == NOW + 600 + CONFIG.reservation_grace_s
    assert sorted((p.pod_set, p.node, p.replicas, p.shape.gpus) for p in held.reservation.parts) == [
        ("head", "node-0007", 1, 8),
        ("workers", "node-0007", 1, 8),
        ("workers", "node-0008", 3, 8),
    ]


# ----------------------------------------------------------------------------------------- environment (A-15)

TWO_SETS = order(pod_set("head", (("node-0007", 1),), tpl=template(gpus=4)), pod_set("workers"), framework="TORCHRUN")
INDEX_REF = {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_LABEL}']"}}


@pytest.mark.parametrize(
    ("i", "name", "expected"),
    [
        (0, "TANDEM_JOB_ID", "train-42"),
        (0, "TANDEM_ATTEMPT", "3"),
        (1, "TANDEM_POD_SET", "workers"),
        (0, "TANDEM_RANK_OFFSET", "0"),
        (1, "TANDEM_RANK_OFFSET", "1"),
        (1, "TANDEM_REPLICAS", "3"),
        (1, "TANDEM_RENDEZVOUS_HOST", "train-42-3-head-0.train-42-3"),
        (1, "TANDEM_RENDEZVOUS_PORT", "29500"),
        (0, "TANDEM_CLUSTER", "gpu-east-1"),
        (1, "PET_NNODES", "3"),
        (0, "PET_NPROC_PER_NODE", "4"),
        (1, "PET_NPROC_PER_NODE", "8"),
        (1, "PET_MASTER_ADDR", "train-42-3-head-0.train-42-3"),
        (1, "PET_MASTER_PORT", "29500"),
        (0, "PET_NODE_RANK", INDEX_REF),
        (1, "PET_NODE_RANK", None),  # later pod sets add TANDEM_RANK_OFFSET themselves
        (1, "MASTER_ADDR", "train-42-3-head-0.train-42-3"),
        (0, "MASTER_PORT", "29500"),
        (0, "WORLD_SIZE", "20"),
        (0, "RAY_ADDRESS", None),
        (0, "TANDEM_MPI_HOSTS", None),
    ],
)
def test_torchrun_gets_its_pet_environment(i: int, name: str, expected: Any) -> None:
    assert env_of(pod_template(TWO_SETS, i)["spec"]["containers"][0]).get(name) == expected


@pytest.mark.parametrize(
    ("o", "name", "expected"),
    [
        (order(restart_reason="INFRA_FAILED", previous_cluster="gpu-west-2"), "TANDEM_RESTART_REASON", "INFRA_FAILED"),
        (order(restart_reason="INFRA_FAILED", previous_cluster="gpu-west-2"), "TANDEM_PREVIOUS_CLUSTER", "gpu-west-2"),
        (order(), "TANDEM_RESTART_REASON", ""),
        (order(), "PET_NNODES", None),
        (
            order(pod_set("head", (("node-0007", 1),)), pod_set("workers"), framework="RAY", rendezvous_port=6379),
            "RAY_ADDRESS",
            "train-42-3-head-0.train-42-3:6379",
        ),
        (
            order(pod_set("launcher", (("node-0007", 1),), tpl=template(gpus=0)), pod_set("workers"), framework="MPI"),
            "TANDEM_MPI_HOSTS",
            "train-42-3-workers-0.train-42-3,train-42-3-workers-1.train-42-3",
        ),
        (
            order(pod_set("launcher", (("node-0007", 1),), tpl=template(gpus=0)), pod_set("workers"), framework="MPI"),
            "TANDEM_MPI_HOSTS_SLOTS",
            "train-42-3-workers-0.train-42-3:8,train-42-3-workers-1.train-42-3:8",
        ),
    ],
)
def test_framework_and_restart_environment(o: Order, name: str, expected: Any) -> None:
    assert env_of(pod_template(o)["spec"]["containers"][0]).get(name) == expected


def test_template_variables_of_tandems_names_are_overwritten_and_tandems_come_first() -> None:
    tpl = template()
    tpl["spec"]["containers"][0]["env"] = [
        {"name": "TANDEM_JOB_ID", "value": "forged"},
        {"name": "RANK", "value": "$(TANDEM_RANK_OFFSET)"},
        {"name": "PET_NODE_RANK", "value": "0"},
    ]
    env = pod_template(
        order(pod_set("head", (("node-0007", 1),)), pod_set("workers", tpl=tpl), framework="TORCHRUN"), 1
    )["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("TANDEM_JOB_ID") == 1 and env_of({"env": env})["TANDEM_JOB_ID"] == "train-42"
    assert names[-1] == "RANK" and names.index("TANDEM_RANK_OFFSET") < names.index("RANK")
    assert "PET_NODE_RANK" not in names  # a literal rank in a pod set of many replicas is always wrong


def test_native_sidecars_get_only_tandems_identity_and_init_containers_everything() -> None:
    sidecar = {
        "name": "log-shipper",
        "image": "fluent/fluent-bit:3.2",
        "restartPolicy": "Always",
        "env": [{"name": "MASTER_ADDR", "value": "logs.example.com"}],
    }
    init = {"name": "fetch-dataset", "image": "busybox:1.36", "command": ["true"]}
    tpl = template(initContainers=[init, sidecar])
    spec = pod_template(order(pod_set(tpl=tpl), framework="TORCHRUN"))["spec"]
    fetch, shipper = (env_of(c) for c in spec["initContainers"])
    assert fetch["PET_NNODES"] == "2" and fetch["TANDEM_JOB_ID"] == "train-42"
    assert shipper["TANDEM_JOB_ID"] == "train-42" and "PET_NNODES" not in shipper
    assert shipper["MASTER_ADDR"] == "logs.example.com"  # a sidecar's own variables are its business


@pytest.mark.parametrize(
    ("framework", "success", "groups"),
    [
        ("PLAIN", ("head", "workers"), (("head", "workers"),)),
        ("TORCHRUN", ("head", "workers"), (("head", "workers"),)),
        ("RAY", ("head",), (("head", "workers"),)),
        ("MPI", ("head",), (("workers",), ("head",))),
    ],
)
def test_success_rule_and_start_order_per_framework(
    framework: str, success: tuple[str, ...], groups: tuple[tuple[str, ...], ...]
) -> None:
    o = order(pod_set("head", (("node-0007", 1),)), pod_set("workers"), framework=framework)
    assert RENDERER.success_pod_sets(o) == success
    assert RENDERER.start_groups(o) == groups


# ----------------------------------------------------------------------------------------- DRA (A-22)


def dra_order(*requests: DeviceRequestSpec) -> Order:
    tpl = template(gpus=0)
    tpl["spec"]["resourceClaims"] = [{"name": "stray", "resourceClaimName": "someone-elses-claim"}]
    tpl["spec"]["containers"][0]["resources"]["claims"] = [{"name": r.name} for r in requests]
    dra = tuple(DraRequest(r.device_class, r.selectors, r.count) for r in requests)
    shape = replace(shape_of(template(gpus=0)), dra=dra)
    return order(pod_set(tpl=tpl, shape=shape, device_requests=requests))


@pytest.mark.parametrize(
    ("request_", "exactly"),
    [
        (
            DeviceRequestSpec("gpus", "gpu.nvidia.com", (H200,), 4),
            {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": H200}}],
                "allocationMode": "ExactCount",
                "count": 4,
            },
        ),
        (
            DeviceRequestSpec("nics", "rdma.example.com", all_devices=True),
            {"deviceClassName": "rdma.example.com", "allocationMode": "All"},
        ),
    ],
)
def test_each_dra_request_gets_its_claim_template(request_: DeviceRequestSpec, exactly: dict[str, Any]) -> None:
    r = render(dra_order(request_))
    (rct,) = r.claim_templates
    assert rct["metadata"]["name"] == f"train-42-3-workers-{request_.name}"
    assert rct["spec"]["spec"]["devices"]["requests"] == [{"name": request_.name, "exactly": exactly}]
    assert rct["spec"]["metadata"]["labels"]["tandem.dev/pod-set"] == "workers"
    spec = r.jobs[0]["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": request_.name, "resourceClaimTemplateName": rct["metadata"]["name"]}]


# ----------------------------------------------------------------------------------------- strict schemas

MIXED = order(
    pod_set(
        "head",
        (("node-0007", 1),),
        tpl=template(
            initContainers=[{"name": "log-shipper", "image": "fluent/fluent-bit:3.2", "restartPolicy": "Always"}]
        ),
    ),
    pod_set("workers", tpl=template(affinity=_affinity({"matchExpressions": [ARM]}, preferred=PREFERRED))),
    framework="TORCHRUN",
    max_runtime_s=86_400.0,
    preemptible=True,
)
SCHEMA_ORDERS = {
    "plain": order(),
    "torchrun": MIXED,
    "long names": long_order(),
    "dra": dra_order(
        DeviceRequestSpec("gpus", "gpu.nvidia.com", (H200,), 4),
        DeviceRequestSpec("nics", "rdma.example.com", all_devices=True),
    ),
    "untrusted": order(pod_set(tpl=UNTRUSTED), domain=("us-east-1a", "")),
    "unconstrained": order(domain=(), framework="MPI"),
}


@pytest.mark.parametrize(
    ("obj"),
    [
        pytest.param(obj, id=f"{name}-{obj['kind']}-{obj['metadata'].get('name') or obj['metadata']['generateName']}")
        for name, o in SCHEMA_ORDERS.items()
        for obj in (
            *RENDERER.render(o, NAMESPACE, now=NOW).objects(),
            *(pod_for_dry_run(j, 0) for j in RENDERER.render(o, NAMESPACE, now=NOW).jobs),
        )
    ],
)
def test_every_rendered_object_validates_against_the_strict_schema(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ----------------------------------------------------------------------------------------- dry run (A-8)


def test_the_dry_run_pod_is_what_the_job_controller_creates() -> None:
    job = render(order(pod_set(tpl=template(initContainers=[{"name": "fetch", "image": "busybox:1.36"}])))).jobs[0]
    pod = pod_for_dry_run(job, 1)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["generateName"] == "train-42-3-workers-1-" and meta["namespace"] == NAMESPACE and "name" not in meta
    assert meta["labels"][INDEX_LABEL] == "1" and meta["annotations"][INDEX_LABEL] == "1"
    assert meta["labels"]["batch.kubernetes.io/job-name"] == "train-42-3-workers"
    assert spec["hostname"] == "train-42-3-workers-1" and spec["subdomain"] == "train-42-3"
    assert spec["schedulingGates"] == [{"name": GATE}]
    for c in (*spec["containers"], *spec["initContainers"]):
        assert env_of(c)["JOB_COMPLETION_INDEX"] == INDEX_REF
    assert "hostname" not in job["spec"]["template"]["spec"]  # the Job itself is untouched
    with pytest.raises(ValueError, match="outside"):
        pod_for_dry_run(job, 2)


ISTIO = {
    "name": "istio-proxy",
    "image": "docker.io/istio/proxyv2:1.24.0",
    "resources": {"requests": {"cpu": "2", "memory": "128Mi"}},
}


def _admitted(change: str) -> dict[str, Any]:
    pod = pod_for_dry_run(render().jobs[0], 0)
    c = pod["spec"]["containers"][0]
    if change == "sidecar":
        pod["spec"]["containers"].append(copy.deepcopy(ISTIO))
    elif change == "limitrange":
        c["resources"]["requests"]["memory"] = "65Gi"
    elif change == "gpus":
        c["resources"]["requests"]["nvidia.com/gpu"] = c["resources"]["limits"]["nvidia.com/gpu"] = "4"
    elif change == "extended":
        c["resources"]["requests"]["rdma/ib"] = c["resources"]["limits"]["rdma/ib"] = "1"
    elif change == "broken":
        c["resources"]["requests"]["cpu"] = "lots"
    return pod


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("none", None),
        (
            "sidecar",
            "admission changed the pod's requests: cpu 8 -> 10, memory 64Gi -> 65664Mi "
            "(containers added by admission: istio-proxy)",
        ),
        (
            "limitrange",
            "admission changed the pod's requests: memory 64Gi -> 65Gi (a sidecar injector or a LimitRange default?)",
        ),
        ("gpus", "admission changed the pod's requests: GPUs 8 -> 4"),
        ("extended", "admission changed the pod's requests: rdma/ib 0 -> 1"),
        ("broken", "admission left a pod whose requests cannot be read"),
    ],
)
def test_admission_changes_to_what_the_fit_depends_on_are_named(change: str, expected: str | None) -> None:
    rendered = pod_for_dry_run(render().jobs[0], 0)
    problem = admitted_shape_problem(_admitted(change), order().pod_sets[0].shape, rendered=rendered)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(expected), problem


# ----------------------------------------------------------------------------------------- pin and ungate (A-1, A-3, A-7)


def _gated_pod(affinity: dict[str, Any] | None, domain: tuple[str, ...] = ()) -> dict[str, Any]:
    tpl = template(**_with_affinity(affinity))
    return server_pod(render(order(pod_set(tpl=tpl), domain=domain)).jobs[0], 0)


def _terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    found: Any = pod["spec"]
    for key in TERMS:
        found = (found or {}).get(key)
    return list(found or [])


PIN_CASES: dict[str, tuple[dict[str, Any] | None, tuple[str, ...]]] = {
    "domain term": (None, ("us-east-1a", "b1", "r7")),
    "no affinity": (None, ()),
    "pod affinity only": ({"podAffinity": {}}, ()),
    "preferred only": ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED}}, ()),
    "two terms, one with fields": (
        _affinity({"matchExpressions": [ARM]}, {"matchExpressions": [AMD], "matchFields": [FIELD]}),
        ("us-east-1a",),
    ),
}


@pytest.mark.parametrize(("affinity", "domain"), PIN_CASES.values(), ids=PIN_CASES.keys())
def test_the_pin_only_narrows_and_pinned_node_reads_it(
    affinity: dict[str, Any] | None, domain: tuple[str, ...]
) -> None:
    pod = _gated_pod(affinity, domain)
    before = _terms(pod)
    ops = pin_patch(pod, "node-0007")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "4711"}
    assert {op["op"] for op in ops} <= {"test", "add"}  # JSON Patch, never a merge patch
    after = apply_patch(pod, ops)
    assert pinned_node(after) == "node-0007"
    terms = _terms(after)
    assert len(terms) == max(1, len(before))  # A-1: the number of terms never changes once there are terms
    for old, new in zip(before, terms):  # only requirements appended within each existing term
        for kind in ("matchExpressions", "matchFields"):
            assert new.get(kind, [])[: len(old.get(kind, []))] == old.get(kind, [])
    assert {k: v for k, v in after["spec"].items() if k != "affinity"} == {
        k: v for k, v in pod["spec"].items() if k != "affinity"
    }
    assert apply_patch(after, pin_patch(after, "node-0007")) == after  # pinning twice adds nothing


def test_a_pin_on_a_changed_pod_fails_its_test() -> None:
    pod = _gated_pod(None, ("us-east-1a",))
    ops = pin_patch(pod, "node-0007")
    changed = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "4712"}}
    with pytest.raises(PatchFailed):
        apply_patch(changed, ops)
    with pytest.raises(ValueError, match="resourceVersion"):
        pin_patch(pod_for_dry_run(render().jobs[0], 0), "node-0007")


@pytest.mark.parametrize(
    ("gates", "left"),
    [
        ([GATE], []),
        (["example.com/quota", GATE, "example.com/hold"], ["example.com/quota", "example.com/hold"]),
        (["example.com/quota"], None),
        ([], None),
    ],
)
def test_ungating_removes_only_tandems_gate(gates: list[str], left: list[str] | None) -> None:
    pod = _gated_pod(None)
    pod["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    ops = ungate_patch(pod)
    if left is None:
        assert ops is None
        return
    assert ops is not None and [op["op"] for op in ops] == ["test", "remove"]
    assert [g["name"] for g in apply_patch(pod, ops)["spec"]["schedulingGates"]] == left
    moved = [{"name": "example.com/new"}, *pod["spec"]["schedulingGates"]]
    shifted = {**pod, "spec": {**pod["spec"], "schedulingGates": moved}}
    with pytest.raises(PatchFailed):  # another controller's gate moved ours: the test refuses, nothing else is removed
        apply_patch(shifted, ops)


@pytest.mark.parametrize(
    ("parts", "pointer"),
    [
        (("spec", "schedulingGates", 0), "/spec/schedulingGates/0"),
        (("metadata", "annotations", INDEX_LABEL), "/metadata/annotations/batch.kubernetes.io~1job-completion-index"),
        (("metadata", "labels", "a~b/c"), "/metadata/labels/a~0b~1c"),
    ],
)
def test_json_pointers_escape_keys(parts: tuple[str | int, ...], pointer: str) -> None:
    assert json_pointer(*parts) == pointer
    doc = {
        "spec": {"schedulingGates": [{"name": "g"}]},
        "metadata": {"annotations": {INDEX_LABEL: "1"}, "labels": {"a~b/c": "x"}},
    }
    apply_patch(doc, [{"op": "remove", "path": pointer}])
