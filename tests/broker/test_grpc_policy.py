"""Tenancy over real gRPC: fair order between tenants, quotas, never-fit rejection, who may call what."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2

from broker.launcher.client import BrokerClient, SubmitItem, status_details
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tests.broker.hub_builders import A100, H100, Broker, eventually, node, policy_doc, spec, start_broker, write_policy

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    b = await start_broker(tmp_path, policy=policy_doc(alpha={"quotas": {H100: 8}}))
    yield b
    await b.close()


async def test_fair_share_puts_the_tenant_holding_less_first(broker: Broker) -> None:
    a = broker.agent("c1")
    await a.connect([node("n1"), node("n2", free=0, rack="r2")])
    alpha, beta = broker.client("alpha"), broker.client("beta")
    [j1] = await alpha.submit("s", [SubmitItem("j1", spec(gpus=8, models=[H100]))])
    await a.expect("dispatch")
    [j2] = await beta.submit("s", [SubmitItem("j2", spec(gpus=8))])  # beta first in time ...
    [j3] = await beta.submit("s", [SubmitItem("j3", spec(gpus=8))])
    [j4] = await alpha.submit("s", [SubmitItem("j4", spec(gpus=8, preemptible=True))])
    await eventually(lambda: {j2.job_id, j3.job_id, j4.job_id} <= set(broker.hub.placer.book.waits))
    # Order: beta holds 0 GPUs, alpha 8 -> beta's jobs before alpha's, in arrival order within beta.
    order = [j.job_id for j in broker.hub.placer.book.ordered()]
    assert order == [j2.job_id, j3.job_id, j4.job_id]
    a.snapshot([node("n1", free=0), node("n2", rack="r2")], bound=[(j1.job_id, 1, "workers", 0, "n1")])
    d = await a.expect("dispatch")
    assert d.attempt.job_id == j2.job_id
    # Positions are per tenant and never count the other tenant's jobs.
    job3 = await beta.get(j3.job_id)
    assert job3.status.queue_info.position == 0
    job4 = await alpha.get(j4.job_id)
    assert job4.status.queue_info.position == 0
    await a.close()


async def test_quota_ceiling_refuses_at_submission(broker: Broker) -> None:
    c = broker.client("alpha")
    [res] = await c.submit("s", [SubmitItem("k", spec(gpus=8, replicas=2, models=[H100]))])
    assert res.error_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    resp = await c.submit_raw(_req("s", "k2", spec(gpus=8, replicas=2, models=[H100])))
    detail = resp.results[0].error.details
    failures = [d for d in detail if d.Is(error_details_pb2.QuotaFailure.DESCRIPTOR)]
    assert failures
    qf = error_details_pb2.QuotaFailure()
    failures[0].Unpack(qf)
    assert qf.violations[0].subject == f"tenant/alpha/gpu/{H100}"


def _req(job_set: str, key: str, s: job_pb2.JobSpec):  # type: ignore[no-untyped-def]
    from tandem.v1 import job_service_pb2 as svc

    r = svc.SubmitJobsRequest(job_set_id=job_set)
    r.items.add(idempotency_key=key, spec=s)
    return r


async def test_quota_holds_placement_when_usage_would_exceed_it(broker: Broker) -> None:
    a = broker.agent("c1")
    await a.connect([node("n1"), node("n2", rack="r2")])
    c = broker.client("alpha")
    [j1] = await c.submit("s", [SubmitItem("j1", spec(gpus=8, models=[H100]))])
    await a.expect("dispatch")
    [j2] = await c.submit("s", [SubmitItem("j2", spec(gpus=8, models=[H100]))])
    await eventually(lambda: j2.job_id in broker.hub.placer.book.waits)
    job = await c.get(j2.job_id)
    assert job.status.queue_info.reason == job_pb2.WAIT_REASON_QUOTA_EXCEEDED
    assert j1.job_id != j2.job_id
    await a.close()


async def test_never_fit_is_rejected_at_submission_with_the_reason(broker: Broker) -> None:
    a = broker.agent("c1")
    await a.connect([node(f"n{i}", rack=f"r{i // 2}") for i in range(4)])
    c = broker.client("beta")
    # 16 GPUs in one pod: no node has 16.
    [big] = await c.submit("s", [SubmitItem("big", spec(gpus=16))])
    assert big.error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "even if empty" in big.error_message
    # 3 full nodes in one rack: racks hold 2 nodes.
    [gang] = await c.submit("s", [SubmitItem("gang", spec(gpus=8, replicas=3, level="rack"))])
    assert gang.error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    # A model no cluster has.
    [model] = await c.submit("s", [SubmitItem("model", spec(gpus=1, models=[A100]))])
    assert model.error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    # The same gang within a zone fits (when empty): accepted.
    [ok] = await c.submit("s", [SubmitItem("ok", spec(gpus=8, replicas=3, level="zone"))])
    assert ok.job_id
    await a.close()


async def test_validate_only_stores_nothing(broker: Broker) -> None:
    c = broker.client("beta")
    [res] = await c.submit("s", [SubmitItem("k", spec(gpus=1))], validate_only=True)
    assert res.valid and not res.job_id
    listed = await c.list()
    assert len(listed.jobs) == 0


async def test_idempotent_retry_returns_the_original_job(broker: Broker) -> None:
    c = broker.client("beta")
    [first] = await c.submit("s", [SubmitItem("same", spec(gpus=1))])
    [again] = await c.submit("s", [SubmitItem("same", spec(gpus=1))])
    assert again.job_id == first.job_id and again.duplicate
    [other] = await c.submit("s", [SubmitItem("same", spec(gpus=2))])
    assert other.error_code == grpc.StatusCode.ALREADY_EXISTS.value[0]


# ----------------------------------------------------------------------------- who may call what


async def _code(coro) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro
    return err.value.code()


async def test_unauthenticated_callers(broker: Broker) -> None:
    anon = broker.client(None)
    assert await _code(anon.list()) == grpc.StatusCode.UNAUTHENTICATED
    wrong = BrokerClient(broker.tenant_addr, token="not-a-token")
    broker.clients.append(wrong)
    assert await _code(wrong.submit("s", [SubmitItem("k", spec(gpus=1))])) == grpc.StatusCode.UNAUTHENTICATED


async def test_tenants_may_not_administer_clusters(broker: Broker) -> None:
    a = broker.agent("c1")
    await a.connect([node("n1")])
    t = broker.client("alpha")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await t.cordon("c1", "mine now")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "tenant callers may not call Cordon" in (err.value.details() or "")
    clusters = await t.list_clusters()
    assert [c.name for c in clusters.clusters] == ["c1"]
    await a.close()


async def test_list_filters_by_cluster_and_gpu_model_within_the_tenant(broker: Broker) -> None:
    a = broker.agent("c1")
    await a.connect([node("n1")])
    alpha, beta, admin = broker.client("alpha"), broker.client("beta"), broker.client("admin")
    [placed] = await alpha.submit("s", [SubmitItem("placed", spec(gpus=1))])
    await a.expect("dispatch")
    [theirs] = await beta.submit("s", [SubmitItem("theirs", spec(gpus=1))])
    await a.expect("dispatch")
    # 8 GPUs with 2 held: it waits (no attempt); its spec accepts A100 (which no cluster has) or H100
    [waiting] = await alpha.submit("s", [SubmitItem("waiting", spec(gpus=8, models=[A100, H100]))])
    assert waiting.job_id, waiting
    await eventually(lambda: waiting.job_id in broker.hub.placer.book.waits)

    async def ids(c: BrokerClient, **filters: str) -> list[str]:
        return [j.job_id for j in (await c.list(**filters)).jobs]

    assert await ids(alpha, cluster="c1") == [placed.job_id]
    assert await ids(beta, cluster="c1") == [theirs.job_id]
    assert await ids(admin, cluster="c1") == [placed.job_id, theirs.job_id]
    assert await ids(alpha, cluster="c2") == []
    assert await ids(alpha, gpu_model=H100) == [placed.job_id, waiting.job_id]  # attempt (spec: any); spec
    assert await ids(alpha, gpu_model=A100) == [waiting.job_id]
    assert await ids(beta, gpu_model=A100) == []
    assert await ids(alpha, cluster="c1", gpu_model=A100) == []
    await a.close()


async def test_tenants_see_only_their_own_jobs(broker: Broker) -> None:
    alpha, beta = broker.client("alpha"), broker.client("beta")
    [mine] = await alpha.submit("s", [SubmitItem("k", spec(gpus=1))])
    assert await _code(beta.get(mine.job_id)) == grpc.StatusCode.NOT_FOUND
    assert await _code(beta.cancel(mine.job_id)) == grpc.StatusCode.NOT_FOUND
    assert await _code(beta.list(tenant="alpha")) == grpc.StatusCode.PERMISSION_DENIED
    assert [j.job_id for j in (await alpha.list()).jobs] == [mine.job_id]
    assert (await beta.list()).jobs == []
    s = spec(gpus=1)
    s.tenant = "alpha"
    [res] = await beta.submit("s", [SubmitItem("k", s)])
    assert res.error_code == grpc.StatusCode.PERMISSION_DENIED.value[0]


async def test_agent_may_speak_only_for_its_own_cluster(broker: Broker) -> None:
    a = broker.agent("c1")
    assert await _code(a.connect([node("n1")], hello_name="c2")) == grpc.StatusCode.PERMISSION_DENIED
    await a.close()
    assert "c2" not in broker.hub.catalog.clusters


async def test_tenant_token_cannot_open_an_agent_stream(broker: Broker) -> None:
    channel = grpc.aio.secure_channel(
        broker.agent_addr,
        grpc.ssl_channel_credentials(broker.pki.ca_pem),
        options=[("grpc.ssl_target_name_override", "localhost")],
    )
    from tandem.v1 import cluster_service_pb2_grpc as cs_grpc

    stub = cs_grpc.ClusterServiceStub(channel)

    async def one() -> object:
        yield cs.AgentMessage(sequence=1, hello=cs.Hello(cluster_name="c1"))

    call = stub.Connect(one(), metadata=(("authorization", "Bearer token-alpha"),))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
    await channel.close()


async def test_band_not_allowed_is_permission_denied(broker: Broker) -> None:
    c = broker.client("alpha")
    [res] = await c.submit("s", [SubmitItem("k", spec(gpus=1, band="low"))])
    assert res.error_code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert "band low" in res.error_message


async def test_rate_limit_and_policy_reload(tmp_path: Path) -> None:
    doc = policy_doc(beta={"rate_limit": {"rate_per_s": 0.001, "burst": 2}})
    b = await start_broker(tmp_path, policy=doc)
    try:
        c = b.client("beta")
        for k in ("a", "b"):
            [r] = await c.submit("s", [SubmitItem(k, spec(gpus=1))])
            assert r.job_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.submit("s", [SubmitItem("c", spec(gpus=1))])
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert any(isinstance(d, error_details_pb2.RetryInfo) for d in status_details(err.value))
        # A new token appears in the policy file: it works without a restart.
        doc["tenants"][0]["token_sha256"].append(hashlib.sha256(b"fresh-token").hexdigest())
        write_policy(tmp_path / "policy.yaml", doc)
        st = os.stat(tmp_path / "policy.yaml")
        os.utime(tmp_path / "policy.yaml", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        fresh = BrokerClient(b.tenant_addr, token="fresh-token")
        b.clients.append(fresh)
        assert (await fresh.list()).jobs == []
    finally:
        await b.close()


async def test_audit_log_records_every_mutating_call(broker: Broker) -> None:
    a = broker.agent("c1")
    await a.connect([node("n1")])
    c = broker.client("beta")
    [res] = await c.submit("s", [SubmitItem("k", spec(gpus=1))])
    await c.cancel(res.job_id, "bye")
    await broker.client("admin").cordon("c1", "maintenance")
    with pytest.raises(grpc.aio.AioRpcError):
        await c.cordon("c1", "nope")
    lines = [json.loads(x) for x in (broker.tmp / "audit.jsonl").read_text().splitlines()]
    seen = [(e["method"], e["caller"], e["outcome"]) for e in lines]
    assert ("SubmitJobs", "beta", "ok") in seen
    assert ("CancelJob", "beta", "ok") in seen
    assert ("Cordon", "admin", "ok") in seen
    assert ("Cordon", "beta", "denied") in seen
    assert ("Connect", "c1", "ok") in seen
    await a.close()


async def test_tenant_listener_over_tls_with_bearer_token(tmp_path: Path) -> None:
    b = await start_broker(tmp_path, tenant_tls=True)
    try:
        tls = BrokerClient(b.tenant_addr, token="token-beta", ca_pem=b.pki.ca_pem, server_name="localhost")
        plain = BrokerClient(b.tenant_addr, token="token-beta", timeout_s=3)
        b.clients += [tls, plain]
        [res] = await tls.submit("s", [SubmitItem("k", spec(gpus=1))])
        assert res.job_id
        assert await _code(plain.list()) == grpc.StatusCode.UNAVAILABLE
    finally:
        await b.close()


async def test_launcher_authenticated_by_client_certificate(tmp_path: Path) -> None:
    doc = policy_doc(alpha={"cert_subjects": ["launcher-alpha"]})
    b = await start_broker(tmp_path, policy=doc, tenant_client_certs=True)

    def launcher(cn: str) -> BrokerClient:
        """A launcher that authenticates with a client certificate for `cn` (no token)."""
        cert, key = b.pki.issue(cn)
        return BrokerClient(
            b.tenant_addr,
            ca_pem=b.pki.ca_pem,
            client_cert_pem=cert.read_bytes(),
            client_key_pem=key.read_bytes(),
            server_name="localhost",
        )

    try:
        c, s = launcher("launcher-alpha"), launcher("someone-else")
        b.clients += [c, s]
        [res] = await c.submit("s", [SubmitItem("k", spec(gpus=1))])
        assert res.job_id
        assert [j.job_id for j in (await c.list()).jobs] == [res.job_id]
        assert (await c.get(res.job_id)).spec.tenant == "alpha"
        assert await _code(s.list()) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await b.close()


async def test_token_and_certificate_launchers_each_on_their_port(tmp_path: Path) -> None:
    """H-5: gRPC cannot make a client certificate optional, so certificate launchers get a mutual-TLS port
    of the same server: a token on the TLS port and a certificate (or a token) on the mTLS port both work;
    without a certificate the mTLS handshake fails, and a certificate sent to the TLS port is never asked
    for (the call is then a call without credentials)."""
    doc = policy_doc(alpha={"cert_subjects": ["launcher-alpha"]})
    b = await start_broker(tmp_path, policy=doc, tenant_mtls_port=True)
    try:
        cert, key = b.pki.issue("launcher-alpha")
        certs = {"client_cert_pem": cert.read_bytes(), "client_key_pem": key.read_bytes()}
        tls = dict(ca_pem=b.pki.ca_pem, server_name="localhost", timeout_s=5)
        token_tls = BrokerClient(b.tenant_addr, token="token-beta", **tls)
        cert_mtls = BrokerClient(b.tenant_mtls_addr, **certs, **tls)
        token_and_cert_mtls = BrokerClient(b.tenant_mtls_addr, token="token-beta", **certs, **tls)
        token_only_mtls = BrokerClient(b.tenant_mtls_addr, token="token-beta", **tls)
        cert_on_tls = BrokerClient(b.tenant_addr, **certs, **tls)
        b.clients += [token_tls, cert_mtls, token_and_cert_mtls, token_only_mtls, cert_on_tls]
        [beta_job] = await token_tls.submit("s", [SubmitItem("k", spec(gpus=1))])
        [alpha_job] = await cert_mtls.submit("s", [SubmitItem("k", spec(gpus=1))])
        assert beta_job.job_id and alpha_job.job_id
        assert (await cert_mtls.get(alpha_job.job_id)).spec.tenant == "alpha"
        assert [j.job_id for j in (await token_and_cert_mtls.list()).jobs] == [beta_job.job_id]  # the token's
        assert await _code(token_only_mtls.list()) == grpc.StatusCode.UNAVAILABLE  # no certificate: no handshake
        assert await _code(cert_on_tls.list()) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await b.close()
