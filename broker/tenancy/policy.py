"""The tenancy policy: who may call, as which tenant, on which clusters, models and bands, within which limits."""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.tenancy.podsecurity import capability
from placement.podspec import GPU_RESOURCE

__all__ = [
    "RateLimit",
    "TenantPolicy",
    "PreemptionPolicy",
    "AdminPolicy",
    "PolicyDoc",
    "Policy",
    "PolicyFile",
    "TokenBucket",
    "hash_token",
]

Clock = Callable[[], float]


def hash_token(token: str) -> str:
    """sha256 hex of a bearer token: the only form tokens are stored in."""
    return hashlib.sha256(token.encode()).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateLimit(_Strict):
    """Token bucket for mutating calls."""

    rate_per_s: float = Field(default=100.0, gt=0)
    """Sustained mutating calls per second."""
    burst: int = Field(default=200, ge=1)
    """Bucket size: calls allowed at once after idling (count)."""


class PreemptionPolicy(_Strict):
    """When this tenant's waiting jobs may preempt running ones (the knobs Kueue operators know; see
    broker.scheduling.fairness for the rules). A job that is not preemptible is never a victim, whatever these say."""

    reclaim: Literal["Never", "LowerPriority", "Any"] = "Any"
    """Take back GPUs other tenants borrow beyond their quota: never, only from lower-priority jobs, or always."""
    within_tenant: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = "Never"
    """Preempt the tenant's own preemptible jobs: never, of lower priority, or also of equal priority and newer."""
    fair_share_preemption: bool = True
    """Preempt other tenants' preemptible jobs while this tenant is below its fair share and they are above."""
    borrow_preempt_max_priority: int | None = None
    """A job that would itself borrow may preempt other tenants' borrowers of priority at or below this (and
    below its own); None = a borrower never preempts (Kueue's borrowWithinCohort.maxPriorityThreshold)."""
    protected_fraction: float = Field(default=1.0, ge=0.0, le=10.0)
    """At or below this fraction of its fair share the tenant is never a fair-share victim (Armada's
    protectedFractionOfFairShare)."""


class TenantPolicy(_Strict):
    """What one tenant is and may do."""

    name: str
    """Tenant name (appears on its jobs)."""
    token_sha256: list[str] = []
    """sha256 hex digests of the tenant's bearer tokens."""
    cert_subjects: list[str] = []
    """Client certificate common names (or SAN DNS names) that act as this tenant."""
    clusters: list[str] = ["*"]
    """Clusters the tenant may use; "*" = all."""
    regions: list[str] = ["*"]
    """Regions (the agents' Hello.region) the tenant may use; "*" = all. A cluster that reports no region is
    outside every list but "*"."""
    roles: list[str] = ["*"]
    """Cluster roles (Hello.role, e.g. training / inference) the tenant may use; "*" = all."""
    gpu_models: list[str] = ["*"]
    """GPU models (nvidia.com/gpu.product) the tenant may ask for; "*" = all."""
    priority_bands: list[str] = ["default"]
    """Priority bands the tenant may submit in."""
    quotas: dict[str, float] = {}
    """GPU quota per model, in GPUs ("*" = any other model); a missing model means unlimited."""
    borrowing_limits: dict[str, float] = {}
    """GPUs the tenant's preemptible jobs may borrow beyond a model's quota, while they are idle ("*" = any
    other model); a missing model means no limit. A job that is not preemptible never borrows."""
    preemption: PreemptionPolicy = PreemptionPolicy()
    """When its waiting jobs may preempt running ones."""
    weight: float = Field(default=1.0, gt=0)
    """Fair-share weight (dimensionless)."""
    rate_limit: RateLimit = RateLimit()
    """Limit on mutating calls."""
    pod_security: Literal["baseline", "restricted"] = "baseline"
    """Pod Security Standards level the tenant's pod templates are judged by (FLEET-NOTES H-1); its
    namespaces in every cluster must enforce at least this level (the agent refuses the tenant otherwise)."""
    extra_capabilities: list[str] = []
    """Linux capabilities allowed on top of the level, e.g. [IPC_LOCK] for NCCL over InfiniBand (stored
    upper case without `CAP_`). The tenant's namespaces then enforce `privileged` and warn / audit at the
    level; the broker's check is what holds the rest of the level there."""
    service_accounts: list[str] = ["default"]
    """ServiceAccounts a pod template may name (serviceAccountName); an unset one is the namespace's default."""
    runtime_classes: list[str] = []
    """RuntimeClasses a pod template may name (runtimeClassName); none by default."""
    toleration_keys: list[str] = [GPU_RESOURCE]
    """Taint keys a pod template may tolerate ("*" = any, including the empty key that tolerates every taint):
    a toleration for a dedicated taint reaches another team's nodes, and the broker's fit honours it."""

    @field_validator("extra_capabilities")
    @classmethod
    def _capabilities(cls, v: list[str]) -> list[str]:
        return [capability(c) for c in v]

    def allows_cluster(self, cluster: str) -> bool:
        return "*" in self.clusters or cluster in self.clusters

    def allows_region(self, region: str) -> bool:
        return "*" in self.regions or region in self.regions

    def allows_role(self, role: str) -> bool:
        return "*" in self.roles or role in self.roles

    def allows_place(self, cluster: str, region: str, role: str) -> bool:
        """Every cluster-level dimension at once: what placement asks of each candidate cluster."""
        return self.allows_cluster(cluster) and self.allows_region(region) and self.allows_role(role)

    def allows_model(self, model: str) -> bool:
        return "*" in self.gpu_models or model in self.gpu_models

    def allows_band(self, band: str) -> bool:
        return "*" in self.priority_bands or band in self.priority_bands

    def quota_for(self, model: str) -> float | None:
        """GPU quota for a model (None = unlimited)."""
        if model in self.quotas:
            return self.quotas[model]
        return self.quotas.get("*")


