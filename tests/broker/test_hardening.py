"""Bad input found by an attacker-style run, over real gRPC: each answered by the contract (INVALID_ARGUMENT whose
BadRequest names the field), never INTERNAL / UNKNOWN, never a crash, and the broker keeps serving."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from broker.api import serde
from broker.domain import errors
from broker.launcher.client import BrokerClient, SubmitItem, status_details
from placement.usage import mig_gpus
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc
from tests.broker.hub_builders import Broker, ScriptedAgent, broker, node, spec, start_broker, template  # noqa: F401  (the fixture)
from tests.protos import builders as pb
from tests.protos import builders_cluster as pbc

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
CONNECT = "/tandem.v1.ClusterService/Connect"
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def fields_of(err: grpc.aio.AioRpcError) -> list[str]:
    """The BadRequest field paths of a failed call (asserting it is INVALID_ARGUMENT with one)."""
    assert err.code() == INVALID, (err.code(), err.details())
    bad = [d for d in status_details(err) if isinstance(d, error_details_pb2.BadRequest)]
    assert bad and bad[0].field_violations, err.details()
    return [v.field for v in bad[0].field_violations]


def item_fields(status: status_pb2.Status) -> list[str]:
    """The BadRequest field paths of one SubmitJobs item's error (asserting INVALID_ARGUMENT)."""
    assert status.code == INVALID.value[0], status
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            return [v.field for v in bad.field_violations]
    raise AssertionError(f"no BadRequest in {status}")


async def submit(
    b: Broker, *specs: job_pb2.JobSpec, job_set: str = "hardening", validate_only: bool = True
) -> svc.SubmitJobsResponse:
    req = svc.SubmitJobsRequest(job_set_id=job_set, validate_only=validate_only)
    for i, s in enumerate(specs):
        req.items.add(idempotency_key=f"k{i}", spec=s)
    return await b.client("alpha").submit_raw(req)


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


async def first_event(c: BrokerClient, req: svc.WatchJobsRequest) -> Any:
    call = c.jobs.WatchJobs(req, metadata=c.metadata, timeout=10)
    try:
        async for ev in call:
            return ev
    finally:
        call.cancel()


async def still_serving(b: Broker) -> None:
    """A valid request afterwards still gets the right answer."""
    [ok] = (await submit(b, spec(gpus=1))).results
    assert ok.WhichOneof("result") == "valid", ok


# ----------------------------------------------------------------------------- 1. unknown enum values


@pytest.mark.parametrize("value", [999, -1])
async def test_list_jobs_unknown_state_is_refused_naming_its_index(broker: Broker, value: int) -> None:
    c = broker.client("alpha")
    err = await refused(
        c.jobs.ListJobs(svc.ListJobsRequest(states=[job_pb2.JOB_STATE_QUEUED, value]), metadata=c.metadata)
    )
    assert fields_of(err) == ["states[1]"]
    await still_serving(broker)


async def test_unknown_views_are_refused(broker: Broker) -> None:
    c = broker.client("alpha")
    err = await refused(c.jobs.GetJob(svc.GetJobRequest(job_id="j1", view=77), metadata=c.metadata))  # type: ignore[arg-type]
    assert fields_of(err) == ["view"]
    err = await refused(c.jobs.ListJobs(svc.ListJobsRequest(view=-3), metadata=c.metadata))  # type: ignore[arg-type]
    assert fields_of(err) == ["view"]


def _framework(s: job_pb2.JobSpec) -> None:
    s.framework = 99  # type: ignore[assignment]


def _allocation_mode(s: job_pb2.JobSpec) -> None:
    s.pod_sets[0].shape.device_requests.add(name="gpu", device_class_name="gpu.nvidia.com", allocation_mode=7)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (_framework, "items[0].spec.framework"),
        (_allocation_mode, "items[0].spec.pod_sets[0].shape.device_requests[0].allocation_mode"),
    ],
)
async def test_unknown_spec_enums_fail_their_item_only(
    broker: Broker, mutate: Callable[[job_pb2.JobSpec], None], field: str
) -> None:
    bad = spec(gpus=1)
    mutate(bad)
    first, second = (await submit(broker, bad, spec(gpus=1))).results
    assert field in item_fields(first.error)
    assert second.WhichOneof("result") == "valid"


# ----------------------------------------------------------------------------- the agent stream


