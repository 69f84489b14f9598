"""Fully populated tandem.v1 messages (every field non-default somewhere), for round-trip tests."""

from __future__ import annotations

from google.protobuf import duration_pb2, empty_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from tandem.v1 import common_pb2 as c
from tandem.v1 import inventory_pb2 as inv
from tandem.v1 import job_pb2 as j
from tandem.v1 import job_service_pb2 as js


def ts(seconds: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=1_780_000_000 + seconds, nanos=nanos)


def dur(seconds: int, nanos: int = 0) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


# --------------------------------------------------------------------------- common


def attempt_ref(job: str = "train-7f3k", attempt: int = 2) -> c.AttemptRef:
    return c.AttemptRef(job_id=job, attempt=attempt)


def topology_segment(value: str = "rack-1") -> c.TopologySegment:
    return c.TopologySegment(value=value)


def topology_path() -> c.TopologyPath:
    # The last segment has no value: the node lacks that level's label.
    return c.TopologyPath(
        segments=[topology_segment("eu-west-1a"), topology_segment(""), topology_segment("r1"), c.TopologySegment()]
    )


def replica_placement(pod_set: str = "worker", index: int = 3, node: str = "gpu-node-17") -> c.ReplicaPlacement:
    return c.ReplicaPlacement(pod_set=pod_set, index=index, node=node)


def replica_status() -> c.ReplicaStatus:
    return c.ReplicaStatus(
        pod_set="worker",
        index=1,
        pod_name="train-7f3k-2-worker-1-x8kq2",
        node="gpu-node-17",
        phase=c.REPLICA_PHASE_FAILED,
        exit_code=137,
        reason="OOMKilled",
        message="container main exceeded its memory limit",
        start_time=ts(60),
        finish_time=ts(3600, 5),
        restart_count=1,
    )


def node_fit_result() -> c.NodeFitResult:
    return c.NodeFitResult(
        node="gpu-node-3",
        fits=True,
        reasons=[c.FIT_REASON_INSUFFICIENT_GPUS, c.FIT_REASON_RESERVED_FOR_GANG],
        message="needs 4 GPUs, 2 free",
    )


def log_url_template() -> c.LogUrlTemplate:
    return c.LogUrlTemplate(name="logs", url_template="https://grafana.example/explore?ns={namespace}&pod={pod}")


def log_link() -> c.LogLink:
    return c.LogLink(name="logs", url="https://grafana.example/explore?ns=team-a&pod=p-0", pod_set="worker", index=0)


# --------------------------------------------------------------------------- job


def device_request() -> j.DeviceRequest:
    return j.DeviceRequest(
        name="gpus",
        device_class_name="gpu.nvidia.com",
        selectors=['device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100"'],
        count=2,
        allocation_mode=j.DEVICE_ALLOCATION_MODE_EXACT_COUNT,
    )


def pod_shape() -> j.PodShape:
    return j.PodShape(
        gpu_count=8,
        allowed_gpu_models=["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"],
        min_gpu_memory_mib=81_559,
        gpu_milli=1000,
        mig_profile="1g.10gb",
        mig_count=2,
        device_requests=[device_request()],
        cpu_milli=96_000,
        memory_bytes=1_099_511_627_776,
        extended_resources={"rdma/hca_shared_devices_a": 1, "example.com/fpga": 2},
    )


def pod_set(name: str = "worker") -> j.PodSet:
    return j.PodSet(
        name=name,
        count=16,
        shape=pod_shape(),
        pod_template_json='{"metadata":{"labels":{"app":"train"}},"spec":{"containers":[{"name":"main","image":"x"}]}}',
        fixed_count=True,
    )


def topology_constraint() -> j.TopologyConstraint:
    return j.TopologyConstraint(required_level="topology.kubernetes.io/zone", preferred_level="rack")


def cluster_selector() -> j.ClusterSelector:
    return j.ClusterSelector(clusters=["eu-a", "eu-b"], regions=["eu-west"], roles=["training"])


def data_locality() -> j.DataLocality:
    return j.DataLocality(preferred_regions=["eu-west"], preferred_clusters=["eu-a"])


