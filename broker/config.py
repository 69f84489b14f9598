"""The broker's one typed configuration object, loaded once in main() from YAML plus CLI flags."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from broker.domain.retry import RetryPolicy

__all__ = [
    "TlsConfig",
    "ListenerConfig",
    "MtlsListenerConfig",
    "FairnessConfig",
    "WebConfig",
    "BrokerConfig",
    "load_config",
    "build_arg_parser",
]

MIB = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsConfig(_Strict):
    """Server TLS material as file paths (PEM)."""

    cert_file: str | None = None
    """Server certificate chain (PEM file path); None = plaintext listener."""
    key_file: str | None = None
    """Private key of `cert_file` (PEM file path)."""
    client_ca_file: str | None = None
    """CA bundle that client certificates must chain to (PEM file path); None = no client certs."""
    require_client_cert: bool = False
    """Refuse connections without a valid client certificate (mutual TLS)."""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file and self.key_file)

    @property
    def mutual(self) -> bool:
        return self.enabled and bool(self.client_ca_file) and self.require_client_cert

    @model_validator(mode="after")
    def _check_client_certs(self) -> TlsConfig:
        # gRPC's Python server API either demands a client certificate or never asks for one: a client CA
        # with require_client_cert false would silently turn every certificate tenant away (FLEET-NOTES H-5)
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("tls: cert_file and key_file go together")
        if self.client_ca_file and not self.require_client_cert:
            raise ValueError(
                "tls: client_ca_file needs require_client_cert: true — a gRPC server cannot ask for an "
                "optional client certificate, so it would never see one; serve certificate tenants "
                "on tenant_mtls_listener and token tenants on tenant_listener"
            )
        if self.require_client_cert and not (self.client_ca_file and self.enabled):
            raise ValueError("tls: require_client_cert needs cert_file, key_file and client_ca_file")
        return self


class ListenerConfig(_Strict):
    """One gRPC listener."""

    address: str = "127.0.0.1:50051"
    """HOST:PORT to bind; port 0 picks a free port (tests)."""
    tls: TlsConfig = TlsConfig()
    """TLS settings; plaintext when no certificate is given."""
    max_message_bytes: int = Field(default=4 * MIB, gt=1024)
    """Largest request/response message accepted, in bytes (larger ones fail RESOURCE_EXHAUSTED)."""


class MtlsListenerConfig(_Strict):
    """A second port of the tenant server for launchers that authenticate by client certificate: the same
    services and message limit as `tenant_listener`, with mutual TLS (bearer tokens are accepted there too)."""

    address: str
    """HOST:PORT to bind; port 0 picks a free port (tests)."""
    tls: TlsConfig
    """Must be mutual: cert_file, key_file, client_ca_file and require_client_cert: true."""

    @model_validator(mode="after")
    def _check_mutual(self) -> MtlsListenerConfig:
        if not self.tls.mutual:
            raise ValueError("tenant_mtls_listener.tls needs cert_file, key_file and client_ca_file (mutual TLS)")
        return self


class WebConfig(_Strict):
    """The fleet view: a read-mostly web page beside the tenant API, served by the broker process itself."""

    address: str = "127.0.0.1:8080"
    """HOST:PORT to bind; port 0 picks a free port (tests)."""
    tls: TlsConfig = TlsConfig()
    """Server certificate for HTTPS (no client certificates: browsers log in with a token); plaintext when
    none is given, for loopback only — the session cookie is marked Secure whenever TLS is on."""
    session_ttl_s: float = Field(default=8 * 3600.0, gt=0)
    """A login lasts this long, in seconds (the token is checked against the policy on every request too)."""
    max_sessions: int = Field(default=10_000, ge=1)
    """Logins kept at once; past it the least recently used is dropped."""
    poll_interval_s: float = Field(default=2.0, gt=0)
    """How often the pages re-read the fleet and queue aggregates, in seconds."""
    probe_gpus: int = Field(default=8, ge=1)
    """GPUs per replica of the probe gang the fleet picture counts room for ("where could 8 × 8 go")."""
    max_event_streams: int = Field(default=256, ge=1)
    """Live-update (server-sent events) streams open at once, over every session."""

    @model_validator(mode="after")
    def _no_client_certs(self) -> WebConfig:
        if self.tls.client_ca_file or self.tls.require_client_cert:
            raise ValueError(
                "web.tls: client certificates are not used by the fleet view (browsers log in with a token)"
            )
        return self


class FairnessConfig(_Strict):
    """Fair share and fleet-wide preemption (who may preempt whom is per tenant, in the tenancy policy)."""

    gpu_model_weights: dict[str, float] = {}
    """Cost of one GPU of a model in the fair-share figure (e.g. H100: 2.0); missing models cost 1.0."""
    usage_half_life_s: float = Field(default=0.0, ge=0)
    """Half-life of the decayed usage that orders tenants in the queue, in seconds; 0 = usage now.
    Preemption always judges current allocation, never decayed usage."""
    preemption: bool = True
    """Preempt running preemptible jobs for waiting ones (quota reclaim, fair share, priority band)."""
    interval_s: float = Field(default=2.0, gt=0)
    """How often blocked jobs are looked at for preemption, in seconds."""
    min_runtime_s: float = Field(default=900.0, ge=0)
    """A job runs at least this long before it can be a fair-share victim (not for quota reclaim or a
    higher band), in seconds."""
    release_timeout_s: float = Field(default=120.0, gt=0)
    """Victims not gone this long after their grace period: the preemptor's held nodes are given back and it
    is planned again, in seconds."""
    ping_pong_s: float = Field(default=3600.0, ge=0)
    """A job preempted for another may not preempt that one back within this span, in seconds."""
    max_searches: int = Field(default=16, ge=1)
    """Most blocked jobs whose victims are searched per round (count)."""
    max_plans: int = Field(default=4, ge=1)
    """Most preemptions started per round (count): the fleet changes one step at a time."""
    max_lost_gpu_hours_per_hour: float | None = Field(default=None, gt=0)
    """Most GPU-hours of work preemption may cost one victim tenant, and one cluster, in any hour (a rate
    limit, FLEET-NOTES F-3); None = no limit. A preemption that would pass it waits."""
    hold_after_s: float = Field(default=1800.0, ge=0)
    """A gang blocked on capacity this long holds a domain while it drains, in seconds."""
    hold_min_gpus: float = Field(default=16.0, ge=0)
    """Only gangs of at least this many GPUs hold domains (smaller jobs find room without)."""
    max_held_domains: int = Field(default=2, ge=0)
    """Most domains held at once, fleet-wide (count); 0 = never hold."""
    max_hold_s: float = Field(default=4 * 3600.0, gt=0)
    """A hold is given up after this long, drained or not, so a held gang cannot starve the rest, in seconds."""


class BrokerConfig(_Strict):
    """Everything the broker process can be told; every field has a default."""

    tenant_listener: ListenerConfig = ListenerConfig()
    """JobService listener for launchers (TLS optional, bearer tokens; small messages)."""
    tenant_mtls_listener: MtlsListenerConfig | None = None
    """Optional second JobService port for launchers with client certificates (mutual TLS); None = off."""
    agent_listener: ListenerConfig = ListenerConfig(address="127.0.0.1:50052", max_message_bytes=64 * MIB)
    """ClusterService listener for cluster agents (mutual TLS; large messages for inventory)."""
    agent_insecure: bool = False
    """Accept agents without mutual TLS, trusting the `x-tandem-cluster` header (development only)."""
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    """Prometheus metrics HTTP port on the tenant host; 0 = metrics server disabled."""
    db_path: str = "tandem-broker.db"
    """SQLite database file path (used when `store_url` is not set)."""
    store_url: str | None = None
    """PostgreSQL DSN (``postgresql://user@host:5432/tandem``) selecting the PostgreSQL store (several brokers,
    one leader); None = the SQLite file at `db_path`. ``--db`` takes either a path or such a URL."""
    policy_path: str | None = None
    """Tenancy policy YAML path (reloaded when its mtime changes); None = no tenants, admins only via agents."""
    policy_check_interval_s: float = Field(default=1.0, ge=0)
    """How often the policy file's mtime is looked at, in seconds (0 = on every call)."""
    audit_log_path: str | None = None
    """JSON-lines audit log path; None = `<db_path>.audit.jsonl` (or the `tandem.broker.auth` logger for an in-memory db)."""
    cluster_stale_after_s: float = Field(default=30.0, gt=0)
    """A cluster without heartbeat or report for this long is stale and excluded from placement, in seconds."""
    lost_after_s: float = Field(default=300.0, gt=0)
    """Running jobs on a stale cluster become LOST after this further span, in seconds."""
    gang_start_deadline_s: float = Field(default=600.0, gt=0)
    """A gang not fully running this long after its Start (or not created and pinned this long after its
    dispatch) is torn down and re-planned, in seconds; a job's own start_timeout overrides it. Image pulls
    count: pods that are bound and starting keep the gang alive until then."""
    gang_schedule_timeout_s: float = Field(default=300.0, gt=0)
    """A gang whose pods are not all bound to their nodes this long after its Start is torn down (a pod
    kube-scheduler cannot place will not become placeable by waiting for the start deadline), seconds."""
    dispatch_ack_timeout_s: float = Field(default=30.0, gt=0)
    """A dispatch without accept/reject by then is treated as rejected, in seconds."""
    retry: RetryPolicy = RetryPolicy()
    """Retry budget and back-off of failed attempts (broker.domain.retry.RetryPolicy; only
    infrastructure failures spend the budget)."""
    retention_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """Finished jobs are kept this long before they may be purged, in seconds."""
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    """Heartbeat interval the broker asks agents for, in seconds."""
    placement_interval_s: float = Field(default=0.05, gt=0)
    """The placer gathers wake-ups (submissions, reports) this long before a step, in seconds; it rescans
    every waiting job at least every 20 intervals."""
    placement_batch: int = Field(default=256, ge=1)
    """Most jobs the placer decides per loop step (count); their reservations commit in chunks as it goes."""
    candidate_domains: int = Field(default=8, ge=1)
    """Most candidate domains per cluster the exact gang fit is run on (count)."""
    cluster_choice: Literal["tandem", "aggregate", "round-robin"] = "tandem"
    """How a job's cluster is chosen (fleetplan.choice): Tandem's node-level decision, or a baseline it is
    measured against — `aggregate` (Karmada-style replica estimate per cluster) or `round-robin`."""
    grace_period_s: float = Field(default=30.0, ge=0)
    """Grace given to workloads on cancel or preemption, in seconds (the agent only ever shortens a pod's own
    terminationGracePeriodSeconds, never lengthens it)."""
    fairness: FairnessConfig = FairnessConfig()
    """Fair share, decayed usage and preemption."""
    web: WebConfig | None = None
    """The fleet view's HTTP(S) listener; None = not served."""
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    """On SIGTERM, time given to in-flight RPCs before the servers stop, in seconds."""

    @model_validator(mode="after")
    def _check_bounds(self) -> BrokerConfig:
        if self.lost_after_s < self.cluster_stale_after_s:
            raise ValueError("lost_after_s must be >= cluster_stale_after_s")
        return self