def _hello(cluster: str = "c1", **fields: Any) -> cs.AgentMessage:
    return cs.AgentMessage(
        sequence=1, hello=cs.Hello(cluster_name=cluster, region="eu", role="training", protocol_version=1, **fields)
    )


async def raw_connect(agent: ScriptedAgent, frames: list[bytes]) -> grpc.aio.AioRpcError:
    """Send `frames` on a Connect stream and keep it open: the status the broker ends the stream with."""
    release = asyncio.Event()

    async def requests() -> AsyncIterator[bytes]:
        for f in frames:
            yield f
        await release.wait()

    call = agent.channel.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)(requests())
    try:
        async with asyncio.timeout(15):
            async for _ in call:
                pass
    except grpc.aio.AioRpcError as exc:
        return exc
    finally:
        release.set()
        call.cancel()
    raise AssertionError("the broker ended the stream with OK")


async def test_hello_with_unknown_enum_is_refused_naming_the_field(broker: Broker) -> None:
    agent = broker.agent("c1")
    hello = _hello()
    hello.hello.known_attempts.add(phase=42).attempt.job_id = "j1"  # type: ignore[arg-type]
    err = await raw_connect(agent, [hello.SerializeToString()])
    assert fields_of(err) == ["messages[0].hello.known_attempts[0].phase"]
    await agent.close()


async def test_agent_message_with_unknown_enum_ends_the_stream_naming_it(broker: Broker) -> None:
    agent = broker.agent("c1")
    status = cs.AgentMessage(sequence=3, workload_status=cs.WorkloadStatus(phase=77))  # type: ignore[arg-type]
    snapshot = cs.AgentMessage(sequence=2)
    snapshot.inventory_snapshot.sequence = 1
    err = await raw_connect(
        agent, [_hello().SerializeToString(), snapshot.SerializeToString(), status.SerializeToString()]
    )
    assert fields_of(err) == ["messages[2].workload_status.phase"]
    info = [d for d in status_details(err) if isinstance(d, error_details_pb2.ErrorInfo)]
    assert info and info[0].metadata["after_sequence"] == "2" and info[0].metadata["position"] == "2"
    await agent.close()
    again = broker.agent("c1")  # the agent reconnects; the broker still serves it
    assert (await again.connect([node("n1")])).session_id
    await again.close()


@pytest.mark.parametrize(
    "frames",
    [
        [b"\xff\xff\xff"],
        [b"\x1a\x05\x0a\x03c\xff1"],  # hello.cluster_name is not UTF-8
    ],
)
async def test_undecodable_hello_is_refused(broker: Broker, frames: list[bytes]) -> None:
    agent = broker.agent("c1")
    err = await raw_connect(agent, frames)
    assert all(f.startswith("messages[0]") for f in fields_of(err))
    await agent.close()


@pytest.mark.parametrize(
    "bad", [b"\xff\xff\xff", b"\x42\x03\x0a\x01", pbc.agent_messages()[5].SerializeToString()[:-3]]
)
async def test_undecodable_message_after_hello_ends_the_stream_naming_its_position(broker: Broker, bad: bytes) -> None:
    agent = broker.agent("c1")
    err = await raw_connect(agent, [_hello().SerializeToString(), bad])
    assert all(f.startswith("messages[1]") for f in fields_of(err)), fields_of(err)
    await agent.close()
    again = broker.agent("c1")
    assert (await again.connect([node("n1")])).session_id
    await again.close()
    await still_serving(broker)


async def test_first_message_not_a_hello_is_invalid_argument(broker: Broker) -> None:
    """The proto's contract: INVALID_ARGUMENT when the first message is not a Hello."""
    agent = broker.agent("c1")
    err = await raw_connect(agent, [cs.AgentMessage(sequence=1, heartbeat=cs.Heartbeat()).SerializeToString()])
    assert fields_of(err) == ["messages[0].hello"]
    await agent.close()


# ----------------------------------------------------------------------------- 2. integers out of range


@pytest.mark.parametrize("revision", [1 << 63, (1 << 64) - 1])
async def test_watch_from_a_revision_beyond_int64_is_refused(broker: Broker, revision: int) -> None:
    c = broker.client("alpha")
    err = await refused(first_event(c, svc.WatchJobsRequest(from_revision=revision)))
    assert fields_of(err) == ["from_revision"]
    assert (await first_event(c, svc.WatchJobsRequest())).type == svc.JOB_EVENT_TYPE_BOOKMARK