def job_spec() -> j.JobSpec:
    return j.JobSpec(
        tenant="acme",
        queue="research",
        priority=-5,
        priority_band="batch",
        preemptible=True,
        max_runtime=dur(86_400),
        pod_sets=[pod_set("head"), pod_set("worker")],
        min_available=9,
        framework=j.FRAMEWORK_TORCHRUN,
        topology=topology_constraint(),
        cluster_selector=cluster_selector(),
        data_locality=data_locality(),
        labels={"team": "nlp", "run": "r42"},
        annotations={"example.com/note": "ünïcode ✓"},
        job_set_id="sweep-2026-11-30",
        display_name="llm pretrain shard 3",
        start_timeout=dur(900),
        max_infra_retries=3,
        termination_grace_period=dur(120, 500_000_000),
        rendezvous_port=29_500,
        namespace_hint="team-acme-batch",
    )


def dispatch_rejection() -> j.DispatchRejection:
    return j.DispatchRejection(
        reason=j.DISPATCH_REJECT_REASON_DOES_NOT_FIT,
        message="gpu-node-3: 2 of 8 GPUs free",
        nodes=["gpu-node-3", "gpu-node-4"],
        node_results=[node_fit_result()],
    )


def attempt() -> j.Attempt:
    return j.Attempt(
        number=2,
        cluster="eu-a",
        domain=topology_path(),
        assignments=[replica_placement(), replica_placement("head", 0, "gpu-node-1")],
        replicas=[replica_status()],
        namespace="team-acme",
        gpu_model="NVIDIA-H100-80GB-HBM3",
        reserve_time=ts(1),
        dispatch_time=ts(2),
        accept_time=ts(3),
        start_time=ts(4),
        running_time=ts(5),
        end_time=ts(6),
        outcome=j.ATTEMPT_OUTCOME_APP_FAILED,
        exit_code=1,
        outcome_message="worker 1 exited with 1",
        rendezvous_address="train-7f3k-2-head-0.train-7f3k-2:29500",
        log_links=[log_link()],
        rejection=dispatch_rejection(),
        spent_retry=True,
        domain_level="rack",
    )


def state_transition() -> j.StateTransition:
    return j.StateTransition(
        from_state=j.JOB_STATE_STARTING,
        to_state=j.JOB_STATE_RUNNING,
        time=ts(10),
        attempt=2,
        reason="GangStarted",
        message="16/16 replicas running",
        actor="cluster/eu-a",
    )


def queue_info() -> j.QueueInfo:
    return j.QueueInfo(
        position=0,  # explicit presence: zero ("next") is set, not absent
        reason=j.WAIT_REASON_TOPOLOGY_FRAGMENTED,
        message="needs 64 H100 in one rack; largest free rack has 40",
        quota="gpu/NVIDIA-H100",
        next_eligible_time=ts(120),
        evaluate_time=ts(100),
        clusters=[cluster_verdict()],
    )


def cluster_verdict() -> j.ClusterVerdict:
    return j.ClusterVerdict(
        cluster="eu-b",
        reason=j.CLUSTER_VERDICT_REASON_INSUFFICIENT_CAPACITY,
        message="rack r2: 6 free GPUs, needs 8",
        fit_reason=c.FIT_REASON_INSUFFICIENT_GPUS,
    )


def job_status() -> j.JobStatus:
    return j.JobStatus(
        state=j.JOB_STATE_QUEUED,
        current_attempt=2,
        create_time=ts(0),
        update_time=ts(11),
        queue_info=queue_info(),
        attempts=[attempt()],
        history=[state_transition()],
        infra_retries=1,
        message="waiting for capacity",
        revision=9_007_199_254_740_993,  # above 2**53: JSON must carry it as a string
        held=True,
        held_by="admin/ops",
    )


def job() -> j.Job:
    return j.Job(job_id="train-7f3k", spec=job_spec(), status=job_status())


# --------------------------------------------------------------------------- inventory


def taint() -> inv.Taint:
    return inv.Taint(key="nvidia.com/gpu", value="present", effect=inv.TAINT_EFFECT_NO_SCHEDULE)


def node_resources(scale: int = 1) -> inv.NodeResources:
    return inv.NodeResources(cpu_milli=190_000 * scale, memory_bytes=2_000_000_000_000 * scale, pods=110 * scale)


def mig_instance() -> inv.MigInstance:
    return inv.MigInstance(
        profile="3g.40gb", gi_profile_id=9, placement_start=4, placement_size=4, in_use=True, uuid="MIG-1c2a-..."
    )


def gpu_device() -> inv.GpuDevice:
    return inv.GpuDevice(
        index=7,
        uuid="GPU-5d1e0c3a-aaaa-bbbb-cccc-0123456789ab",
        model="NVIDIA-H100-80GB-HBM3",
        memory_mib=81_559,
        milli_in_use=250,
        health=inv.GPU_HEALTH_UNHEALTHY,
        mig_mode=inv.MIG_MODE_ENABLED,
        mig_instances=[
            mig_instance(),
            inv.MigInstance(profile="1g.10gb", gi_profile_id=0, placement_start=0, placement_size=2),
        ],
        mig_memory_slices=8,
    )


