"""The `tandem-extender serve` process's one typed configuration object, loaded once in main() and passed explicitly.

main() builds a `ServeProcessConfig` with `load_serve_config` from the config file (`--config`, YAML/JSON: the
`ExtenderConfig` keys), the command-line flags and the environment, all resolved here at load time; the
components get its parts (`extender` for the inventory, the app and the webhook, `kube` for the API client)
and read no environment of their own. Precedence: flag, then file, then environment, then the default.

The environment variables read (the agent process reads the kube and POD_NAME ones through
extender.agent.config):

* ``TANDEM_WEBHOOK_PATH``, ``TANDEM_WEBHOOK_LISTEN``, ``TANDEM_WEBHOOK_TLS_CERT_FILE``,
  ``TANDEM_WEBHOOK_TLS_KEY_FILE``, ``TANDEM_WEBHOOK_CERT_CHECK_INTERVAL_S``, ``TANDEM_WEBHOOK_MAX_BODY_BYTES``:
  the ``webhook_*`` setting of the same name when the file leaves it unset (empty = unset).
* ``KUBERNETES_SERVICE_HOST``: set in a pod; the API client then uses the pod's service account (unless the
  agent's ``--kubeconfig`` names a file).
* ``KUBECONFIG`` (os.pathsep-separated files; ``HOME`` for ``~``): the kubeconfig otherwise, default
  ``~/.kube/config``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ExtenderConfig",
    "KubeAccess",
    "Listens",
    "ServeProcessConfig",
    "TopologyConfig",
    "WebhookSettings",
    "WorkloadClass",
    "WEBHOOK_ENV",
    "kube_access",
    "load_config",
    "load_serve_config",
    "read_config",
    "DEFAULT_DEVICE_CLASS_SELECTORS",
]

DEFAULT_DEVICE_CLASS_SELECTORS: dict[str, list[str]] = {
    "gpu.nvidia.com": ["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"],
    "mig.nvidia.com": ["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"],
}
"""The DeviceClasses the NVIDIA DRA driver's Helm chart installs (used only when the cluster has none of that name)."""


LEVEL_NAMES = ("zone", "block", "rack", "nvlink", "host")
"""Portable names of the topology levels, broad to narrow (TopologyConfig's fields in order)."""


class TopologyConfig(BaseModel):
    """Node label keys that define topology levels, broad to narrow (Kueue/Volcano style).

    An empty key says the cluster has no such level (e.g. `block: ""` where racks hang off one spine): the
    level is left out. A level that is configured but missing from a node's labels makes that node a domain
    of its own from that level down, so a cluster must not configure a level its nodes do not carry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    zone: str = "topology.kubernetes.io/zone"
    """Zone label key ("" = no zone level)."""
    block: str = "network.example.com/block"
    """Network block (spine) label key; differs per site ("" = no block level)."""
    rack: str = "network.example.com/rack"
    """Rack label key; differs per site ("" = no rack level)."""
    clique: str = "nvidia.com/gpu.clique"
    """Multi-node NVLink domain label key (set by GFD on fabric-attached GPUs only; "" = no such level)."""
    hostname: str = Field("kubernetes.io/hostname", min_length=1)
    """Node hostname label key (the narrowest level, always present)."""

    @property
    def levels(self) -> tuple[tuple[str, str], ...]:
        """(portable level name, label key) of the levels this cluster has, broad to narrow."""
        keys = (self.zone, self.block, self.rack, self.clique, self.hostname)
        return tuple((name, key) for name, key in zip(LEVEL_NAMES, keys) if key)

    @property
    def keys(self) -> tuple[str, ...]:
        """Level keys in order, broad to narrow."""
        return tuple(key for _, key in self.levels)


class WorkloadClass(BaseModel):
    """One class of the target workload the fragmentation-aware scorer keeps room for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(1, ge=1)
    """GPUs per pod of this class."""
    gpu_milli: int = Field(1000, ge=1, le=1000)
    """Share of each GPU, in thousandths (1000 = whole GPUs)."""
    cpu_milli: int = Field(8000, ge=0)
    """CPU per pod, millicores."""
    weight: float = Field(1.0, gt=0)
    """Relative frequency of this class (normalised over the list)."""


def _default_workload() -> list[WorkloadClass]:
    return [WorkloadClass(gpus=g, cpu_milli=8000 * g) for g in (1, 2, 4, 8)]