def build_arg_parser(prog: str = "tandem-broker") -> argparse.ArgumentParser:
    """CLI flags; each one overrides the config file field it names."""
    p = argparse.ArgumentParser(prog=prog, description="Tandem broker: the fleet's gRPC hub.")
    p.add_argument("--config", help="YAML config file (BrokerConfig fields)")
    p.add_argument("--listen", help="tenant API HOST:PORT (JobService)")
    p.add_argument("--agent-listen", help="agent API HOST:PORT (ClusterService)")
    p.add_argument("--db", help="SQLite database path, or a postgresql:// URL for the PostgreSQL store")
    p.add_argument("--policy", help="tenancy policy YAML path")
    p.add_argument("--metrics-port", type=int, help="Prometheus port (0 = off)")
    p.add_argument("--audit-log", help="audit log (JSON lines) path")
    p.add_argument("--tls-cert", help="tenant listener certificate (PEM)")
    p.add_argument("--tls-key", help="tenant listener key (PEM)")
    p.add_argument("--agent-cert", help="agent listener certificate (PEM)")
    p.add_argument("--agent-key", help="agent listener key (PEM)")
    p.add_argument("--agent-ca", help="CA that agent client certificates chain to (PEM)")
    p.add_argument("--agent-insecure", action="store_true", default=None, help="plaintext agent listener (dev only)")
    p.add_argument("--mtls-listen", help="tenant API HOST:PORT for launchers with client certificates (mutual TLS)")
    p.add_argument("--mtls-cert", help="certificate of the --mtls-listen port (PEM)")
    p.add_argument("--mtls-key", help="key of the --mtls-listen port (PEM)")
    p.add_argument("--mtls-ca", help="CA that launchers' client certificates chain to (PEM)")
    p.add_argument("--web-listen", help="fleet view HOST:PORT (the web page; off unless given here or in the config)")
    p.add_argument(
        "--cluster-choice",
        choices=("tandem", "aggregate", "round-robin"),
        help="how a job's cluster is chosen: tandem (default), or a baseline (aggregate, round-robin)",
    )
    return p