def attribute_values() -> list[inv.DeviceAttributeValue]:
    """One value per oneof member."""
    return [
        inv.DeviceAttributeValue(string_value="NVIDIA H100"),
        inv.DeviceAttributeValue(int_value=-3),
        inv.DeviceAttributeValue(bool_value=True),
        inv.DeviceAttributeValue(version_value="12.4.0"),
    ]


def dra_device() -> inv.DraDevice:
    values = attribute_values()
    return inv.DraDevice(
        driver="gpu.nvidia.com",
        pool="gpu-node-17",
        name="gpu-0",
        attributes={
            "gpu.nvidia.com/productName": values[0],
            "index": values[1],
            "gpu.nvidia.com/mig-capable": values[2],
            "driverVersion": values[3],
        },
        capacity={"memory": "80Gi"},
        allocated=True,
        consumed_by_claim="team-acme/train-7f3k-2-worker-1-gpus",
    )


def node_inventory(name: str = "gpu-node-17") -> inv.NodeInventory:
    return inv.NodeInventory(
        name=name,
        labels={"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        taints=[taint()],
        ready=True,
        unschedulable=True,
        topology_path=topology_path(),
        allocatable=node_resources(2),
        free=node_resources(),
        gpu_model="NVIDIA-H100-80GB-HBM3",
        gpu_memory_mib=81_559,
        gpus=[gpu_device()],
        extended_allocatable={"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 7},
        extended_free={"nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 3},
        dra_devices=[dra_device()],
    )


def cluster_metadata() -> inv.ClusterMetadata:
    return inv.ClusterMetadata(
        name="eu-a",
        region="eu-west",
        role="training",
        kubernetes_version="v1.34.1",
        labels={"tier": "gold"},
        dra_enabled=True,
        gang_api_enabled=True,
    )


def reservation_progress() -> inv.ReservationProgress:
    return inv.ReservationProgress(attempt=attempt_ref(), bound=[replica_placement(), replica_placement(index=4)])


def inventory_snapshot() -> inv.InventorySnapshot:
    return inv.InventorySnapshot(
        sequence=41,
        observe_time=ts(30),
        nodes=[node_inventory(), node_inventory("cpu-node-1")],
        reservations=[reservation_progress()],
        cluster=cluster_metadata(),
        applied_broker_sequence=12,
    )


def inventory_delta() -> inv.InventoryDelta:
    return inv.InventoryDelta(
        sequence=42,
        base_sequence=41,
        observe_time=ts(31),
        upserted_nodes=[node_inventory()],
        removed_node_names=["gpu-node-99"],
        reservations=[reservation_progress()],
        applied_broker_sequence=13,
    )


# --------------------------------------------------------------------------- job service


def submit_job_item() -> js.SubmitJobItem:
    return js.SubmitJobItem(idempotency_key="launch-42/shard-3", spec=job_spec())


def submit_jobs_request() -> js.SubmitJobsRequest:
    return js.SubmitJobsRequest(job_set_id="sweep-2026-11-30", items=[submit_job_item()], validate_only=True)


def rpc_error() -> status_pb2.Status:
    """A google.rpc.Status with a BadRequest detail, as SubmitJobResult.error carries it."""
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(
                field="items[0].spec.pod_sets[1].shape.gpu_count", description="must be <= 8 for this cluster set"
            )
        ]
    )
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="invalid job spec")
    status.details.add().Pack(bad)
    return status


def submit_job_results() -> list[js.SubmitJobResult]:
    """One result per member of the `result` oneof."""
    return [
        js.SubmitJobResult(index=0, idempotency_key="k0", job_id="train-7f3k", duplicate=True),
        js.SubmitJobResult(index=1, idempotency_key="k1", error=rpc_error()),
        js.SubmitJobResult(index=2, idempotency_key="k2", valid=empty_pb2.Empty()),
    ]


def submit_jobs_response() -> js.SubmitJobsResponse:
    return js.SubmitJobsResponse(results=submit_job_results())


def get_job_request() -> js.GetJobRequest:
    return js.GetJobRequest(job_id="train-7f3k", view=js.JOB_VIEW_FULL)


def get_job_response() -> js.GetJobResponse:
    return js.GetJobResponse(job=job())


