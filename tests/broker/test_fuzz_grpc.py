"""Every JobService and ClusterService method, on both listeners, under mutated real-format messages, random bytes
and truncated messages, over real gRPC.

Properties: the server never dies and keeps answering; no call ends UNKNOWN, INTERNAL or UNAVAILABLE (or any
other code outside the contract); every INVALID_ARGUMENT — of a call, or of one SubmitJobs item — carries a
BadRequest with at least one field violation; a valid request afterwards still gets the right answer; memory
does not grow without bound. Example counts are bounded (the file runs in a few seconds).

The broker runs on its own event loop in a background thread; the test drives it with blocking grpcio
channels (hypothesis runs plain functions).
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import os
import random
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_service_pb2 as svc
from tests.broker.hub_builders import TOKENS, Broker, ScriptedAgent, node, spec, start_broker
from tests.protos import builders as pb
from tests.protos import builders_cluster as pbc

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")
C = grpc.StatusCode
NEVER = {C.UNKNOWN, C.INTERNAL, C.UNAVAILABLE, C.DATA_LOSS}
ANSWERS = {
    C.OK,
    C.INVALID_ARGUMENT,
    C.NOT_FOUND,
    C.ALREADY_EXISTS,
    C.PERMISSION_DENIED,
    C.FAILED_PRECONDITION,
    C.OUT_OF_RANGE,
    C.RESOURCE_EXHAUSTED,
    C.UNAUTHENTICATED,
}
"""What the contract lets a unary call end with (RESOURCE_EXHAUSTED: rate limits and quotas)."""
FUZZ_CLUSTER = "fuzz-c9"
MAX_REQUEST = 4 << 20
"""The tenant listener's receive limit: grpcio itself refuses larger requests (RESOURCE_EXHAUSTED, see
test_validation_fields), so the fuzz does not send them."""
SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


# ----------------------------------------------------------------------------- the broker under test


@dataclass
class Live:
    loop: asyncio.AbstractEventLoop
    broker: Broker
    tenant: grpc.Channel
    agents: grpc.Channel
    known_job: str

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _md(who: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[who]}"),)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzzed-broker", daemon=True)
    thread.start()

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    broker = run(start_broker(tmp_path_factory.mktemp("fuzz")))

    async def cluster() -> ScriptedAgent:  # a connected cluster: submissions reach the fit and the placer
        agent = broker.agent("c1")
        await agent.connect([node("n1"), node("n2", rack="r2")])
        return agent

    agent = run(cluster())
    cert, key = broker.pki.issue(FUZZ_CLUSTER)
    agents = grpc.secure_channel(
        broker.agent_addr,
        grpc.ssl_channel_credentials(broker.pki.ca_pem, key.read_bytes(), cert.read_bytes()),
        options=[("grpc.ssl_target_name_override", "localhost")],
    )
    tenant = grpc.insecure_channel(broker.tenant_addr)
    req = svc.SubmitJobsRequest(job_set_id="fuzz-known")
    req.items.add(idempotency_key="known", spec=spec(gpus=1))
    resp = svc.SubmitJobsResponse.FromString(
        tenant.unary_unary("/tandem.v1.JobService/SubmitJobs")(req.SerializeToString(), metadata=_md("alpha"))
    )
    assert resp.results[0].job_id, resp
    yield Live(loop, broker, tenant, agents, resp.results[0].job_id)
    tenant.close()
    agents.close()
    run(agent.close())
    run(broker.close())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


# ----------------------------------------------------------------------------- the methods and their real messages


def _valid_submit() -> svc.SubmitJobsRequest:
    req = svc.SubmitJobsRequest(job_set_id="fuzz", validate_only=True)
    req.items.add(idempotency_key="k", spec=spec(gpus=1, level="rack"))
    full = pb.job_spec()
    full.tenant, full.job_set_id = "", ""
    req.items.add(idempotency_key="full", spec=full)
    return req


@dataclass(frozen=True)
class Rpc:
    path: str
    base: Callable[[], Message]
    who: str
    response: type[Message]
    streaming: bool = False


RPCS = {
    "SubmitJobs": Rpc("/tandem.v1.JobService/SubmitJobs", _valid_submit, "alpha", svc.SubmitJobsResponse),
    "GetJob": Rpc("/tandem.v1.JobService/GetJob", pb.get_job_request, "alpha", svc.GetJobResponse),
    "ListJobs": Rpc("/tandem.v1.JobService/ListJobs", pb.list_jobs_request, "admin", svc.ListJobsResponse),
    "WatchJobs": Rpc("/tandem.v1.JobService/WatchJobs", pb.watch_jobs_request, "admin", svc.JobEvent, True),
    "CancelJob": Rpc("/tandem.v1.JobService/CancelJob", pb.cancel_job_request, "alpha", svc.CancelJobResponse),
    "CancelJobSet": Rpc(
        "/tandem.v1.JobService/CancelJobSet", pb.cancel_job_set_request, "admin", svc.CancelJobSetResponse
    ),
    "GetUsage": Rpc("/tandem.v1.JobService/GetUsage", pb.get_usage_request, "admin", svc.GetUsageResponse),
    "ExportUsage": Rpc("/tandem.v1.JobService/ExportUsage", pb.export_usage_request, "alpha", svc.ExportUsageResponse),
    "RequeueJob": Rpc("/tandem.v1.JobService/RequeueJob", pb.requeue_job_request, "alpha", svc.RequeueJobResponse),
    "SetJobPriority": Rpc(
        "/tandem.v1.JobService/SetJobPriority", pb.set_job_priority_request, "admin", svc.SetJobPriorityResponse
    ),
    "HoldJob": Rpc("/tandem.v1.JobService/HoldJob", pb.hold_job_request, "alpha", svc.HoldJobResponse),
    "ReleaseJob": Rpc("/tandem.v1.JobService/ReleaseJob", pb.release_job_request, "admin", svc.ReleaseJobResponse),
    "ListClusters": Rpc(
        "/tandem.v1.ClusterService/ListClusters", pbc.list_clusters_request, "alpha", cs.ListClustersResponse
    ),
    "GetCluster": Rpc("/tandem.v1.ClusterService/GetCluster", pbc.get_cluster_request, "admin", cs.GetClusterResponse),
    "Cordon": Rpc("/tandem.v1.ClusterService/Cordon", pbc.cordon_request, "admin", cs.CordonResponse),
    "Uncordon": Rpc("/tandem.v1.ClusterService/Uncordon", pbc.uncordon_request, "admin", cs.UncordonResponse),
}
CONNECT = "/tandem.v1.ClusterService/Connect"


# ----------------------------------------------------------------------------- bad values


def _deep(n: int, open_: str = "[", close: str = "]") -> str:
    return open_ * n + close * n


_TEMPLATE = '{"spec":{"containers":[{"name":"m","image":"x","args":@}]}}'
TEMPLATES = st.one_of(
    st.integers(1, 5000).map(lambda n: _TEMPLATE.replace("@", _deep(n))),
    st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(1000, 400_000).map(lambda n: json.dumps({"spec": {"containers": [{"name": "m", "image": "x" * n}]}})),
    st.sampled_from(
        [
            "",
            "{",
            "[]",
            "null",
            "9" * 5000,
            '{"spec":{"containers":[{"name":"m","image":"x",'
            '"resources":{"requests":{"memory":"' + "9" * 4299 + 'Ei"}}}]}}',
            '{"spec":{"containers":[{"name":"m","image":"x","resources":{"limits":{"cpu":"1e64"}}}]}}',
            '{"spec":{"containers":"x"}}',
            '{"spec":{"containers":[1,null,"x"]}}',
        ]
    ),
    st.text(max_size=50),
)
_CHUNKS = st.tuples(
    st.sampled_from(["a", "\n", "\x00", "ü", "✓", "{", "[", "/", ".", "-", "A", " ", "+1"]), st.integers(0, 20_000)
).map(lambda t: t[0] * t[1])
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=30),
    st.sampled_from(
        [
            "",
            "\n",
            "x\n",
            "default\n",
            "\x00",
            "a\x00b",
            "ü✓",
            "../..",
            "UPPER",
            "a" * 64,
            "a" * 300,
            "eu-a",
            "c1",
            "alpha",
            "beta",
            "default",
            "1g.10gb\n",
            "device.attributes[",
            "1" + "+1" * 30_000 + " > 0",
            "jabc\n",
        ]
    ),
    _CHUNKS,
)
_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
}


def _scalar(fd: Any) -> st.SearchStrategy[Any]:
    """Values a scalar field of `fd`'s type can hold, weighted to the edges."""
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        return TEMPLATES if fd.name == "pod_template_json" else TEXT
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.sampled_from([0.0, -1.0, 1e308, float("inf"), float("nan")])
    if t == FieldDescriptor.TYPE_ENUM:
        known = sorted(fd.enum_type.values_by_number)
        return st.one_of(
            st.sampled_from(known),
            st.sampled_from([999, -1, (1 << 31) - 1, -(1 << 31)]),
            st.integers(-(1 << 31), (1 << 31) - 1),
        )
    lo, hi = _RANGES[t]
    edges = sorted(
        {
            lo,
            hi,
            0,
            1,
            min(hi, 1000),
            min(hi, 99_999),
            min(hi, 100_000),
            hi // 2 + 1,
            max(lo, -1),
            min(hi, 1 << 62),
            min(hi, (1 << 63) - 1),
        }
    )
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _slots(msg: Message, depth: int = 0) -> list[tuple[Message, Any]]:
    """Every (message, field) of the tree, set or not: where a mutation can land."""
    out = [(msg, fd) for fd in msg.DESCRIPTOR.fields]
    if depth > 6:
        return out
    for fd, value in msg.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if fd.message_type.GetOptions().map_entry:
            if fd.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                for v in list(value.values())[:3]:
                    out.extend(_slots(v, depth + 1))
        elif fd.is_repeated:
            for m in list(value)[:3]:
                out.extend(_slots(m, depth + 1))
        else:
            out.extend(_slots(value, depth + 1))
    return out