async def test_watch_bookmark_interval_is_bounded(broker: Broker) -> None:
    c = broker.client("alpha")
    err = await refused(first_event(c, svc.WatchJobsRequest(bookmark_interval_seconds=(1 << 32) - 1)))
    assert fields_of(err) == ["bookmark_interval_seconds"]


def _field(path: str, value: Any) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        obj: Any = s
        *parents, leaf = path.split(".")
        for p in parents:
            obj = s.pod_sets[0] if p == "ps" else getattr(obj, p)
        setattr(obj, leaf, value)

    return apply


_RESOURCE = {"cpu_milli": "cpu", "memory_bytes": "memory"}


def _requests(**shape: tuple[int, str]) -> Callable[[job_pb2.JobSpec], None]:
    """The shape and the template's container request the same (huge) amount, so only a bound refuses it."""

    def apply(s: job_pb2.JobSpec) -> None:
        ps = s.pod_sets[0]
        tpl = json.loads(ps.pod_template_json)
        limits = tpl["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {})
        for fname, (value, quantity) in shape.items():
            setattr(ps.shape, fname, value)
            limits[_RESOURCE[fname]] = quantity
        ps.pod_template_json = json.dumps(tpl)

    return apply


def _extended(s: job_pb2.JobSpec) -> None:
    s.pod_sets[0].shape.extended_resources["example.com/fpga"] = (1 << 63) - 1


def _device_count(s: job_pb2.JobSpec) -> None:
    s.pod_sets[0].shape.device_requests.add(name="gpu", device_class_name="gpu.nvidia.com", count=(1 << 32) - 1)


def _many_replicas(s: job_pb2.JobSpec) -> None:
    s.pod_sets[0].count = 99_999
    s.pod_sets.add(name="more", count=99_999, pod_template_json=template(1)).shape.gpu_count = 1


P = "items[0].spec"
INTEGERS = [
    ("max_runtime huge", _field("max_runtime.seconds", 1 << 62), f"{P}.max_runtime"),
    ("start_timeout nanos", _field("start_timeout.nanos", 2_000_000_000), f"{P}.start_timeout"),
    ("grace nanos negative", _field("termination_grace_period.nanos", -1), f"{P}.termination_grace_period"),
    ("max_infra_retries", _field("max_infra_retries", (1 << 32) - 1), f"{P}.max_infra_retries"),
    (
        "min gpu memory",
        _field("ps.shape.min_gpu_memory_mib", (1 << 64) - 1),
        f"{P}.pod_sets[0].shape.min_gpu_memory_mib",
    ),
    ("cpu huge", _requests(cpu_milli=((1 << 63) - 1, f"{(1 << 63) - 1}m")), f"{P}.pod_sets[0].shape.cpu_milli"),
    ("memory huge", _requests(memory_bytes=((1 << 63) - 1, str((1 << 63) - 1))), f"{P}.pod_sets[0].shape.memory_bytes"),
    ("extended huge", _extended, f"{P}.pod_sets[0].shape.extended_resources['example.com/fpga']"),
    ("device count", _device_count, f"{P}.pod_sets[0].shape.device_requests[0].count"),
    ("total replicas", _many_replicas, f"{P}.pod_sets"),
]


@pytest.mark.parametrize(("name", "mutate", "field"), INTEGERS, ids=[c[0] for c in INTEGERS])
async def test_out_of_range_integers_are_refused_naming_the_field(
    broker: Broker, name: str, mutate: Callable[[job_pb2.JobSpec], None], field: str
) -> None:
    s = spec(gpus=1)
    mutate(s)
    [r] = (await submit(broker, s)).results
    assert field in item_fields(r.error)


def _mig(s: job_pb2.JobSpec, profile: str = "1g.10gb", count: int = (1 << 32) - 1) -> None:
    """A MIG shape whose template requests exactly the same (so only the shape's own checks refuse it)."""
    s.pod_sets[0].shape.gpu_count = 0
    s.pod_sets[0].shape.mig_profile = profile
    s.pod_sets[0].shape.mig_count = count
    s.pod_sets[0].pod_template_json = json.dumps(
        {
            "spec": {
                "containers": [
                    {"name": "m", "image": "x", "resources": {"limits": {f"nvidia.com/mig-{profile}": str(count)}}}
                ]
            }
        }
    )


async def test_mig_count_is_bounded(broker: Broker) -> None:
    s = spec(gpus=0)
    _mig(s)
    [r] = (await submit(broker, s)).results
    assert f"{P}.pod_sets[0].shape.mig_count" in item_fields(r.error)


# ----------------------------------------------------------------------------- 3. deep JSON


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "text",
    [
        '{"a":' * 50_000 + "1" + "}" * 50_000,
        json.dumps({"spec": {"containers": [{"name": "m", "image": "x", "args": "@"}]}}).replace('"@"', _deep(50_000)),
        json.dumps({"spec": {"containers": [{"name": "m", "image": "x", "args": "@"}]}}).replace('"@"', _deep(1000)),
    ],
)
async def test_deeply_nested_template_is_refused_naming_the_field(broker: Broker, text: str) -> None:
    s = spec(gpus=0)
    s.pod_sets[0].pod_template_json = text
    [r] = (await submit(broker, s)).results
    assert item_fields(r.error) == [f"{P}.pod_sets[0].pod_template_json"]
    await still_serving(broker)