class AdminPolicy(_Strict):
    """Who is an admin (may cordon clusters and see every tenant's jobs)."""

    token_sha256: list[str] = []
    """sha256 hex digests of admin bearer tokens."""
    cert_subjects: list[str] = []
    """Client certificate common names that act as admin."""


class PolicyDoc(_Strict):
    """The policy file's schema."""

    tenants: list[TenantPolicy] = []
    """Every tenant."""
    admins: AdminPolicy = AdminPolicy()
    """Admin identities."""
    clusters: list[str] = ["*"]
    """Clusters whose agents may connect; "*" = any cluster with a valid certificate."""
    priority_bands: dict[str, int] = {"low": -100, "default": 0, "high": 100}
    """Band name -> base priority (higher goes first)."""


@dataclass(frozen=True)
class Policy:
    """An indexed, immutable view of a PolicyDoc."""

    doc: PolicyDoc
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    _by_subject: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_doc(cls, doc: PolicyDoc) -> Policy:
        tenants = {t.name: t for t in doc.tenants}
        by_subject = {s: t.name for t in doc.tenants for s in t.cert_subjects}
        return cls(doc=doc, tenants=tenants, _by_subject=by_subject)

    @classmethod
    def empty(cls) -> Policy:
        return cls.from_doc(PolicyDoc())

    def tenant_for_token(self, token: str) -> TenantPolicy | None:
        """Tenant owning a bearer token; compares digests in constant time, over every tenant."""
        digest = hash_token(token)
        found: TenantPolicy | None = None
        for tenant in self.doc.tenants:
            for stored in tenant.token_sha256:
                if hmac.compare_digest(stored.lower(), digest):
                    found = tenant
        return found

    def is_admin_token(self, token: str) -> bool:
        digest = hash_token(token)
        hit = False
        for stored in self.doc.admins.token_sha256:
            hit |= hmac.compare_digest(stored.lower(), digest)
        return hit

    def tenant_for_subject(self, subject: str) -> TenantPolicy | None:
        name = self._by_subject.get(subject)
        return self.tenants.get(name) if name else None

    def is_admin_subject(self, subject: str) -> bool:
        return subject in self.doc.admins.cert_subjects

    def cluster_known(self, cluster: str) -> bool:
        return "*" in self.doc.clusters or cluster in self.doc.clusters

    def band_priority(self, band: str) -> int | None:
        return self.doc.priority_bands.get(band)


def parse_policy(text: str) -> Policy:
    """Policy from YAML text (raises pydantic.ValidationError / yaml.YAMLError)."""
    raw = yaml.safe_load(text) or {}
    return Policy.from_doc(PolicyDoc.model_validate(raw))


class PolicyFile:
    """A policy YAML file reloaded whenever its mtime changes; a broken edit keeps the last good policy."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = Path(path) if path else None
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._checked_at = -float("inf")
        self._mtime: float | None = None
        self._policy = Policy.empty()
        self.last_error: str | None = None
        self.current()

    def current(self) -> Policy:
        """The latest good policy; the file's mtime is looked at most once per check interval."""
        if self._path is None:
            return self._policy
        now = self._clock()
        if now - self._checked_at < self._check_interval_s:
            return self._policy
        self._checked_at = now
        try:
            mtime = self._path.stat().st_mtime_ns
        except OSError as exc:
            self.last_error = f"policy file unreadable: {exc}"
            return self._policy
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._policy = parse_policy(self._path.read_text())
                self.last_error = None
            except Exception as exc:
                self.last_error = f"policy file invalid, keeping previous: {exc}"
        return self._policy


class TokenBucket:
    """Classic token bucket; `take()` is False when the caller must wait."""

    __slots__ = ("rate", "burst", "_tokens", "_at", "_clock")

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._clock = clock
        self._at = clock()

    def take(self, n: float = 1.0) -> bool:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def retry_after_s(self, n: float = 1.0) -> float:
        """Seconds until `n` tokens are available."""
        return max(0.0, (n - self._tokens) / self.rate)
