"""The round-trip case table: every builder's output, and the tandem.v1 descriptors it must cover."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from tests.protos import builders as b
from tests.protos import builders_cluster as bc

PROTO_DIR = Path(__file__).resolve().parents[2] / "protos" / "tandem" / "v1"


def pb2_modules() -> list[ModuleType]:
    """The generated module of every .proto file in the package (new files are picked up)."""
    return [importlib.import_module(f"tandem.v1.{p.stem}_pb2") for p in sorted(PROTO_DIR.glob("*.proto"))]


def _walk_descriptors(desc: Descriptor) -> Iterator[Descriptor]:
    if desc.GetOptions().map_entry:
        return  # synthetic map entry types are covered through their map field
    yield desc
    for nested in desc.nested_types:
        yield from _walk_descriptors(nested)


def all_message_descriptors() -> list[Descriptor]:
    """Every message type declared in the tandem.v1 files (nested ones included)."""
    out: list[Descriptor] = []
    for module in pb2_modules():
        for desc in module.DESCRIPTOR.message_types_by_name.values():
            out.extend(_walk_descriptors(desc))
    return out


def all_cases() -> list[Message]:
    """One or more populated instances per message type; oneofs get one instance per member."""
    cases: list[Message] = [
        # common
        b.attempt_ref(),
        b.topology_segment(),
        b.topology_path(),
        b.replica_placement(),
        b.replica_status(),
        b.node_fit_result(),
        b.log_url_template(),
        b.log_link(),
        # job
        b.device_request(),
        b.pod_shape(),
        b.pod_set(),
        b.topology_constraint(),
        b.cluster_selector(),
        b.data_locality(),
        b.job_spec(),
        b.attempt(),
        b.dispatch_rejection(),
        b.state_transition(),
        b.queue_info(),
        b.cluster_verdict(),
        b.job_status(),
        b.job(),
        # inventory
        b.taint(),
        b.node_resources(),
        b.mig_instance(),
        b.gpu_device(),
        *b.attribute_values(),
        b.dra_device(),
        b.node_inventory(),
        b.cluster_metadata(),
        b.reservation_progress(),
        b.inventory_snapshot(),
        b.inventory_delta(),
        # job service
        b.submit_job_item(),
        b.submit_jobs_request(),
        *b.submit_job_results(),
        b.submit_jobs_response(),
        b.get_job_request(),
        b.get_job_response(),
        b.list_jobs_request(),
        b.list_jobs_response(),
        b.watch_jobs_request(),
        b.job_event(),
        b.cancel_job_request(),
        b.cancel_job_response(),
        b.cancel_job_set_request(),
        b.cancel_job_set_response(),
        b.get_usage_request(),
        b.tenant_usage(),
        b.get_usage_response(),
        b.export_usage_request(),
        b.usage_record(),
        b.export_usage_response(),
        b.requeue_job_request(),
        b.requeue_job_response(),
        b.set_job_priority_request(),
        b.set_job_priority_response(),
        b.hold_job_request(),
        b.hold_job_response(),
        b.release_job_request(),
        b.release_job_response(),
        # cluster service: stream
        *bc.agent_messages(),
        bc.topology_level(),
        bc.known_attempt(),
        bc.agent_capabilities(),
        bc.tenant_namespaces(),
        bc.hello(),
        bc.dispatch_ack(),
        bc.pod_scheduling_feedback(),
        bc.scheduling_feedback(),
        bc.workload_status(),
        bc.cancel_ack(),
        bc.heartbeat(),
        *bc.broker_messages(),
        bc.welcome(),
        bc.node_replica_count(),
        bc.pod_set_dispatch(),
        bc.rendezvous_info(),
        bc.dispatch(),
        bc.start(),
        bc.cancel(),
        bc.ack(),
        bc.resync_request(),
        bc.hold_nodes(),
        bc.release_hold(),
        # cluster service: admin
        bc.gpu_model_count(),
        bc.domain_summary(),
        bc.cluster_summary(),
        bc.list_clusters_request(),
        bc.list_clusters_response(),
        bc.get_cluster_request(),
        bc.get_cluster_response(),
        bc.cordon_request(),
        bc.cordon_response(),
        bc.uncordon_request(),
        bc.uncordon_response(),
    ]
    return cases


def case_id(message: Message) -> str:
    """Readable pytest id: the type name, plus the set oneof member when there is one."""
    name = message.DESCRIPTOR.name
    members = [message.WhichOneof(o.name) for o in message.DESCRIPTOR.oneofs if not o.name.startswith("_")]
    chosen = [m for m in members if m]
    return f"{name}[{','.join(chosen)}]" if chosen else name


def set_fields(message: Message) -> Iterator[tuple[str, str]]:
    """(message full name, field name) for every field set anywhere inside `message`."""
    for field, value in message.ListFields():
        yield message.DESCRIPTOR.full_name, field.name
        if field.type != FieldDescriptor.TYPE_MESSAGE or field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value.values():
                    yield from set_fields(item)
        elif field.is_repeated:
            for item in value:
                yield from set_fields(item)
        else:
            yield from set_fields(value)