async def test_nesting_within_the_bound_is_not_refused_for_depth(broker: Broker) -> None:
    s = spec(gpus=0)
    s.pod_sets[0].pod_template_json = json.dumps(
        {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "m", "image": "x", "args": "@"}]}}
    ).replace('"@"', _deep(58))
    [r] = (await submit(broker, s)).results
    if r.WhichOneof("result") == "error":
        assert "levels deep" not in r.error.message


def test_the_job_request_builder_never_recurses_into_a_deep_template() -> None:
    s = spec(gpus=0)
    s.pod_sets[0].pod_template_json = _deep(100_000)
    with pytest.raises(errors.InvalidArgument) as err:
        serde.request_from_spec("j1", s, "alpha")
    assert [v.field for v in err.value.details.field_violations] == ["spec.pod_sets[0].pod_template_json"]


# ----------------------------------------------------------------------------- 4. bytes that are not protobuf

TENANT_UNARY = {
    "/tandem.v1.JobService/SubmitJobs": pb.submit_jobs_request(),
    "/tandem.v1.JobService/GetJob": pb.get_job_request(),
    "/tandem.v1.JobService/ListJobs": pb.list_jobs_request(),
    "/tandem.v1.JobService/CancelJob": pb.cancel_job_request(),
    "/tandem.v1.JobService/CancelJobSet": pb.cancel_job_set_request(),
    "/tandem.v1.JobService/GetUsage": pb.get_usage_request(),
    "/tandem.v1.JobService/ExportUsage": pb.export_usage_request(),
    "/tandem.v1.JobService/RequeueJob": pb.requeue_job_request(),
    "/tandem.v1.JobService/SetJobPriority": pb.set_job_priority_request(),
    "/tandem.v1.JobService/HoldJob": pb.hold_job_request(),
    "/tandem.v1.JobService/ReleaseJob": pb.release_job_request(),
    "/tandem.v1.ClusterService/ListClusters": pbc.list_clusters_request(),
    "/tandem.v1.ClusterService/GetCluster": pbc.get_cluster_request(),
    "/tandem.v1.ClusterService/Cordon": pbc.cordon_request(),
    "/tandem.v1.ClusterService/Uncordon": pbc.uncordon_request(),
}


