"""The `tandem-extender agent` process's one typed configuration object, loaded once in main().

main() builds an `AgentProcessConfig` with `load_agent_process_config` from the config file (`--config`,
YAML/JSON: the `AgentConfig` keys), the command-line flags and the environment, all resolved here at load
time; the agent's parts get it (or its `agent` part) and read no environment of their own. Precedence: flag,
then file, then environment, then the default.

The environment variables read:

* ``POD_NAME``: the Lease holder identity is ``<POD_NAME>_<random>`` when ``identity`` is not configured
  (the host name when POD_NAME is unset too).
* ``KUBERNETES_SERVICE_HOST``, ``KUBECONFIG``, ``HOME``: how to reach the API server without ``--kubeconfig``
  (extender.config.kube_access).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from extender.config import LEVEL_NAMES, ExtenderConfig, KubeAccess, Listens, kube_access, read_config

__all__ = [
    "AgentConfig",
    "AgentProcessConfig",
    "LeaseConfig",
    "default_identity",
    "load_agent_config",
    "load_agent_process_config",
    "LEVEL_NAMES",
]


def default_identity(pod_name: str = "") -> str:
    """`<pod name>_<random>` (the host name without one): unique per process, readable in the Lease."""
    return f"{pod_name or socket.gethostname()}_{uuid.uuid4().hex[:6]}"


class LeaseConfig(BaseModel):
    """Leader election on a coordination.k8s.io Lease (kube-scheduler's timing by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = "tandem-system"
    """Namespace of the Lease."""
    name: str = "tandem-agent"
    """Lease name; never `tandem-scheduler` (that one is kube-scheduler's)."""
    duration_s: float = 15.0
    """leaseDurationSeconds: how long a holder's claim stands without renewal, seconds."""
    renew_deadline_s: float = 10.0
    """A leader that could not renew for this long steps down (before others may take over), seconds."""
    retry_period_s: float = 2.0
    """Renew / acquire attempt interval, seconds."""


class AgentConfig(Listens):
    """The agent's settings, the config file's keys; every field has a default except the cluster's name. The
    agent process holds it as AgentProcessConfig.agent."""

    cluster_name: str = ""
    """This cluster's name in the fleet (the broker checks it against the client certificate)."""
    region: str = ""
    """Region, for the broker's cluster selectors and tenancy policy."""
    role: str = ""
    """Role, e.g. "training", "inference"."""
    cluster_labels: dict[str, str] = Field(default_factory=dict)
    """Free-form cluster labels sent in Hello (tenancy policy may use them)."""
    broker: str = ""
    """Broker agent listener, HOST:PORT."""
    tls_cert_file: Path | None = None
    """Client certificate (CN / SAN = cluster_name) for the broker's mutual TLS."""
    tls_key_file: Path | None = None
    """Its private key."""
    tls_ca_file: Path | None = None
    """CA bundle that signed the broker's server certificate."""
    tls_server_name: str | None = None
    """Server name to verify instead of the broker host (certificates issued for another name)."""
    insecure: bool = False
    """Plain-text gRPC (development only: the broker then trusts the x-tandem-cluster header)."""
    tenants: dict[str, list[str]] = Field(default_factory=dict)
    """Tenant -> namespaces this cluster allows for it (the first is the default). A tenant not listed is
    refused (TENANT_NOT_ALLOWED); the agent never creates anything elsewhere."""
    tenant_pod_security: dict[str, Literal["baseline", "restricted"]] = Field(default_factory=dict)
    """Tenant -> the Pod Security level the broker judges its templates by (its policy's `pod_security`); a
    tenant not listed is baseline. Every namespace of the tenant must enforce at least that level (label
    pod-security.kubernetes.io/enforce), else the agent refuses the tenant at start (FLEET-NOTES H-2)."""
    tenant_extra_capabilities: dict[str, list[str]] = Field(default_factory=dict)
    """Tenant -> the extra capabilities its broker policy allows (e.g. [IPC_LOCK] for NCCL over InfiniBand).
    Pod Security admission cannot allow them, so that tenant's namespaces must be labelled enforce=privileged,
    warn and audit at its level, and tandem.dev/tenant-namespace=true (the ValidatingAdmissionPolicy that
    fences Tandem's objects there); the agent checks those labels instead (H-1)."""
    priority_classes: dict[str, str] = Field(default_factory=dict)
    """Priority band -> PriorityClass of its gang pods; bands not listed use default_priority_class."""
    default_priority_class: str = "tandem-gang"
    """PriorityClass of gang pods whose band is not mapped."""
    preemptible_priority_class: str | None = "tandem-gang-preemptible"
    """Class for preemptible attempts (preemptionPolicy: Never, so a stale view cannot evict others for a
    borrowed gang); None = the band's class."""
    report_labels: list[str] = Field(default_factory=list)
    """Extra node label keys (a trailing `*` makes a prefix) reported to the broker besides the ones fit,
    topology and GPU facts use (tenancy policy and node selectors may need them)."""
    coalesce_s: float = Field(0.15, gt=0, le=5)
    """Inventory changes are gathered this long into one delta, seconds."""
    heartbeat_s: float = Field(5.0, gt=0)
    """Heartbeat interval until the broker's Welcome says otherwise, seconds."""
    reconnect_base_s: float = Field(0.5, gt=0)
    """First reconnect delay after the broker stream fails, seconds (doubles, with jitter)."""
    reconnect_cap_s: float = Field(30.0, gt=0)
    """Largest reconnect delay, seconds."""
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    """Leader election."""
    identity: str = ""
    """Lease holder identity (default: `<POD_NAME or host name>_<random>`, resolved at load)."""
    log_url_templates: dict[str, str] = Field(default_factory=dict)
    """name -> URL template with {cluster}, {namespace}, {job}, {attempt}, {pod} (GetJob's log links)."""
    gated_grace_s: float = Field(60.0, ge=0)
    """A gated attempt held past its start deadline plus this long with no live broker stream is deleted by
    the agent on its own (it could never be started), seconds."""
    reservation_grace_s: float = Field(600.0, ge=0)
    """A reservation expires this long after its start deadline (the extender ignores expired ones, so the
    holds of attempts never created go away even if the agent is dead), seconds."""
    ungate_concurrency: int = Field(16, ge=1, le=256)
    """Pin / ungate patches in flight at once (API Priority and Fairness throttles bursts)."""
    image_pull_failure_s: float = Field(120.0, ge=0)
    """ErrImagePull / ImagePullBackOff / CreateContainerConfigError for this long fails the attempt as an
    application (configuration) error instead of burning infrastructure retries, seconds."""
    finished_retention_s: float = Field(300.0, ge=0)
    """A finished attempt's Jobs and pods are deleted this long after the broker acknowledged its end (time
    for `kubectl logs`; logs belong in the cluster's log store), seconds."""
    ttl_seconds_after_finished: int = Field(7 * 24 * 3600, ge=0)
    """Safety net on the Jobs: the agent deletes a finished attempt itself once the broker acked it."""
    default_grace_s: float = Field(30.0, ge=0)
    """terminationGracePeriodSeconds when the dispatch names none, seconds."""
    listen: str = "0.0.0.0:9091"
    """HOST:PORT of /healthz, /readyz and /metrics."""
    kube_api_timeout_s: float = Field(30.0, gt=0)
    """Timeout of one Kubernetes API request, seconds."""
    extender: ExtenderConfig = Field(default_factory=ExtenderConfig)
    """The extender settings the agent shares (topology keys, reservation namespace and label, scheduler
    name, gang labels): the agent builds its inventory with the extender's code."""

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for tenant, namespaces in v.items():
            if not namespaces:
                raise ValueError(f"tenant {tenant!r} maps to no namespace")
        return v

    def namespace_for(self, tenant: str, hint: str = "") -> str | None:
        """The namespace a tenant's workload goes to here: the hint when allowed, else the default."""
        allowed = self.tenants.get(tenant)
        if not allowed:
            return None
        return hint if hint in allowed else allowed[0]

    def pod_security(self, tenant: str) -> Literal["baseline", "restricted"]:
        """The tenant's Pod Security level (baseline unless tenant_pod_security says otherwise)."""
        return self.tenant_pod_security.get(tenant, "baseline")

    def priority_class(self, band: str, preemptible: bool) -> str:
        if preemptible and self.preemptible_priority_class:
            return self.preemptible_priority_class
        return self.priority_classes.get(band, self.default_priority_class)

    def topology_levels(self) -> list[tuple[str, str]]:
        """(portable level name, node label key) of the cluster's levels, broad to narrow, as Hello reports them."""
        return list(self.extender.topology.levels)


class AgentProcessConfig(BaseModel):
    """`tandem-extender agent`'s one configuration object: the file, the flags and the environment, resolved."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: AgentConfig = Field(default_factory=AgentConfig)
    """The agent's settings (the config file with the flags applied and ``identity`` resolved)."""
    kube: KubeAccess = Field(default_factory=KubeAccess)
    """How to reach the cluster's API server (--kubeconfig, else the environment)."""
    watch_cluster: bool = False
    """--kube: watch and write the cluster."""
    inventory_files: tuple[Path, ...] = ()
    """--inventory-file: read-only mode, report this file snapshot."""
    log_level: str = "INFO"
    """--log-level, else the extender part's log_level."""


def load_agent_config(path: Path | None, **overrides: Any) -> AgentConfig:
    """Read a YAML/JSON config file (optional) and apply command-line overrides (None = not given)."""
    return AgentConfig.model_validate(read_config(path, **overrides))


def load_agent_process_config(
    path: Path | None,
    *,
    env: Mapping[str, str],
    kube: bool = False,
    kubeconfig: str | None = None,
    inventory_files: Sequence[Path] = (),
    log_level: str | None = None,
    **overrides: Any,
) -> AgentProcessConfig:
    """The `agent` process's configuration: the file (optional), the flags (None / empty = not given), ``env``.
    ``overrides`` are AgentConfig keys given as flags (broker, cluster_name, tls_*_file, listen)."""
    data = read_config(path, **overrides)
    if not data.get("identity"):
        data["identity"] = default_identity(env.get("POD_NAME") or "")
    agent = AgentConfig.model_validate(data)
    return AgentProcessConfig(
        agent=agent,
        kube=kube_access(env, kubeconfig),
        watch_cluster=kube,
        inventory_files=tuple(inventory_files),
        log_level=log_level or agent.extender.log_level,
    )
