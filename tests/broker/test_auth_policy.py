"""Authentication, per-method authorisation, rate limits and policy reload, without a server."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from broker.domain import errors
from broker.tenancy import auth
from broker.tenancy.auth import (
    AuditLog,
    Authorizer,
    Caller,
    CallerKind,
    Credentials,
    Listener,
    Method,
    credentials_from_metadata,
)
from broker.tenancy.policy import PolicyFile, TokenBucket, hash_token, parse_policy

DOC = f"""
tenants:
  - name: alpha
    token_sha256: ["{hashlib.sha256(b"tok-a").hexdigest()}"]
    cert_subjects: ["launcher-a"]
    clusters: ["c1"]
    gpu_models: ["H100"]
    quotas: {{H100: 16, "*": 4}}
    rate_limit: {{rate_per_s: 1, burst: 2}}
admins:
  token_sha256: ["{hashlib.sha256(b"tok-admin").hexdigest()}"]
clusters: ["c1", "c2"]
"""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def authz(tmp_path: Path) -> tuple[Authorizer, Clock]:
    (tmp_path / "p.yaml").write_text(DOC)
    clock = Clock()
    return Authorizer(PolicyFile(tmp_path / "p.yaml"), clock=clock), clock


@pytest.mark.parametrize(
    ("creds", "listener", "kind", "name"),
    [
        (Credentials(bearer_token="tok-a"), Listener.TENANT, CallerKind.TENANT, "alpha"),
        (Credentials(bearer_token="tok-admin"), Listener.TENANT, CallerKind.ADMIN, "admin"),
        (Credentials(cert_names=("launcher-a",)), Listener.TENANT, CallerKind.TENANT, "alpha"),
        (Credentials(cert_names=("c2", "c2.example")), Listener.AGENT, CallerKind.AGENT, "c2"),
    ],
)
def test_authenticate(
    authz: tuple[Authorizer, Clock], creds: Credentials, listener: Listener, kind: CallerKind, name: str
) -> None:
    caller = authz[0].authenticate(creds, listener)
    assert (caller.kind, caller.name) == (kind, name)


@pytest.mark.parametrize(
    ("creds", "listener", "error"),
    [
        (Credentials(), Listener.TENANT, errors.Unauthenticated),
        (Credentials(bearer_token="nope"), Listener.TENANT, errors.Unauthenticated),
        (Credentials(cert_names=("stranger",)), Listener.TENANT, errors.Unauthenticated),
        (Credentials(bearer_token="tok-a"), Listener.AGENT, errors.Unauthenticated),
        (Credentials(cluster_header="c1"), Listener.AGENT, errors.Unauthenticated),
        (Credentials(cert_names=("c9",)), Listener.AGENT, errors.PermissionDenied),
    ],
)
def test_authenticate_refusals(
    authz: tuple[Authorizer, Clock], creds: Credentials, listener: Listener, error: type[errors.TandemError]
) -> None:
    with pytest.raises(error):
        authz[0].authenticate(creds, listener)


@pytest.mark.parametrize("method", list(Method))
@pytest.mark.parametrize("kind", list(CallerKind))
def test_every_method_checks_the_caller_kind(authz: tuple[Authorizer, Clock], method: Method, kind: CallerKind) -> None:
    tenant = authz[0].policy.tenants["alpha"] if kind is CallerKind.TENANT else None
    caller = Caller(kind, "alpha" if tenant else "x", tenant)
    allowed = {
        CallerKind.AGENT: {Method.CONNECT},
        CallerKind.TENANT: {m for m in Method if m not in (Method.CONNECT, Method.CORDON, Method.UNCORDON)},
        CallerKind.ADMIN: {m for m in Method if m is not Method.CONNECT},
    }[kind]
    if method in allowed:
        authz[0].authorize(caller, method)
    else:
        with pytest.raises(errors.PermissionDenied, match=method.rpc):
            authz[0].authorize(caller, method)


def test_agents_speak_only_for_their_cluster(authz: tuple[Authorizer, Clock]) -> None:
    agent = Caller(CallerKind.AGENT, "c1")
    auth.check_agent_speaks_for(agent, "c1")
    with pytest.raises(errors.PermissionDenied):
        auth.check_agent_speaks_for(agent, "c2")


def test_rate_limit_is_a_token_bucket(authz: tuple[Authorizer, Clock]) -> None:
    a, clock = authz
    caller = a.authenticate(Credentials(bearer_token="tok-a"), Listener.TENANT)
    a.authorize(caller, Method.SUBMIT_JOBS)
    a.authorize(caller, Method.CANCEL_JOB)
    with pytest.raises(errors.RateLimited) as err:
        a.authorize(caller, Method.SUBMIT_JOBS)
    assert err.value.details.retry_after_s == pytest.approx(1.0)
    a.authorize(caller, Method.GET_JOB)  # reads are not limited
    clock.t += 1.0
    a.authorize(caller, Method.SUBMIT_JOBS)


def test_token_bucket_refills_up_to_burst() -> None:
    clock = Clock()
    b = TokenBucket(2.0, 3, clock)
    assert [b.take() for _ in range(4)] == [True, True, True, False]
    clock.t = 10.0
    assert [b.take() for _ in range(4)] == [True, True, True, False]


def test_policy_helpers() -> None:
    p = parse_policy(DOC)
    t = p.tenants["alpha"]
    assert t.allows_cluster("c1") and not t.allows_cluster("c2")
    assert t.allows_model("H100") and not t.allows_model("A100")
    assert t.quota_for("H100") == 16 and t.quota_for("A100") == 4
    assert p.band_priority("high") == 100 and p.band_priority("nope") is None
    assert p.tenant_for_token("tok-a") is t and p.tenant_for_token("tok-b") is None
    assert hash_token("tok-a") == hashlib.sha256(b"tok-a").hexdigest()


def test_policy_file_reloads_on_mtime_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(DOC)
    pf = PolicyFile(path, check_interval_s=0)
    assert "alpha" in pf.current().tenants

    def bump() -> None:
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))

    path.write_text("tenants: [{name: beta}]\n")
    bump()
    assert list(pf.current().tenants) == ["beta"]
    path.write_text("tenants: [{name: beta, unknown_field: 1}]\n")
    bump()
    assert list(pf.current().tenants) == ["beta"] and pf.last_error


def test_credentials_from_grpc_call_data() -> None:
    creds = credentials_from_metadata(
        [("authorization", "Bearer abc"), ("x-tandem-cluster", "c1")],
        {"x509_common_name": [b"c1"], "x509_subject_alternative_name": [b"c1", b"c1.example"]},
        "ipv4:1.2.3.4",
    )
    assert creds == Credentials("abc", ("c1", "c1.example"), "c1", "ipv4:1.2.3.4")


def test_audit_log_writes_json_lines(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "a.jsonl"), clock=lambda: 5.0)
    log.record(Caller(CallerKind.TENANT, "alpha"), Method.CANCEL_JOB, "ok", job_id="j1")
    log.close()
    [entry] = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert entry == {
        "ts": 5.0,
        "method": "CancelJob",
        "caller_kind": "tenant",
        "caller": "alpha",
        "peer": "",
        "outcome": "ok",
        "job_id": "j1",
    }


def test_agent_may_speak_for_a_san_name(authz: tuple[Authorizer, Clock]) -> None:
    caller = authz[0].authenticate(Credentials(cert_names=("agent-7", "c1")), Listener.AGENT)
    assert caller.name == "c1" and caller.aliases == ("c1",)
    auth.check_agent_speaks_for(caller, "c1")
    with pytest.raises(errors.PermissionDenied):
        auth.check_agent_speaks_for(caller, "agent-7")