def _payloads(example: Any) -> list[bytes]:
    """Garbage, a first field that is not UTF-8 / not complete, and truncations of a real message that no
    longer parse (a cut at a field boundary still does)."""
    raw = example.SerializeToString()
    out = []
    for payload in (b"\xff\xff\xff\xff", b"\x0a\x02\xff\xfe", raw[: len(raw) // 2], raw[: len(raw) // 3], raw[:-1]):
        try:
            type(example).FromString(payload)
        except Exception:
            out.append(payload)
    assert len(out) >= 2
    return out


@pytest.mark.parametrize("method", sorted(TENANT_UNARY))
async def test_undecodable_unary_requests_are_invalid_argument(broker: Broker, method: str) -> None:
    c = broker.client("admin")
    call = c.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    for payload in _payloads(TENANT_UNARY[method]):
        err = await refused(call(payload, metadata=c.metadata, timeout=10))
        assert fields_of(err), payload
    await still_serving(broker)


async def test_undecodable_watch_request_is_invalid_argument(broker: Broker) -> None:
    c = broker.client("alpha")
    call = c.channel.unary_stream(
        "/tandem.v1.JobService/WatchJobs", request_serializer=None, response_deserializer=None
    )
    for payload in _payloads(pb.watch_jobs_request()):
        stream = call(payload, metadata=c.metadata, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stream:
                pass
        assert fields_of(err.value)


async def test_bad_utf8_names_the_string_field(broker: Broker) -> None:
    c = broker.client("alpha")
    m = svc.SubmitJobsRequest(job_set_id="s")
    m.items.add(idempotency_key="k", spec=spec(gpus=1)).spec.queue = "qqqq"
    raw = m.SerializeToString().replace(b"qqqq", b"q\xffqq")
    call = c.channel.unary_unary(
        "/tandem.v1.JobService/SubmitJobs", request_serializer=None, response_deserializer=None
    )
    err = await refused(call(raw, metadata=c.metadata))
    assert fields_of(err) == ["items[0].spec.queue"]


async def test_methods_of_the_other_listener_are_unimplemented(broker: Broker) -> None:
    agent = broker.agent("c1")
    call = agent.channel.unary_unary(
        "/tandem.v1.ClusterService/ListClusters", request_serializer=None, response_deserializer=None
    )
    for payload in (b"", b"\xff\xff"):
        assert (await refused(call(payload, timeout=10))).code() == grpc.StatusCode.UNIMPLEMENTED
    c = broker.client("admin")
    stream = c.channel.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)(
        iter([b"\xff"]), metadata=c.metadata, timeout=10
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stream:
            pass
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    await agent.close()


# ----------------------------------------------------------------------------- 5. names


def _label(key: str, value: str) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        s.labels[key] = value

    return apply


def _append(path: str, value: str) -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        obj: Any = s
        *parents, leaf = path.split(".")
        for p in parents:
            obj = s.pod_sets[0] if p == "ps" else getattr(obj, p)
        getattr(obj, leaf).append(value)

    return apply


def _device(name: str, cls: str, selector: str = "") -> Callable[[job_pb2.JobSpec], None]:
    def apply(s: job_pb2.JobSpec) -> None:
        r = s.pod_sets[0].shape.device_requests.add(name=name, device_class_name=cls)
        if selector:
            r.selectors.append(selector)

    return apply


def _pod_set_name(s: job_pb2.JobSpec) -> None:
    s.pod_sets[0].name = "workers\n"


NAMES = [
    ("queue newline", _field("queue", "default\n"), f"{P}.queue"),
    ("queue too long", _field("queue", "q" * 64), f"{P}.queue"),
    ("pod set newline", _pod_set_name, f"{P}.pod_sets[0].name"),
    ("label value newline", _label("team", "llm\n"), f"{P}.labels['team']"),
    ("label key newline", _label("team\n", "llm"), f"{P}.labels['team\\n']"),
    ("tenant newline", _field("tenant", "alpha\n"), f"{P}.tenant"),
    ("band newline", _field("priority_band", "default\n"), f"{P}.priority_band"),
    ("namespace hint", _field("namespace_hint", "Team A"), f"{P}.namespace_hint"),
    ("display name NUL", _field("display_name", "run\x00"), f"{P}.display_name"),
    ("cluster too long", _append("cluster_selector.clusters", "c" * 300), f"{P}.cluster_selector.clusters[0]"),
    ("cluster newline", _append("cluster_selector.clusters", "eu-a\n"), f"{P}.cluster_selector.clusters[0]"),
    ("region charset", _append("cluster_selector.regions", "eu west"), f"{P}.cluster_selector.regions[0]"),
    ("region too long", _append("cluster_selector.regions", "r" * 64), f"{P}.cluster_selector.regions[0]"),
    ("role charset", _append("cluster_selector.roles", "train\x00"), f"{P}.cluster_selector.roles[0]"),
    (
        "locality cluster",
        _append("data_locality.preferred_clusters", "EU_A"),
        f"{P}.data_locality.preferred_clusters[0]",
    ),
    ("locality region", _append("data_locality.preferred_regions", "eu\n"), f"{P}.data_locality.preferred_regions[0]"),
    (
        "gpu model newline",
        _append("ps.shape.allowed_gpu_models", "H100\n"),
        f"{P}.pod_sets[0].shape.allowed_gpu_models[0]",
    ),
    ("topology level newline", _field("topology.required_level", "rack\n"), f"{P}.topology.required_level"),
    ("device name newline", _device("gpu\n", "gpu.nvidia.com"), f"{P}.pod_sets[0].shape.device_requests[0].name"),
    (
        "device class newline",
        _device("gpu", "gpu.nvidia.com\n"),
        f"{P}.pod_sets[0].shape.device_requests[0].device_class_name",
    ),
    (
        "selector too long",
        _device("gpu", "gpu.nvidia.com", "1" + "+1" * 100_000 + " > 0"),
        f"{P}.pod_sets[0].shape.device_requests[0].selectors[0]",
    ),
    (
        "selector does not compile",
        _device("gpu", "gpu.nvidia.com", "device.attributes["),
        f"{P}.pod_sets[0].shape.device_requests[0].selectors[0]",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "field"), NAMES, ids=[c[0] for c in NAMES])
async def test_bad_names_are_refused_naming_the_field(
    broker: Broker, name: str, mutate: Callable[[job_pb2.JobSpec], None], field: str
) -> None:
    agent = broker.agent("eu-a")  # a connected cluster: a bad name must not come back as UNFITTABLE
    await agent.connect([node("n1")])
    s = spec(gpus=1)
    mutate(s)
    [r] = (await submit(broker, s)).results
    assert field in item_fields(r.error), r.error
    await agent.close()


async def test_mig_profile_with_a_newline_is_refused(broker: Broker) -> None:
    s = spec(gpus=0)
    _mig(s, "1g.10gb\n", 1)
    [r] = (await submit(broker, s)).results
    assert f"{P}.pod_sets[0].shape.mig_profile" in item_fields(r.error)


async def test_job_set_with_a_newline_fails_the_call(broker: Broker) -> None:
    err = await refused(submit(broker, spec(gpus=1), job_set="js\n"))
    assert fields_of(err) == ["job_set_id"]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (svc.ListJobsRequest(queue="default\n"), "queue"),
        (svc.ListJobsRequest(tenant="alpha\x00"), "tenant"),
        (svc.ListJobsRequest(job_set_id="js\n"), "job_set_id"),
        (svc.ListJobsRequest(label_selector={"team": "llm\n"}), "label_selector['team']"),
        (svc.ListJobsRequest(label_selector={f"k{i}": "v" for i in range(100)}), "label_selector"),
        (svc.ListJobsRequest(page_token="not a token\n"), "page_token"),
        (svc.ListJobsRequest(cluster="c" * 254), "cluster"),
        (svc.ListJobsRequest(cluster="eu-a\n"), "cluster"),
        (svc.ListJobsRequest(gpu_model="H" * 64), "gpu_model"),
        (svc.ListJobsRequest(gpu_model="H100 80GB"), "gpu_model"),
    ],
)
async def test_bad_list_filters_are_refused(broker: Broker, request_: svc.ListJobsRequest, field: str) -> None:
    c = broker.client("alpha")
    assert fields_of(await refused(c.jobs.ListJobs(request_, metadata=c.metadata))) == [field]


async def test_bad_free_text_and_names_elsewhere(broker: Broker) -> None:
    c = broker.client("alpha")
    assert fields_of(await refused(c.cancel("jabc", reason="x\x00y"))) == ["reason"]
    assert fields_of(await refused(c.get("jabc\n"))) == ["job_id"]
    assert fields_of(await refused(c.cancel_set("js", reason="r", tenant="alpha\n"))) == ["tenant"]
    key = svc.SubmitJobsRequest(job_set_id="s", validate_only=True)
    key.items.add(idempotency_key="k\x00", spec=spec(gpus=1))
    [r] = (await c.submit_raw(key)).results
    assert item_fields(r.error) == ["items[0].idempotency_key"]
    admin = broker.client("admin")
    assert fields_of(await refused(admin.get_cluster("eu-a\n"))) == ["name"]
    assert fields_of(await refused(admin.cordon("eu-a", "maintenance\x00"))) == ["reason"]
    assert fields_of(
        await refused(admin.clusters.ListClusters(cs.ListClustersRequest(region="eu\n"), metadata=admin.metadata))
    ) == ["region"]


async def test_list_clusters_filters_by_region_and_role(broker: Broker) -> None:
    eu, us = broker.agent("eu-a"), broker.agent("us-a")
    await eu.connect([node("n1")], region="eu")
    await us.connect([node("n2")], region="us")
    admin = broker.client("admin")
    resp = await admin.clusters.ListClusters(cs.ListClustersRequest(region="us"), metadata=admin.metadata)
    assert [c.name for c in resp.clusters] == ["us-a"]
    resp = await admin.clusters.ListClusters(cs.ListClustersRequest(role="inference"), metadata=admin.metadata)
    assert list(resp.clusters) == []
    await eu.close()
    await us.close()


# ----------------------------------------------------------------------------- found by the fuzz suite


async def test_an_error_quoting_huge_input_stays_readable(broker: Broker) -> None:
    """The call's error travels in its trailers; past the client's 8 KiB limit it would arrive as
    RESOURCE_EXHAUSTED ("received metadata size exceeds soft limit") instead of the BadRequest."""
    c = broker.client("alpha")
    for key in ("k" * 20_000, "ü" * 20_000):
        err = await refused(c.jobs.ListJobs(svc.ListJobsRequest(label_selector={key: "v"}), metadata=c.metadata))
        [field] = fields_of(err)
        assert field.startswith("label_selector[") and len(field.encode()) <= 128


async def test_a_thousand_failing_items_still_get_their_answers(broker: Broker) -> None:
    """Each item's error quotes its bad fields; uncapped, the response outgrew what the server may send and
    the whole call failed RESOURCE_EXHAUSTED ("Sent message larger than max")."""
    bad = spec(gpus=1)
    for i in range(150):
        bad.labels[f"!{i}"] = "v"
    req = svc.SubmitJobsRequest(job_set_id="s", validate_only=True)
    for i in range(1000):
        req.items.add(idempotency_key=f"k{i}", spec=bad)
    resp = await broker.client("alpha").submit_raw(req)
    assert len(resp.results) == 1000 and resp.ByteSize() < broker.cfg.tenant_listener.max_message_bytes
    assert all(
        item_fields(r.error) and item_fields(r.error)[0].startswith(f"items[{r.index}].spec.labels[")
        for r in resp.results
    )


async def test_many_violations_stay_readable(broker: Broker) -> None:
    c = broker.client("alpha")
    req = svc.WatchJobsRequest(job_ids=[("J" + "ü" * 30) for _ in range(500)])
    err = await refused(first_event(c, req))
    assert 1 <= len(fields_of(err)) <= 8 and err.details().startswith("500 bad fields")


@pytest.mark.parametrize(
    "requests",
    [
        {"memory": "9" * 4299 + "Ei"},
        {"cpu": "9" * 4299 + "k"},
        {"example.com/fpga": "9" * 4299 + "E"},
    ],
)
async def test_huge_template_quantities_are_refused_not_internal(broker: Broker, requests: dict[str, str]) -> None:
    s = spec(gpus=0)
    s.pod_sets[0].pod_template_json = json.dumps(
        {"spec": {"containers": [{"name": "m", "image": "x", "resources": {"requests": requests}}]}}
    )
    [r] = (await submit(broker, s)).results
    assert item_fields(r.error)


# ----------------------------------------------------------------------------- 6. every INVALID_ARGUMENT names a field


async def test_a_forged_page_token_names_the_page_token(broker: Broker) -> None:
    c = broker.client("alpha")
    err = await refused(c.list(page_token="Zm9yZ2VkLXRva2VuLWZvcmdlZC10b2tlbg"))
    assert fields_of(err) == ["page_token"]
    assert [i.reason for i in status_details(err) if isinstance(i, error_details_pb2.ErrorInfo)] == [
        "INVALID_PAGE_TOKEN"
    ]


def test_every_invalid_argument_names_a_field() -> None:
    assert [v.field for v in errors.InvalidPageToken("forged").details.field_violations] == ["page_token"]
    assert errors.InvalidArgument.fields(errors.FieldViolation("x", "y")).details.field_violations


# ----------------------------------------------------------------------------- 7. the idempotency key's code


async def test_a_reused_idempotency_key_with_another_body_is_already_exists(broker: Broker) -> None:
    c = broker.client("alpha")
    req = svc.SubmitJobsRequest(job_set_id="s")
    req.items.add(idempotency_key="same", spec=spec(gpus=1))
    [first] = (await c.submit_raw(req)).results
    assert first.job_id
    req.items[0].spec.priority = 7
    [again] = (await c.submit_raw(req)).results
    assert again.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    infos = []
    for d in again.error.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            infos.append(info.reason)
    assert infos == ["IDEMPOTENCY_KEY_REUSED"]


def test_proto_comment_and_readme_give_the_same_code_for_a_reused_key() -> None:
    proto = (ROOT / "protos/tandem/v1/job_service.proto").read_text()
    item = proto[proto.index("message SubmitJobItem") : proto.index("message SubmitJobsRequest")]
    comment = " ".join(line.strip().lstrip("/").strip() for line in item.splitlines())
    assert re.search(
        r"different spec it fails with ALREADY_EXISTS, ErrorInfo reason \"IDEMPOTENCY_KEY_REUSED\"", comment
    ), comment
    header = proto[: proto.index("service JobService")]
    assert "ALREADY_EXISTS" in header and not re.search(r"FAILED_PRECONDITION[^*]*IDEMPOTENCY_KEY_REUSED", header)
    readme = (ROOT / "README.md").read_text()
    sentence = " ".join(readme[readme.index("Idempotency keys are per tenant") :].split(". ")[0].split())
    assert "another body is `ALREADY_EXISTS`" in sentence and "IDEMPOTENCY_KEY_REUSED" in sentence, sentence


# ----------------------------------------------------------------------------- response sizes


def _large_spec(i: int, pod_sets: int, blob: int) -> job_pb2.JobSpec:
    """A job near the size bounds: `pod_sets` templates of ~`blob` bytes each (a big env value) and a job
    annotation of ~200 KiB."""
    s = spec(gpus=1)
    del s.pod_sets[:]
    for k in range(pod_sets):
        tpl = json.loads(template(1))
        tpl["spec"]["containers"][0]["env"] = [{"name": "BLOB", "value": "x" * blob}]
        ps = s.pod_sets.add(name=f"w{k}", count=1, pod_template_json=json.dumps(tpl))
        ps.shape.gpu_count = 1
    s.annotations["example.com/blob"] = f"{i}" + "y" * (200 * 1024)
    return s


@pytest.mark.parametrize(
    ("view", "jobs", "pod_sets"),
    [
        (svc.JOB_VIEW_FULL, 5, 5),  # each job ~1.4 MiB in full: a page of 100 would be ~7 MiB
        (svc.JOB_VIEW_BASIC, 24, 1),  # ~200 KiB of annotations each: ~5 MiB in a default page
    ],
)
async def test_list_pages_are_cut_to_what_the_server_may_send(
    broker: Broker, view: int, jobs: int, pod_sets: int
) -> None:
    c = broker.client("alpha", timeout_s=30)
    ids = []
    for i in range(jobs):
        [res] = await c.submit("big", [SubmitItem(f"k{i}", _large_spec(i, pod_sets, 240 * 1024))])
        assert res.job_id, res.error_message
        ids.append(res.job_id)
    seen: list[str] = []
    token, pages = "", 0
    while True:
        page = await c.list(view=view, page_token=token)
        assert page.jobs  # never an empty page before the end
        assert page.ByteSize() <= broker.cfg.tenant_listener.max_message_bytes
        seen += [j.job_id for j in page.jobs]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == ids and pages > 1


async def test_a_spec_past_the_size_bound_is_refused_naming_it(broker: Broker) -> None:
    [res] = await broker.client("alpha").submit("big", [SubmitItem("k", _large_spec(0, 7, 240 * 1024))])
    assert not res.job_id and res.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "items[0].spec" in res.error_message and "bytes serialized" in res.error_message


def test_mig_demand_counts_compute_slices_as_the_quota_does() -> None:
    """A job's GPU demand (fair share, pending GPUs) counts a MIG instance as the core's quota charge does:
    compute slices over the GPU's slices, so 2 x 3g.40gb is 6/7 of a GPU, not 2/7."""
    s = spec(gpus=0, replicas=2)
    _mig(s, profile="3g.40gb", count=1)
    req = svc.SubmitJobsRequest(job_set_id="mig")
    req.items.add(idempotency_key="k", spec=s)
    [item] = serde.parse_items(req, "alpha")
    assert item.error is None and item.new_job is not None
    assert item.new_job.gpus == pytest.approx(2 * mig_gpus("3g.40gb", None, 1)) == pytest.approx(6 / 7)