def list_jobs_request() -> js.ListJobsRequest:
    return js.ListJobsRequest(
        states=[j.JOB_STATE_QUEUED, j.JOB_STATE_RUNNING],
        tenant="acme",
        queue="research",
        job_set_id="sweep-2026-11-30",
        label_selector={"team": "nlp"},
        page_size=50,
        page_token="b3BhcXVl",
        view=js.JOB_VIEW_BASIC,
        cluster="eu-a",
        gpu_model="NVIDIA-H100-80GB-HBM3",
    )


def list_jobs_response() -> js.ListJobsResponse:
    return js.ListJobsResponse(jobs=[job()], next_page_token="bmV4dA", revision=1234)


def watch_jobs_request() -> js.WatchJobsRequest:
    return js.WatchJobsRequest(
        from_revision=1234,
        tenant="acme",
        queue="research",
        job_set_id="sweep-2026-11-30",
        job_ids=["train-7f3k"],
        bookmark_interval_seconds=30,
    )


def job_event() -> js.JobEvent:
    return js.JobEvent(
        revision=1235,
        time=ts(12),
        type=js.JOB_EVENT_TYPE_STATE_CHANGED,
        job_id="train-7f3k",
        transition=state_transition(),
        job=job(),
        attempt=attempt(),
    )


def cancel_job_request() -> js.CancelJobRequest:
    return js.CancelJobRequest(job_id="train-7f3k", reason="superseded by r43")


def cancel_job_response() -> js.CancelJobResponse:
    return js.CancelJobResponse(state=j.JOB_STATE_SUCCEEDED, already_terminal=True)


def cancel_job_set_request() -> js.CancelJobSetRequest:
    return js.CancelJobSetRequest(job_set_id="sweep-2026-11-30", tenant="acme", reason="sweep aborted")


def cancel_job_set_response() -> js.CancelJobSetResponse:
    return js.CancelJobSetResponse(cancelled_job_ids=["train-7f3k", "train-9q2m"], already_terminal_count=4)


def get_usage_request() -> js.GetUsageRequest:
    return js.GetUsageRequest(tenant="acme")


def tenant_usage() -> js.TenantUsage:
    return js.TenantUsage(
        tenant="acme",
        weight=2.0,
        gpus={"NVIDIA-H100-80GB-HBM3": 24.0, "NVIDIA-A100-SXM4-80GB": 0.5},
        quotas={"NVIDIA-H100-80GB-HBM3": 16.0, "*": 8.0},
        borrowed={"NVIDIA-H100-80GB-HBM3": 8.0},
        usage_cost=48.25,
        fair_share_cost=40.0,
        demand_cost=96.0,
    )


def get_usage_response() -> js.GetUsageResponse:
    return js.GetUsageResponse(tenants=[tenant_usage()], capacity_cost=512.0, evaluate_time=ts(13))


def export_usage_request() -> js.ExportUsageRequest:
    return js.ExportUsageRequest(since=ts(0), until=ts(86400), tenant="acme")


def usage_record() -> js.UsageRecord:
    return js.UsageRecord(tenant="acme", gpu_model="NVIDIA-H100-80GB-HBM3", cluster="eu-a", gpu_hours=1536.5)


def export_usage_response() -> js.ExportUsageResponse:
    return js.ExportUsageResponse(records=[usage_record()], since=ts(0), until=ts(86400))


def requeue_job_request() -> js.RequeueJobRequest:
    return js.RequeueJobRequest(job_id="train-7f3k", reason="node maintenance")


def requeue_job_response() -> js.RequeueJobResponse:
    return js.RequeueJobResponse(state=j.JOB_STATE_PREEMPTED)


def set_job_priority_request() -> js.SetJobPriorityRequest:
    return js.SetJobPriorityRequest(job_id="train-7f3k", priority=500, priority_band="high", reason="deadline")


def set_job_priority_response() -> js.SetJobPriorityResponse:
    return js.SetJobPriorityResponse(job=job())


def hold_job_request() -> js.HoldJobRequest:
    return js.HoldJobRequest(job_id="train-7f3k", reason="dataset not ready")


def hold_job_response() -> js.HoldJobResponse:
    return js.HoldJobResponse(job=job(), already_held=True)


def release_job_request() -> js.ReleaseJobRequest:
    return js.ReleaseJobRequest(job_id="train-7f3k", reason="dataset ready")


def release_job_response() -> js.ReleaseJobResponse:
    return js.ReleaseJobResponse(job=job(), was_not_held=True)