def _set(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


_FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "listen": ("tenant_listener", "address"),
    "agent_listen": ("agent_listener", "address"),
    "db": ("db_path",),
    "policy": ("policy_path",),
    "metrics_port": ("metrics_port",),
    "audit_log": ("audit_log_path",),
    "tls_cert": ("tenant_listener", "tls", "cert_file"),
    "tls_key": ("tenant_listener", "tls", "key_file"),
    "agent_cert": ("agent_listener", "tls", "cert_file"),
    "agent_key": ("agent_listener", "tls", "key_file"),
    "agent_ca": ("agent_listener", "tls", "client_ca_file"),
    "agent_insecure": ("agent_insecure",),
    "mtls_listen": ("tenant_mtls_listener", "address"),
    "mtls_cert": ("tenant_mtls_listener", "tls", "cert_file"),
    "mtls_key": ("tenant_mtls_listener", "tls", "key_file"),
    "mtls_ca": ("tenant_mtls_listener", "tls", "client_ca_file"),
    "cluster_choice": ("cluster_choice",),
    "web_listen": ("web", "address"),
}


PG_SCHEMES = ("postgresql://", "postgres://")
"""URL schemes that select the PostgreSQL store."""


def load_config(argv: Sequence[str] | None = None) -> BrokerConfig:
    """Parse flags, read the YAML file they name, overlay the flags, validate."""
    args = build_arg_parser().parse_args(argv)
    tree: dict[str, Any] = {}
    if args.config:
        loaded = yaml.safe_load(Path(args.config).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError("config file must hold a mapping")
        tree = loaded
    for flag, path in _FLAG_PATHS.items():
        value = getattr(args, flag)
        if value is not None:
            _set(tree, path, value)
    db = tree.get("db_path")
    if isinstance(db, str) and db.startswith(PG_SCHEMES):
        tree["store_url"] = tree.pop("db_path")
    agent = tree.get("agent_listener")
    if isinstance(agent, dict) and "max_message_bytes" not in agent:
        agent["max_message_bytes"] = BrokerConfig().agent_listener.max_message_bytes
    if isinstance(agent, dict) and "address" not in agent:
        agent["address"] = BrokerConfig().agent_listener.address
    for mutual in ("agent_listener", "tenant_mtls_listener"):  # a client CA on these means mutual TLS
        listener = tree.get(mutual)
        tls = listener.get("tls") if isinstance(listener, dict) else None
        if isinstance(tls, dict) and tls.get("client_ca_file"):
            tls.setdefault("require_client_cert", True)
    return BrokerConfig.model_validate(tree)
