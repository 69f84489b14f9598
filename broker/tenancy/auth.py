"""Who is calling (agent, tenant, admin), whether that caller may call this method, and an audit trail."""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

from broker.domain import errors
from broker.tenancy.policy import Policy, PolicyFile, TenantPolicy, TokenBucket

__all__ = [
    "CallerKind",
    "Caller",
    "Credentials",
    "Method",
    "Authorizer",
    "AuditLog",
    "MUTATING",
    "AUDITED",
    "check_agent_speaks_for",
]

_log = logging.getLogger("tandem.broker.auth")

CLUSTER_HEADER = "x-tandem-cluster"
"""Metadata naming the cluster on an insecure (development) agent listener."""


class CallerKind(enum.Enum):
    AGENT = "agent"
    TENANT = "tenant"
    ADMIN = "admin"


class Listener(enum.Enum):
    TENANT = "tenant"
    AGENT = "agent"


class Method(enum.Enum):
    """Every RPC, with the caller kinds allowed to call it."""

    SUBMIT_JOBS = ("SubmitJobs", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    GET_JOB = ("GetJob", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    LIST_JOBS = ("ListJobs", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    WATCH_JOBS = ("WatchJobs", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    CANCEL_JOB = ("CancelJob", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    CANCEL_JOB_SET = ("CancelJobSet", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    GET_USAGE = ("GetUsage", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    EXPORT_USAGE = ("ExportUsage", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    REQUEUE_JOB = ("RequeueJob", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    SET_JOB_PRIORITY = ("SetJobPriority", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    HOLD_JOB = ("HoldJob", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    RELEASE_JOB = ("ReleaseJob", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    CONNECT = ("Connect", frozenset({CallerKind.AGENT}))
    LIST_CLUSTERS = ("ListClusters", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    GET_CLUSTER = ("GetCluster", frozenset({CallerKind.TENANT, CallerKind.ADMIN}))
    CORDON = ("Cordon", frozenset({CallerKind.ADMIN}))
    UNCORDON = ("Uncordon", frozenset({CallerKind.ADMIN}))

    def __init__(self, rpc: str, allowed: frozenset[CallerKind]) -> None:
        self.rpc = rpc
        self.allowed = allowed


MUTATING = frozenset(
    {
        Method.SUBMIT_JOBS,
        Method.CANCEL_JOB,
        Method.CANCEL_JOB_SET,
        Method.CORDON,
        Method.UNCORDON,
        Method.REQUEUE_JOB,
        Method.SET_JOB_PRIORITY,
        Method.HOLD_JOB,
        Method.RELEASE_JOB,
    }
)
"""Methods that change state: rate limited for tenants and audited for everyone."""

AUDITED = MUTATING | frozenset({Method.GET_USAGE, Method.EXPORT_USAGE})
"""Methods with an audit record (outcome ok / denied / error): every mutating one, and the usage reads
(accounting data)."""


@dataclass(frozen=True)
class Credentials:
    """What the transport told us about the peer, extracted at the edge from the gRPC context."""

    bearer_token: str | None = None
    cert_names: tuple[str, ...] = ()
    """Common name first, then SAN DNS names, of a verified client certificate."""
    cluster_header: str | None = None
    peer: str = ""


@dataclass(frozen=True)
class Caller:
    """An authenticated caller. `name` is the tenant, the cluster or the admin identity."""

    kind: CallerKind
    name: str
    tenant: TenantPolicy | None = None
    peer: str = ""
    aliases: tuple[str, ...] = ()
    """Every name the certificate carries (CN, then SAN DNS names): an agent may speak for any one of them."""

    @property
    def is_admin(self) -> bool:
        return self.kind is CallerKind.ADMIN

    def may_see_tenant(self, tenant: str) -> bool:
        return self.is_admin or (self.kind is CallerKind.TENANT and self.name == tenant)


def credentials_from_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
    auth_context: Mapping[str, Iterable[bytes]] | None,
    peer: str = "",
) -> Credentials:
    """Pull the bearer token, certificate names and cluster header out of gRPC call data."""
    token = None
    cluster = None
    for key, value in metadata or ():
        text = value.decode() if isinstance(value, bytes) else value
        if key.lower() == "authorization" and text[:7].lower() == "bearer ":
            token = text[7:].strip()
        elif key.lower() == CLUSTER_HEADER:
            cluster = text.strip()
    names: list[str] = []
    ctx = auth_context or {}
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for raw in ctx.get(key, ()):
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            if name and name not in names:
                names.append(name)
    return Credentials(bearer_token=token, cert_names=tuple(names), cluster_header=cluster, peer=peer)


def check_agent_speaks_for(caller: Caller, cluster: str) -> None:
    """An agent may only speak for the cluster its certificate names (the one check, used at Hello)."""
    if caller.kind is not CallerKind.AGENT or cluster not in (caller.name, *caller.aliases):
        raise errors.PermissionDenied(f"agent certificate names cluster {caller.name}, not {cluster}")


class Authorizer:
    """Authenticates credentials against the current policy and checks method + rate limits."""

    def __init__(
        self, policy: PolicyFile, *, agent_insecure: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._policy = policy
        self._agent_insecure = agent_insecure
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    @property
    def policy(self) -> Policy:
        return self._policy.current()

    def authenticate(self, creds: Credentials, listener: Listener) -> Caller:
        """Map credentials to a caller, or raise Unauthenticated with the reason."""
        policy = self.policy
        if listener is Listener.AGENT:
            return self._authenticate_agent(creds, policy)
        if creds.bearer_token is not None:
            if policy.is_admin_token(creds.bearer_token):
                return Caller(CallerKind.ADMIN, "admin", peer=creds.peer)
            tenant = policy.tenant_for_token(creds.bearer_token)
            if tenant is None:
                raise errors.Unauthenticated("bearer token is not known")
            return Caller(CallerKind.TENANT, tenant.name, tenant, creds.peer)
        for name in creds.cert_names:
            if policy.is_admin_subject(name):
                return Caller(CallerKind.ADMIN, name, peer=creds.peer)
            tenant = policy.tenant_for_subject(name)
            if tenant is not None:
                return Caller(CallerKind.TENANT, tenant.name, tenant, creds.peer)
        if creds.cert_names:
            raise errors.Unauthenticated("client certificate is not mapped to a tenant")
        raise errors.Unauthenticated("no credentials: send 'authorization: Bearer <token>' or a client certificate")

    def _authenticate_agent(self, creds: Credentials, policy: Policy) -> Caller:
        names = creds.cert_names
        if not names and self._agent_insecure and creds.cluster_header:
            names = (creds.cluster_header,)
        if not names:
            raise errors.Unauthenticated("agents must present a client certificate naming their cluster")
        admitted = tuple(n for n in names if policy.cluster_known(n))
        if not admitted:
            raise errors.PermissionDenied(f"cluster {names[0]} is not admitted by the policy")
        return Caller(CallerKind.AGENT, admitted[0], peer=creds.peer, aliases=admitted)

    def authorize(self, caller: Caller, method: Method) -> None:
        """Raise PermissionDenied when this kind of caller may not call the method, or it is over its rate."""
        if caller.kind not in method.allowed:
            raise errors.PermissionDenied(f"{caller.kind.value} callers may not call {method.rpc}")
        if method in MUTATING and caller.tenant is not None:
            bucket = self._bucket(caller.tenant)
            if not bucket.take():
                raise errors.RateLimited(
                    f"tenant {caller.name} is over its rate limit of {bucket.rate:g}/s",
                    details=errors.ErrorDetails(
                        quota_violations=(
                            errors.QuotaViolation(f"tenant/{caller.name}", "rate", bucket.rate, bucket.rate, 1),
                        ),
                        retry_after_s=bucket.retry_after_s(),
                    ),
                )

    def _bucket(self, tenant: TenantPolicy) -> TokenBucket:
        bucket = self._buckets.get(tenant.name)
        rl = tenant.rate_limit
        if bucket is None or bucket.rate != rl.rate_per_s or bucket.burst != rl.burst:
            bucket = TokenBucket(rl.rate_per_s, rl.burst, self._clock)
            self._buckets[tenant.name] = bucket
        return bucket


@dataclass
class AuditLog:
    """Structured JSON lines: one per mutating call, with caller, method, target and outcome."""

    path: str | None = None
    clock: Callable[[], float] = time.time
    _fh: TextIO | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def record(self, caller: Caller | None, method: Method, outcome: str, **fields: Any) -> None:
        entry: dict[str, Any] = {
            "ts": round(self.clock(), 6),
            "method": method.rpc,
            "caller_kind": caller.kind.value if caller else None,
            "caller": caller.name if caller else None,
            "peer": caller.peer if caller else None,
            "outcome": outcome,
        }
        entry.update(fields)
        line = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS, default=str).decode()
        if self.path is None:
            _log.info("audit", extra={"audit": entry})
            return
        with self._lock:
            if self._fh is None:
                self._fh = Path(self.path).open("a", encoding="utf-8")
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