class Listens(BaseModel):
    """A process setting `listen: HOST:PORT` (the extender's verbs, the agent's health and metrics)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = "127.0.0.1:8888"

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()):
            raise ValueError("listen must be HOST:PORT")
        return v

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class WebhookSettings(BaseModel):
    """Where and how the mutating webhook listens (ExtenderConfig.webhook: its ``webhook_*`` settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = "/mutate"
    """URL path of the webhook (the MutatingWebhookConfiguration's service path)."""
    listen: str | None = None
    """HOST:PORT of the API-server-facing listener, e.g. 0.0.0.0:8443; None = only the main app serves it."""
    tls_cert_file: Path | None = None
    """PEM certificate (chain) of that listener, mounted from a Secret; None = plain HTTP (tests only)."""
    tls_key_file: Path | None = None
    """PEM private key matching tls_cert_file."""
    cert_check_interval_s: float = 60.0
    """How often the certificate files are checked for rotation, seconds."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Largest AdmissionReview accepted, bytes (a pod is at most ~1.5 MiB in etcd)."""


_WEBHOOK_DEFAULTS = WebhookSettings()


class ExtenderConfig(Listens):
    """The extender's settings, the config file's keys; every field has a default. The `serve` process holds
    it as ServeProcessConfig.extender, the agent process as AgentConfig.extender."""

    listen: str = "127.0.0.1:8888"
    """HOST:PORT the extender HTTP server binds (the scheduler sidecar talks over loopback)."""
    url_prefix: str = ""
    """Path prefix of the extender verbs, as the path part of `urlPrefix` in KubeSchedulerConfiguration
    (empty: the verbs are served at /filter, /prioritize, /preempt; the shipped manifests use /tandem)."""
    filter_verb: str = "filter"
    """Path (under url_prefix) of the filter verb (`filterVerb`)."""
    prioritize_verb: str = "prioritize"
    """Path (under url_prefix) of the prioritize verb (`prioritizeVerb`)."""
    preempt_verb: str = "preempt"
    """Path (under url_prefix) of the preempt verb (`preemptVerb`)."""
    scheduler_name: str = "tandem-scheduler"
    """schedulerName of the dedicated kube-scheduler (the webhook sets it on GPU pods)."""
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    """Topology level label keys."""
    webhook_namespaces: list[str] = Field(default_factory=list)
    """Namespaces whose GPU pods the mutating webhook routes to the scheduler (empty = all)."""
    webhook_path: str | None = None
    """URL path of the mutating webhook (None = TANDEM_WEBHOOK_PATH, else the webhook's default, /mutate)."""
    webhook_listen: str | None = None
    """HOST:PORT of the webhook's own TLS listener for the API server (None = TANDEM_WEBHOOK_LISTEN, else only
    this app serves it)."""
    webhook_tls_cert_file: Path | None = None
    """PEM certificate of the webhook listener (None = TANDEM_WEBHOOK_TLS_CERT_FILE, else plain HTTP)."""
    webhook_tls_key_file: Path | None = None
    """PEM private key of the webhook listener (None = TANDEM_WEBHOOK_TLS_KEY_FILE)."""
    webhook_cert_check_interval_s: float | None = None
    """How often the webhook certificate files are checked for rotation, seconds (None =
    TANDEM_WEBHOOK_CERT_CHECK_INTERVAL_S, else 60)."""
    webhook_max_body_bytes: int | None = None
    """Largest AdmissionReview accepted, bytes (None = TANDEM_WEBHOOK_MAX_BODY_BYTES, else 8 MiB)."""
    tls_cert_file: Path | None = None
    """PEM certificate for HTTPS (None = plain HTTP, fine on loopback)."""
    tls_key_file: Path | None = None
    """PEM private key matching tls_cert_file."""
    max_body_bytes: int = 64 * 1024 * 1024
    """Largest request body accepted, in bytes (NodeList mode at 5,000 nodes is ~15 MiB)."""
    gang_job_label: str = "tandem.dev/job"
    """Pod label naming the gang (job) a pod belongs to."""
    gang_attempt_label: str = "tandem.dev/attempt"
    """Pod label naming the gang attempt."""
    reservation_label: str = "tandem.dev/reservation"
    """Label marking reservation ConfigMaps."""
    reservation_namespace: str = "tandem-system"
    """Namespace where the agent writes reservation ConfigMaps."""
    dra_driver: str = "gpu.nvidia.com"
    """DRA driver whose ResourceSlices describe GPUs."""
    fallback_device_classes: dict[str, list[str]] = Field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_DEVICE_CLASS_SELECTORS.items()}
    )
    """CEL selectors of device classes assumed when the cluster has no DeviceClass of that name."""
    scoring_policy: str = "tandem-frag"
    """Node scoring policy for prioritize (a placement.scoring.make_policy name: tandem-frag,
    fgd, bestfit, packing, clustering, dotprod)."""
    target_workload: list[WorkloadClass] = Field(default_factory=_default_workload)
    """The pod classes fragmentation is measured against (default: 1, 2, 4 and 8 whole GPUs,
    8 CPUs per GPU, equally likely)."""
    verdict_cache_size: int = 256
    """Per-shape verdicts kept for the current inventory version (entries)."""
    log_level: str = "INFO"
    """Python logging level name."""

    @field_validator("url_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = v.rstrip("/")
        return v if not v or v.startswith("/") else "/" + v

    @field_validator("scoring_policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        from placement.scoring import POLICY_NAMES

        if v not in POLICY_NAMES:
            raise ValueError(f"unknown scoring policy {v!r}; known: {', '.join(POLICY_NAMES)}")
        return v

    def verb_path(self, verb: str) -> str:
        """Full URL path of one verb."""
        return f"{self.url_prefix}/{verb.strip('/')}"

    @property
    def webhook(self) -> WebhookSettings:
        """The webhook's listener settings: the ``webhook_*`` fields, defaults where they are unset."""
        d = _WEBHOOK_DEFAULTS
        return WebhookSettings(
            path=d.path if self.webhook_path is None else self.webhook_path,
            listen=self.webhook_listen,
            tls_cert_file=self.webhook_tls_cert_file,
            tls_key_file=self.webhook_tls_key_file,
            cert_check_interval_s=(
                d.cert_check_interval_s
                if self.webhook_cert_check_interval_s is None
                else self.webhook_cert_check_interval_s
            ),
            max_body_bytes=d.max_body_bytes if self.webhook_max_body_bytes is None else self.webhook_max_body_bytes,
        )


class KubeAccess(BaseModel):
    """How a process reaches its cluster's API server, resolved from flags and the environment by kube_access."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    in_cluster: bool = False
    """In a pod (KUBERNETES_SERVICE_HOST set) and no kubeconfig named on the command line: use the pod's
    service account token and CA."""
    kubeconfig: str | None = None
    """Otherwise the kubeconfig file(s), os.pathsep-separated as in $KUBECONFIG (``~`` expanded); None = the
    client library's default."""

    def found(self) -> bool:
        """Whether a cluster can be found: in a pod, or one of the kubeconfig files exists."""
        return self.in_cluster or any(Path(p).is_file() for p in (self.kubeconfig or "").split(os.pathsep) if p)


class ServeProcessConfig(BaseModel):
    """`tandem-extender serve`'s one configuration object: the file, the flags and the environment, resolved."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    extender: ExtenderConfig = Field(default_factory=ExtenderConfig)
    """The extender's settings (the config file, with --listen / --log-level and TANDEM_WEBHOOK_* applied)."""
    kube: KubeAccess = Field(default_factory=KubeAccess)
    """How to reach the cluster's API server."""
    watch_cluster: bool = False
    """--kube: list+watch the cluster's API server."""
    inventory_files: tuple[Path, ...] = ()
    """--inventory-file: Kubernetes List files loaded as one full sync at start."""


def read_config(path: Path | None, **overrides: Any) -> dict[str, Any]:
    """A YAML/JSON config file's mapping (optional) with command-line overrides applied (None = not given)."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(path.read_text())
        if loaded is not None:
            if not isinstance(loaded, dict):
                raise ValueError(f"config file {path} must hold a mapping")
            data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return data


WEBHOOK_ENV: dict[str, str] = {
    "webhook_path": "TANDEM_WEBHOOK_PATH",
    "webhook_listen": "TANDEM_WEBHOOK_LISTEN",
    "webhook_tls_cert_file": "TANDEM_WEBHOOK_TLS_CERT_FILE",
    "webhook_tls_key_file": "TANDEM_WEBHOOK_TLS_KEY_FILE",
    "webhook_cert_check_interval_s": "TANDEM_WEBHOOK_CERT_CHECK_INTERVAL_S",
    "webhook_max_body_bytes": "TANDEM_WEBHOOK_MAX_BODY_BYTES",
}
"""ExtenderConfig key -> the environment variable that sets it when the file and the flags leave it unset."""


def load_config(path: Path | None, *, env: Mapping[str, str] | None = None, **overrides: Any) -> ExtenderConfig:
    """Read a YAML/JSON config file (optional), apply command-line overrides (None = not given), then fill the
    ``webhook_*`` settings still unset from ``env`` (WEBHOOK_ENV; None = no environment)."""
    data = read_config(path, **overrides)
    for key, var in WEBHOOK_ENV.items():
        value = env.get(var) if env is not None else None
        if data.get(key) is None and value:
            data[key] = value
    return ExtenderConfig.model_validate(data)


def kube_access(env: Mapping[str, str], kubeconfig: str | None = None) -> KubeAccess:
    """The API server access of a process: ``kubeconfig`` (a flag) if given, else in a pod its service account,
    else $KUBECONFIG, else ~/.kube/config."""
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()

    def expand(p: str) -> str:
        return str(home / p[2:]) if p.startswith("~/") else str(Path(p).expanduser())

    if kubeconfig is not None:
        return KubeAccess(kubeconfig=kubeconfig)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return KubeAccess(in_cluster=True)
    files = env.get("KUBECONFIG") or "~/.kube/config"
    return KubeAccess(kubeconfig=os.pathsep.join(expand(p) for p in files.split(os.pathsep) if p))


def load_serve_config(
    path: Path | None,
    *,
    env: Mapping[str, str],
    listen: str | None = None,
    log_level: str | None = None,
    kube: bool = False,
    inventory_files: Sequence[Path] = (),
) -> ServeProcessConfig:
    """The `serve` process's configuration: the file (optional), the flags (None / empty = not given), ``env``."""
    return ServeProcessConfig(
        extender=load_config(path, env=env, listen=listen, log_level=log_level),
        kube=kube_access(env),
        watch_cluster=kube,
        inventory_files=tuple(inventory_files),
    )
