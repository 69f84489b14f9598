"""Bad input in every field: INVALID_ARGUMENT with BadRequest naming the field path, over real gRPC."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
from google.rpc import error_details_pb2

from broker.api import validation
from broker.launcher.client import status_details
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc
from tests.broker.hub_builders import Broker, broker, spec, template  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def _set(path: str, value: object) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        *parents, leaf = path.split(".")
        obj: object = s
        for p in parents:
            obj = s.pod_sets[0] if p == "ps" else getattr(obj, p)
        setattr(obj, leaf, value)

    return apply


def _tpl(**spec_fields: object) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.pod_sets[0].pod_template_json = template(8, **spec_fields)

    return apply


def _raw_tpl(text: str) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.pod_sets[0].pod_template_json = text

    return apply


def _container(**fields: object) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        c = {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}, **fields}
        s.pod_sets[0].pod_template_json = json.dumps({"spec": {"containers": [c]}})

    return apply


def _dup_pod_set(s: job_pb2.JobSpec) -> None:
    s.pod_sets.add().CopyFrom(s.pod_sets[0])


def _no_pod_sets(s: job_pb2.JobSpec) -> None:
    del s.pod_sets[:]


def _min_available(n: int) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.min_available = n

    return apply


def _label(k: str, v: str) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.labels[k] = v

    return apply


def _extended(k: str, v: int) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.pod_sets[0].shape.extended_resources[k] = v

    return apply


def _model(m: str) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.pod_sets[0].shape.allowed_gpu_models.append(m)

    return apply


def _negative_runtime(s: job_pb2.JobSpec) -> None:
    s.max_runtime.seconds = -5


def _cluster(name: str) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.cluster_selector.clusters.append(name)

    return apply


def _device(name: str, cls: str) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.pod_sets[0].shape.device_requests.add(name=name, device_class_name=cls)

    return apply


P = "items[0].spec"
CASES: list[tuple[str, Callable[[job_pb2.JobSpec], None], str]] = [
    ("queue", _set("queue", "Not_A_Label"), f"{P}.queue"),
    ("priority", _set("priority", 5000), f"{P}.priority"),
    ("display_name", _set("display_name", "x" * 300), f"{P}.display_name"),
    ("no pod sets", _no_pod_sets, f"{P}.pod_sets"),
    ("pod set name", _set("ps.name", "Workers"), f"{P}.pod_sets[0].name"),
    ("pod set name long", _set("ps.name", "abcdefghijklm"), f"{P}.pod_sets[0].name"),
    ("duplicate pod set", _dup_pod_set, f"{P}.pod_sets[1].name"),
    ("count", _set("ps.count", 0), f"{P}.pod_sets[0].count"),
    ("gpu_count", _set("ps.shape.gpu_count", 65), f"{P}.pod_sets[0].shape.gpu_count"),
    ("gpu_milli", _set("ps.shape.gpu_milli", 1001), f"{P}.pod_sets[0].shape.gpu_milli"),
    ("mig profile", _set("ps.shape.mig_profile", "big"), f"{P}.pod_sets[0].shape.mig_profile"),
    ("mig count without profile", _set("ps.shape.mig_count", 2), f"{P}.pod_sets[0].shape.mig_count"),
    ("cpu", _set("ps.shape.cpu_milli", -1), f"{P}.pod_sets[0].shape.cpu_milli"),
    ("memory", _set("ps.shape.memory_bytes", -1), f"{P}.pod_sets[0].shape.memory_bytes"),
    # the template must request what the shape declares (kube-scheduler sees the template).
    ("cpu not in template", _set("ps.shape.cpu_milli", 96_000), f"{P}.pod_sets[0].shape.cpu_milli"),
    ("memory not in template", _set("ps.shape.memory_bytes", 1 << 40), f"{P}.pod_sets[0].shape.memory_bytes"),
    ("gpus differ from template", _set("ps.shape.gpu_count", 4), f"{P}.pod_sets[0].shape.gpu_count"),
    ("gpu model", _model("not a label value!"), f"{P}.pod_sets[0].shape.allowed_gpu_models[0]"),
    ("extended gpu", _extended("nvidia.com/gpu", 1), f"{P}.pod_sets[0].shape.extended_resources['nvidia.com/gpu']"),
    ("device request", _device("", "gpu.nvidia.com"), f"{P}.pod_sets[0].shape.device_requests[0].name"),
    ("device class", _device("gpu", ""), f"{P}.pod_sets[0].shape.device_requests[0].device_class_name"),
    ("min_available", _min_available(5), f"{P}.min_available"),
    ("topology level", _set("topology.required_level", "rack level!"), f"{P}.topology.required_level"),
    ("max_runtime", _negative_runtime, f"{P}.max_runtime"),
    ("cluster name", _cluster("Bad_Name"), f"{P}.cluster_selector.clusters[0]"),
    ("label", _label("bad key!", "v"), f"{P}.labels['bad key!']"),
    ("label value", _label("k", "bad value!"), f"{P}.labels['k']"),
    ("rendezvous port", _set("rendezvous_port", 70000), f"{P}.rendezvous_port"),
    ("template missing", _raw_tpl(""), f"{P}.pod_sets[0].pod_template_json"),
    ("template not json", _raw_tpl("{nope"), f"{P}.pod_sets[0].pod_template_json"),
    ("template not object", _raw_tpl("[1]"), f"{P}.pod_sets[0].pod_template_json"),
    ("template no spec", _raw_tpl("{}"), f"{P}.pod_sets[0].pod_template_json.spec"),
    ("host network", _tpl(hostNetwork=True), f"{P}.pod_sets[0].pod_template_json.spec.hostNetwork"),
    ("host pid", _tpl(hostPID=True), f"{P}.pod_sets[0].pod_template_json.spec.hostPID"),
    ("node name", _tpl(nodeName="n1"), f"{P}.pod_sets[0].pod_template_json.spec.nodeName"),
    ("scheduler name", _tpl(schedulerName="mine"), f"{P}.pod_sets[0].pod_template_json.spec.schedulerName"),
    ("priority class", _tpl(priorityClassName="top"), f"{P}.pod_sets[0].pod_template_json.spec.priorityClassName"),
    (
        "scheduling gates",
        _tpl(schedulingGates=[{"name": "x"}]),
        f"{P}.pod_sets[0].pod_template_json.spec.schedulingGates",
    ),
    (
        "host path",
        _tpl(volumes=[{"name": "v", "hostPath": {"path": "/"}}]),
        f"{P}.pod_sets[0].pod_template_json.spec.volumes[0].hostPath",
    ),
    (
        "privileged",
        _container(securityContext={"privileged": True}),
        f"{P}.pod_sets[0].pod_template_json.spec.containers[0].securityContext.privileged",
    ),
    (
        "host port",
        _container(ports=[{"containerPort": 1, "hostPort": 80}]),
        f"{P}.pod_sets[0].pod_template_json.spec.containers[0].ports[0].hostPort",
    ),
    (
        "template gpus disagree",
        _container(resources={"limits": {"nvidia.com/gpu": "2"}}),
        f"{P}.pod_sets[0].shape.gpu_count",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "field"), CASES, ids=[c[0] for c in CASES])
async def test_bad_spec_field_is_named(
    broker: Broker, name: str, mutate: Callable[[job_pb2.JobSpec], None], field: str
) -> None:
    s = spec(gpus=8)
    mutate(s)
    req = svc.SubmitJobsRequest(job_set_id="s")
    req.items.add(idempotency_key="k", spec=s)
    resp = await broker.client("alpha").submit_raw(req)
    err = resp.results[0].error
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], err.message
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in err.details if d.Is(error_details_pb2.BadRequest.DESCRIPTOR))
    assert field in [v.field for v in bad.field_violations], [v.field for v in bad.field_violations]


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (svc.SubmitJobsRequest(job_set_id=""), "job_set_id"),
        (svc.SubmitJobsRequest(job_set_id="Bad Set"), "job_set_id"),
        (svc.SubmitJobsRequest(job_set_id="s"), "items"),
    ],
)
async def test_bad_request_fields_fail_the_call(broker: Broker, req: svc.SubmitJobsRequest, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await broker.client("alpha").submit_raw(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [bad] = [d for d in status_details(err.value) if isinstance(d, error_details_pb2.BadRequest)]
    assert field in [v.field for v in bad.field_violations]


async def test_item_errors_are_independent_and_keys_required(broker: Broker) -> None:
    req = svc.SubmitJobsRequest(job_set_id="s")
    req.items.add(idempotency_key="", spec=spec(gpus=1))
    req.items.add(idempotency_key="ok", spec=spec(gpus=1))
    resp = await broker.client("alpha").submit_raw(req)
    assert resp.results[0].WhichOneof("result") == "error"
    assert resp.results[1].WhichOneof("result") == "job_id"


@pytest.mark.parametrize("job_id", ["", "UPPER", "1starts-with-digit", "x" * 41, "has_underscore"])
async def test_job_ids_must_be_dns1035_labels(broker: Broker, job_id: str) -> None:
    c = broker.client("alpha")
    for call in (c.get(job_id), c.cancel(job_id)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_oversized_messages_are_refused_by_the_server(broker: Broker) -> None:
    s = spec(gpus=1)
    s.pod_sets[0].pod_template_json = json.dumps(
        {"spec": {"containers": [{"name": "m", "image": "x"}]}, "metadata": {"annotations": {"a": "x" * (5 << 20)}}}
    )
    req = svc.SubmitJobsRequest(job_set_id="s")
    req.items.add(idempotency_key="k", spec=s)
    from broker.launcher.client import BrokerClient

    big = BrokerClient(broker.tenant_addr, token="token-alpha", max_message_bytes=64 << 20)
    broker.clients.append(big)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await big.submit_raw(req)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_dns1035() -> None:
    assert validation.check_job_id("j-123abc") == []
    assert validation.check_job_id("a") == []
    assert validation.check_job_id("a-") != []