def _mutate_slot(data: st.DataObject, msg: Message, fd: Any) -> None:
    field = getattr(msg, fd.name)
    if fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
        kfd, vfd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        key = data.draw(_scalar(kfd))
        if vfd.type == FieldDescriptor.TYPE_MESSAGE:
            field[key].SetInParent()
        else:
            field[key] = data.draw(_scalar(vfd))
        return
    if fd.is_repeated:
        action = data.draw(st.sampled_from(["clear", "append", "many"]))
        if action == "clear":
            del field[:]
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            model = field[0] if len(field) and action == "many" else None
            for _ in range(1 if action == "append" else data.draw(st.integers(2, 300))):
                added = field.add()
                if model is not None:
                    added.CopyFrom(model)
        else:
            value = data.draw(_scalar(fd))
            field.extend([value] * (1 if action == "append" else data.draw(st.integers(2, 2000))))
        return
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        if data.draw(st.booleans()):
            msg.ClearField(fd.name)
        else:
            field.SetInParent()
        return
    setattr(msg, fd.name, data.draw(_scalar(fd)))


def mutated(data: st.DataObject, base: Message) -> Message:
    """A copy of `base` with one to four fields anywhere in its tree given bad (or merely odd) values."""
    msg = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(1, 4))):
        slot, fd = data.draw(st.sampled_from(_slots(msg)))
        _mutate_slot(data, slot, fd)
    return msg


