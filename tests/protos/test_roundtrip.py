"""Every tandem.v1 message survives binary and JSON round trips fully populated, and none is left untested."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from tandem.v1 import common_pb2, inventory_pb2, job_pb2, job_service_pb2
from tests.protos import builders as b
from tests.protos import cases

CASES = cases.all_cases()


@pytest.mark.parametrize("message", CASES, ids=cases.case_id)
def test_binary_round_trip(message: Message) -> None:
    assert message.ListFields(), "a case must be populated"
    wire = message.SerializeToString(deterministic=True)
    parsed = type(message).FromString(wire)
    assert parsed == message
    assert parsed.SerializeToString(deterministic=True) == wire


@pytest.mark.parametrize("message", CASES, ids=cases.case_id)
@pytest.mark.parametrize("proto_names", [False, True], ids=["camelCase", "proto_names"])
def test_json_round_trip(message: Message, proto_names: bool) -> None:
    text = json_format.MessageToJson(message, preserving_proto_field_name=proto_names)
    parsed = json_format.Parse(text, type(message)())
    assert parsed == message


def test_every_message_has_a_populated_case() -> None:
    """A new message without a builder case fails here (so it cannot ship untested)."""
    declared = {d.full_name for d in cases.all_message_descriptors()}
    rooted = {m.DESCRIPTOR.full_name for m in CASES if m.ListFields()}
    missing = sorted(declared - rooted)
    assert not missing, f"messages without a populated round-trip case in tests/protos/cases.py: {missing}"


def test_every_field_and_oneof_member_is_populated_somewhere() -> None:
    """Cases must set every field (non-default, each oneof member at least once), so a new field is exercised too."""
    covered: set[tuple[str, str]] = set()
    for message in CASES:
        covered.update(cases.set_fields(message))
    missing = sorted(
        f"{d.full_name}.{f.name}"
        for d in cases.all_message_descriptors()
        for f in d.fields
        if (d.full_name, f.name) not in covered
    )
    assert not missing, f"fields never set to a non-default value by any case: {missing}"


def test_descriptor_enumeration_sees_all_files() -> None:
    names = {m.DESCRIPTOR.name for m in cases.pb2_modules()}
    assert {
        "tandem/v1/common.proto",
        "tandem/v1/job.proto",
        "tandem/v1/inventory.proto",
        "tandem/v1/job_service.proto",
        "tandem/v1/cluster_service.proto",
    } <= names
    assert len(cases.all_message_descriptors()) >= 70


def test_optional_fields_keep_presence_of_zero() -> None:
    """`optional` scalars distinguish 'zero' from 'absent' on the wire and in JSON."""
    for message, field in [
        (job_pb2.QueueInfo(position=0), "position"),
        (common_pb2.ReplicaStatus(exit_code=0), "exit_code"),
        (job_pb2.JobSpec(min_available=0), "min_available"),
        (common_pb2.TopologySegment(value=""), "value"),
    ]:
        for parsed in (
            type(message).FromString(message.SerializeToString()),
            json_format.Parse(json_format.MessageToJson(message), type(message)()),
        ):
            assert parsed.HasField(field)
        assert not type(message)().HasField(field)


def test_missing_topology_label_differs_from_empty_label_value() -> None:
    path = b.topology_path()
    assert [s.HasField("value") for s in path.segments] == [True, True, True, False]
    assert path.segments[1].value == ""


def test_large_uint64_revision_is_a_json_string() -> None:
    data = json.loads(json_format.MessageToJson(b.job_status()))
    assert data["revision"] == "9007199254740993"


def test_unknown_enum_value_survives_a_round_trip() -> None:
    """Enums are open: a newer peer's value is kept, not dropped (receivers treat it as UNSPECIFIED)."""
    status = job_pb2.JobStatus(state=job_pb2.JobState.ValueType(99))
    parsed = job_pb2.JobStatus.FromString(status.SerializeToString())
    assert parsed.state == 99


def test_unknown_fields_from_a_newer_peer_are_preserved() -> None:
    """Adding a field later is not a breaking change: an old reader keeps and re-sends it."""
    newer = b.node_inventory().SerializeToString() + b"\xa8\x06\x07"  # field 101, varint 7
    old = inventory_pb2.NodeInventory.FromString(newer)
    assert old.SerializeToString().endswith(b"\xa8\x06\x07")
    old.DiscardUnknownFields()
    assert old == b.node_inventory()


def test_submit_result_oneof_is_exclusive() -> None:
    result = job_service_pb2.SubmitJobResult(job_id="j1")
    result.error.CopyFrom(b.rpc_error())
    assert result.WhichOneof("result") == "error"
    assert result.job_id == ""
