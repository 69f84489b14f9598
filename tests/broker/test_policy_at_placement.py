"""The tenancy policy is enforced where placement happens: the model a job gets (and is charged quota for)
is one its tenant may use, whatever the request named or left out; so are the cluster, its region and its
role; a reloaded policy applies to queued jobs."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from broker.launcher.client import SubmitItem
from tandem.v1 import job_pb2
from tests.broker.hub_builders import A100, H100, eventually, node, policy_doc, spec, start_broker, write_policy

L40S = "NVIDIA-L40S"


def _held_model(b, job_id: str) -> str | None:  # type: ignore[no-untyped-def]
    held = b.hub.placer.book.held.get(job_id)
    return held.gpu_model if held is not None else None


async def test_a_job_naming_no_model_gets_only_a_model_its_tenant_may_use(tmp_path: Path) -> None:
    """alpha may use L40S and H100 only. Free A100s are never given to its 8-GPU job, named model or not;
    it waits for an H100, and quota is charged for the H100 it gets."""
    b = await start_broker(tmp_path, policy=policy_doc(alpha={"gpu_models": [L40S, H100], "quotas": {H100: 8}}))
    try:
        a = b.agent("c1")
        await a.connect(
            [
                node("a100-1", model=A100),
                node("a100-2", model=A100, rack="r2"),
                node("h100-1", model=H100, free=0, rack="r3"),
            ]
        )
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8))])  # no model named
        assert j.job_id, j.error_message
        await eventually(lambda: j.job_id in b.hub.placer.book.waits)
        assert b.hub.placer.book.waits[j.job_id].reason.name == "INSUFFICIENT_CAPACITY"
        job = await c.get(j.job_id)
        assert not job.status.attempts  # never dispatched onto the free A100s
        a.snapshot(
            [node("a100-1", model=A100), node("a100-2", model=A100, rack="r2"), node("h100-1", model=H100, rack="r3")]
        )  # the H100 frees up
        d = await a.expect("dispatch")
        assert [n.node for ps in d.pod_sets for n in ps.nodes] == ["h100-1"]
        assert _held_model(b, j.job_id) == H100
        await a.close()
    finally:
        await b.close()


async def test_a_model_named_only_through_the_templates_node_selector_is_refused(tmp_path: Path) -> None:
    """The template's `nodeSelector: nvidia.com/gpu.product` asks for an A100 the tenant may not use: no
    node can satisfy both the selector and the policy, so it is refused at submission, not dispatched."""
    b = await start_broker(tmp_path, policy=policy_doc(alpha={"gpu_models": [L40S, H100]}))
    try:
        a = b.agent("c1")
        await a.connect([node("a100-1", model=A100), node("h100-1", model=H100)])
        s = spec(gpus=8)
        tpl = json.loads(s.pod_sets[0].pod_template_json)
        tpl["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": A100}
        s.pod_sets[0].pod_template_json = json.dumps(tpl)
        [res] = await b.client("alpha").submit("s", [SubmitItem("k", s)])
        assert not res.job_id and f"may not use GPU model {A100}" in res.error_message, res
        [ok] = await b.client("beta").submit("s", [SubmitItem("k", s)])  # beta may use any model
        assert ok.job_id
        d = await a.expect("dispatch")
        assert [n.node for ps in d.pod_sets for n in ps.nodes] == ["a100-1"]
        await a.close()
    finally:
        await b.close()


async def test_a_reloaded_policy_applies_to_jobs_already_queued(tmp_path: Path) -> None:
    """Queued jobs are re-judged by the current policy: a model taken away is no longer given, a band taken
    away makes the job wait NOT_ALLOWED."""
    doc = policy_doc()
    b = await start_broker(tmp_path, policy=doc)
    try:
        c = b.client("alpha")
        a = b.agent("c1")
        await a.connect([node("a100-1", model=A100, free=0)])
        [first] = await c.submit("s", [SubmitItem("k1", spec(gpus=8))])
        [second] = await c.submit("s", [SubmitItem("k2", spec(gpus=8, band="high"))])
        await eventually(lambda: first.job_id in b.hub.placer.book.waits and second.job_id in b.hub.placer.book.waits)
        write_policy(tmp_path / "policy.yaml", policy_doc(alpha={"gpu_models": [H100], "priority_bands": ["default"]}))
        a.snapshot([node("a100-1", model=A100)])  # an A100 frees up: alpha may no longer have it
        await eventually(
            lambda: (
                b.hub.placer.book.waits.get(second.job_id) is not None
                and b.hub.placer.book.waits[second.job_id].reason.name == "NOT_ALLOWED"
            )
        )
        job = await c.get(second.job_id)
        assert job.status.queue_info.reason == job_pb2.WAIT_REASON_NOT_ALLOWED
        assert not (await c.get(first.job_id)).status.attempts  # the A100 is not given
        await a.close()
    finally:
        await b.close()


async def test_a_job_naming_no_cluster_is_placed_only_in_regions_and_roles_its_tenant_may_use(tmp_path: Path) -> None:
    """alpha may use region eu and role training only. Its job names no cluster, region or role: the free
    cluster in us and the free inference cluster are never chosen; it waits, then lands in eu-training."""
    b = await start_broker(tmp_path, policy=policy_doc(alpha={"regions": ["eu"], "roles": ["training"]}))
    try:
        us, infer, eu = b.agent("us1"), b.agent("inf1"), b.agent("eu1")
        await us.connect([node("us-h100", model=H100)], region="us")
        await infer.connect([node("inf-h100", model=H100)], role="inference")
        await eu.connect([node("eu-h100", model=H100, free=0)])
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8))])
        assert j.job_id, j.error_message
        await eventually(lambda: j.job_id in b.hub.placer.book.waits)
        assert not (await c.get(j.job_id)).status.attempts  # neither us1 nor inf1
        verdicts = {v.cluster for v in (await c.get(j.job_id)).status.queue_info.clusters}
        assert verdicts == {"eu1"}  # the others are not alpha's to know about
        assert [cl.name for cl in (await c.list_clusters()).clusters] == ["eu1"]
        eu.snapshot([node("eu-h100", model=H100)])
        d = await eu.expect("dispatch")
        assert [n.node for ps in d.pod_sets for n in ps.nodes] == ["eu-h100"]
        [ok] = await b.client("beta").submit("s", [SubmitItem("k", spec(gpus=8))])  # beta: any region
        assert ok.job_id
        beta = b.client("beta")
        attempts = []

        async def dispatched() -> bool:
            attempts[:] = (await beta.get(ok.job_id)).status.attempts
            return bool(attempts)

        await eventually(dispatched)
        assert attempts[0].cluster in {"us1", "inf1"}
        for agent in (us, infer, eu):
            await agent.close()
    finally:
        await b.close()


async def test_a_selector_naming_a_region_or_role_the_tenant_may_not_use_is_denied(tmp_path: Path) -> None:
    b = await start_broker(tmp_path, policy=policy_doc(alpha={"regions": ["eu"], "roles": ["training"]}))
    try:
        c = b.client("alpha")
        for field, value in (("regions", "us"), ("roles", "inference")):
            s = spec(gpus=8)
            getattr(s.cluster_selector, field).append(value)
            [res] = await c.submit("s", [SubmitItem(f"k-{field}", s)])
            assert not res.job_id and res.error_code == grpc.StatusCode.PERMISSION_DENIED.value[0], res
            assert f"may not use {field[:-1]} {value}" in res.error_message
    finally:
        await b.close()