# ----------------------------------------------------------------------------- calling and judging


def _bad_request_ok(status: status_pb2.Status) -> bool:
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            return len(bad.field_violations) > 0
    return False


def _reasons(status: status_pb2.Status) -> list[str]:
    out = []
    for d in status.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            out.append(info.reason)
    return out


def judge(code: grpc.StatusCode, err: grpc.RpcError | None, allowed: set[grpc.StatusCode] = ANSWERS) -> None:
    """The call ended within the contract; a refusal is the broker's own (a google.rpc.Status it wrote)."""
    text = err.details() if err is not None else ""  # type: ignore[attr-defined]
    assert code not in NEVER, (code, text)
    assert code in allowed, (code, text)
    if code in (C.OK, C.UNIMPLEMENTED, C.DEADLINE_EXCEEDED, C.UNAUTHENTICATED):
        return
    assert err is not None
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None and _reasons(status), (code, text)  # not grpcio's own (e.g. message too large)
    if code == C.INVALID_ARGUMENT:
        assert _bad_request_ok(status), text
    if code == C.RESOURCE_EXHAUSTED:
        assert _reasons(status)[0] in ("RATE_LIMITED", "QUOTA_EXCEEDED"), (code, text)


def call(live: Live, name: str, payload: bytes, *, channel: grpc.Channel | None = None) -> tuple[grpc.StatusCode, Any]:
    """One call of `name` with raw request bytes: (code, response or error)."""
    rpc = RPCS[name]
    ch = channel or live.tenant
    try:
        if rpc.streaming:  # the first event, or the refusal; a valid watch of a future revision waits
            stream = ch.unary_stream(rpc.path)(payload, metadata=_md(rpc.who), timeout=0.25)
            try:
                for ev in stream:
                    return C.OK, rpc.response.FromString(ev)
                return C.OK, None
            finally:
                stream.cancel()
        raw = ch.unary_unary(rpc.path)(payload, metadata=_md(rpc.who), timeout=10)
        return C.OK, rpc.response.FromString(raw)
    except grpc.RpcError as exc:
        return exc.code(), exc  # type: ignore[attr-defined]


def judge_call(live: Live, name: str, payload: bytes) -> None:
    if len(payload) > MAX_REQUEST:
        return  # the client itself refuses to send it
    code, out = call(live, name, payload)
    extra = {C.DEADLINE_EXCEEDED} if RPCS[name].streaming else set()
    judge(code, out if code != C.OK else None, ANSWERS | extra)
    if code == C.OK and isinstance(out, svc.SubmitJobsResponse):
        for r in out.results:
            if r.WhichOneof("result") == "error":
                assert r.error.code not in (2, 13, 14), r.error
                assert r.error.code != 3 or _bad_request_ok(r.error), r.error


def still_serving(live: Live) -> None:
    """A valid request gets the right answer."""
    raw = live.tenant.unary_unary(RPCS["GetJob"].path)(
        svc.GetJobRequest(job_id=live.known_job).SerializeToString(), metadata=_md("alpha"), timeout=10
    )
    assert svc.GetJobResponse.FromString(raw).job.job_id == live.known_job


# ----------------------------------------------------------------------------- unary methods


@pytest.mark.parametrize("name", sorted(RPCS))
@settings(SETTINGS, max_examples=25)
@given(data=st.data())
def test_mutated_requests_are_answered_by_the_contract(live: Live, name: str, data: st.DataObject) -> None:
    judge_call(live, name, mutated(data, RPCS[name].base()).SerializeToString())
    still_serving(live)


@settings(SETTINGS, max_examples=30)
@given(template=TEMPLATES, where=st.integers(0, 1))
def test_mutated_pod_templates_are_answered_by_the_contract(live: Live, template: str, where: int) -> None:
    req = _valid_submit()
    req.items[where].spec.pod_sets[0].pod_template_json = template
    judge_call(live, "SubmitJobs", req.SerializeToString())


@pytest.mark.parametrize("name", sorted(RPCS))
@settings(SETTINGS, max_examples=12)
@given(payload=st.binary(max_size=300))
def test_random_bytes_are_answered_by_the_contract(live: Live, name: str, payload: bytes) -> None:
    judge_call(live, name, payload)


@pytest.mark.parametrize("name", sorted(RPCS))
@settings(SETTINGS, max_examples=8)
@given(data=st.data())
def test_truncated_messages_are_answered_by_the_contract(live: Live, name: str, data: st.DataObject) -> None:
    raw = RPCS[name].base().SerializeToString()
    judge_call(live, name, raw[: data.draw(st.integers(0, max(0, len(raw) - 1)))])


@pytest.mark.parametrize("name", sorted(RPCS))
def test_the_agent_listener_serves_only_connect(live: Live, name: str) -> None:
    for payload in (RPCS[name].base().SerializeToString(), b"\xff\xff"):
        code, err = call(live, name, payload, channel=live.agents)
        assert code == C.UNIMPLEMENTED, (code, err)


# ----------------------------------------------------------------------------- the agent stream


def _hello() -> cs.AgentMessage:
    msg = pbc.agent_messages()[0]
    msg.hello.cluster_name = FUZZ_CLUSTER
    msg.hello.leader_epoch = (1 << 64) - 1  # no fuzzed epoch can depose the next example's stream
    return msg


def connect(live: Live, frames: list[bytes]) -> tuple[grpc.StatusCode, grpc.RpcError | None]:
    """A Connect stream sending `frames` then closing its side: how the broker ends it."""
    stream = live.agents.stream_stream(CONNECT)(iter(frames), timeout=10)
    try:
        for _ in stream:
            pass
        return C.OK, None
    except grpc.RpcError as exc:
        return exc.code(), exc  # type: ignore[attr-defined]


@settings(SETTINGS, max_examples=60)
@given(data=st.data())
def test_agent_stream_messages_are_answered_by_the_contract(live: Live, data: st.DataObject) -> None:
    messages = pbc.agent_messages()
    which = data.draw(st.integers(0, len(messages) - 1))
    target = _hello() if which == 0 else messages[which]
    form = data.draw(st.sampled_from(["mutated", "mutated", "mutated", "random", "truncated"]))
    if form == "mutated":
        frame = mutated(data, target).SerializeToString()
    elif form == "random":
        frame = data.draw(st.binary(max_size=300))
    else:
        raw = target.SerializeToString()
        frame = raw[: data.draw(st.integers(0, len(raw) - 1))]
    frames = [frame] if which == 0 else [_hello().SerializeToString(), frame]
    code, err = connect(live, frames)
    # PERMISSION_DENIED: a Hello for another cluster; FAILED_PRECONDITION: protocol version, deposed leader;
    # ABORTED: superseded by a newer stream of the cluster.
    judge(code, err, {C.OK, C.INVALID_ARGUMENT, C.PERMISSION_DENIED, C.FAILED_PRECONDITION, C.ABORTED})
    if not _readable(frame):  # never dropped silently: the stream ends naming the message
        assert code == C.INVALID_ARGUMENT, (code, frame[:80])
    if code == C.INVALID_ARGUMENT:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
        assert status is not None
        bad = error_details_pb2.BadRequest()
        next(d for d in status.details if d.Is(bad.DESCRIPTOR)).Unpack(bad)
        assert all(v.field.startswith("messages[") for v in bad.field_violations), bad


def _readable(frame: bytes) -> bool:
    """The test's own oracle (not the broker's code): the frame parses and every enum number in it is defined."""
    try:
        msg = cs.AgentMessage.FromString(frame)
    except Exception:
        return False
    return not any(fd.type == FieldDescriptor.TYPE_ENUM and _unknown(fd, v) for fd, v in _leaves(msg))


def _unknown(fd: Any, value: Any) -> bool:
    values = value if isinstance(value, (list, tuple)) else [value]
    return any(fd.enum_type.values_by_number.get(v) is None for v in values)


def _leaves(msg: Message) -> Iterator[tuple[Any, Any]]:
    for fd, value in msg.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            yield fd, list(value) if fd.is_repeated else value
        elif fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            for v in value.values():
                if vfd.type == FieldDescriptor.TYPE_MESSAGE:
                    yield from _leaves(v)
                else:
                    yield vfd, v
        else:
            for m in value if fd.is_repeated else [value]:
                yield from _leaves(m)


def test_a_clean_agent_stream_works_after_the_fuzz(live: Live) -> None:
    hb = cs.AgentMessage(sequence=2, heartbeat=cs.Heartbeat(leader=True))
    assert connect(live, [_hello().SerializeToString(), hb.SerializeToString()])[0] == C.OK
    still_serving(live)
    req = svc.SubmitJobsRequest(job_set_id="after-fuzz", validate_only=True)
    req.items.add(idempotency_key="k", spec=spec(gpus=1))
    code, out = call(live, "SubmitJobs", req.SerializeToString())
    assert code == C.OK and out.results[0].WhichOneof("result") == "valid", out


# ----------------------------------------------------------------------------- memory


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _junk(rng: random.Random) -> tuple[str, bytes]:
    """One bad request of a few hundred KiB at most, drawn from the same kinds as the properties above."""
    kind = rng.randrange(4)
    if kind == 0:
        return "SubmitJobs", _with_template(_TEMPLATE.replace("@", _deep(rng.randrange(1, 20_000))))
    if kind == 1:
        return "SubmitJobs", _with_template(
            json.dumps({"spec": {"containers": [{"name": "m", "image": "x" * 200_000}]}})
        )
    if kind == 2:
        return rng.choice(sorted(RPCS)), rng.randbytes(rng.randrange(1, 2000))
    raw = RPCS["ListJobs"].base().SerializeToString()
    return "ListJobs", raw[: rng.randrange(len(raw))]


def _with_template(text: str) -> bytes:
    req = _valid_submit()
    req.items[0].spec.pod_sets[0].pod_template_json = text
    return req.SerializeToString()


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc")
def test_memory_does_not_grow_without_bound(live: Live) -> None:
    rng = random.Random(7)
    for _ in range(100):  # warm-up: caches, allocator arenas
        judge_call(live, *_junk(rng))
    gc.collect()
    before = _rss_bytes()
    for _ in range(400):
        judge_call(live, *_junk(rng))
    gc.collect()
    grown = _rss_bytes() - before
    # The 400 requests carry ~22 MiB of bad input and the process grows ~1 MiB here: keeping even most of
    # each request would show.
    assert grown < 16 << 20, f"RSS grew {grown / 2**20:.1f} MiB over 400 bad requests"
    still_serving(live)
