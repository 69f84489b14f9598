"""The readable YAML job file of `tandem submit`, validated with pydantic and mapped onto a JobSpec."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from placement.podspec import GPU_MILLI_RESOURCE, GPU_RESOURCE
from placement.quantity import cpu_milli, to_int_bytes
from tandem.v1 import job_pb2

__all__ = ["JobFile", "PodSetFile", "load_job_file", "to_spec", "parse_duration"]

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_FRAMEWORKS = {
    "plain": job_pb2.FRAMEWORK_PLAIN,
    "torchrun": job_pb2.FRAMEWORK_TORCHRUN,
    "ray": job_pb2.FRAMEWORK_RAY,
    "mpi": job_pb2.FRAMEWORK_MPI,
}


def parse_duration(text: str | int) -> int:
    """ "1d2h30m", "90s", "45m" or a number of seconds -> seconds."""
    if isinstance(text, int):
        return text
    m = _DURATION.match(text.strip())
    if not m or not any(m.groups()):
        raise ValueError(f"not a duration: {text!r} (use e.g. 24h, 90m, 1d2h)")
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PodSetFile(_Model):
    name: str = "workers"
    replicas: int = Field(default=1, ge=1)
    gpus: int = Field(default=0, ge=0)
    gpuShare: int = Field(default=0, ge=0, le=1000, description="milli-GPU share per GPU (0 = whole)")
    gpuModels: list[str] = []
    minGpuMemoryMiB: int = 0
    migProfile: str = ""
    migCount: int = 0
    cpu: str | int = 0
    memory: str | int = 0
    extendedResources: dict[str, int] = {}
    fixedCount: bool = False
    template: dict[str, Any] = Field(default_factory=lambda: {"spec": {"containers": []}})


class TopologyFile(_Model):
    required: str = ""
    preferred: str = ""


class JobFile(_Model):
    """Fields mirror tandem.v1.JobSpec with friendlier names and units."""

    jobSet: str
    key: str = ""
    tenant: str = ""
    displayName: str = ""
    queue: str = ""
    priority: int = 0
    band: str = ""
    preemptible: bool = False
    framework: str = "plain"
    rendezvousPort: int = 0
    maxRuntime: str | int | None = None
    startTimeout: str | int | None = None
    minAvailable: int | None = None
    maxInfraRetries: int | None = None
    topology: TopologyFile = TopologyFile()
    clusters: list[str] = []
    regions: list[str] = []
    roles: list[str] = []
    dataLocality: list[str] = []
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    podSets: list[PodSetFile]


def load_job_file(path: str | Path) -> JobFile:
    raw = yaml.safe_load(Path(path).read_text())
    return JobFile.model_validate(raw)


def _dur(target: Any, value: str | int | None) -> None:
    if value is not None:
        target.seconds = parse_duration(value)


def _with_requests(ps: PodSetFile) -> dict[str, Any]:
    """The template with the pod set's resources as its first container's requests (and the extended ones
    as limits too) where the template leaves them out: the broker refuses a template that asks for other
    resources than the shape it declares, and a job file should not have to say them twice."""
    template = copy.deepcopy(ps.template)
    containers = (template.setdefault("spec", {})).setdefault("containers", [])
    if not containers:
        return template
    resources = containers[0].setdefault("resources", {})
    requests, limits = resources.setdefault("requests", {}), resources.setdefault("limits", {})
    wanted: dict[str, str] = {}
    if ps.cpu:
        wanted["cpu"] = str(ps.cpu)
    if ps.memory:
        wanted["memory"] = str(ps.memory)
    extended: dict[str, str] = {k: str(v) for k, v in ps.extendedResources.items()}
    if ps.gpus and not ps.gpuShare:
        extended[GPU_RESOURCE] = str(ps.gpus)
    elif ps.gpuShare:
        extended[GPU_MILLI_RESOURCE] = str(ps.gpuShare)
    if ps.migProfile and ps.migCount:
        extended[f"nvidia.com/mig-{ps.migProfile}"] = str(ps.migCount)
    for name, value in wanted.items():
        requests.setdefault(name, value)
    for name, value in extended.items():
        if name not in requests and name not in limits:
            limits[name] = value  # extended resources: limits imply equal requests
    return template


def to_spec(jf: JobFile) -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(
        tenant=jf.tenant,
        queue=jf.queue,
        priority=jf.priority,
        priority_band=jf.band,
        preemptible=jf.preemptible,
        framework=_FRAMEWORKS.get(jf.framework.lower(), job_pb2.FRAMEWORK_UNSPECIFIED),
        display_name=jf.displayName,
        rendezvous_port=jf.rendezvousPort,
    )
    if jf.maxRuntime is not None:
        _dur(s.max_runtime, jf.maxRuntime)
    if jf.startTimeout is not None:
        _dur(s.start_timeout, jf.startTimeout)
    if jf.minAvailable is not None:
        s.min_available = jf.minAvailable
    if jf.maxInfraRetries is not None:
        s.max_infra_retries = jf.maxInfraRetries
    s.topology.required_level = jf.topology.required
    s.topology.preferred_level = jf.topology.preferred
    s.cluster_selector.clusters.extend(jf.clusters)
    s.cluster_selector.regions.extend(jf.regions)
    s.cluster_selector.roles.extend(jf.roles)
    s.data_locality.preferred_clusters.extend(jf.dataLocality)
    s.labels.update(jf.labels)
    s.annotations.update(jf.annotations)
    for ps in jf.podSets:
        out = s.pod_sets.add(
            name=ps.name,
            count=ps.replicas,
            fixed_count=ps.fixedCount,
            pod_template_json=json.dumps(_with_requests(ps), sort_keys=True),
        )
        sh = out.shape
        sh.gpu_count = ps.gpus
        sh.gpu_milli = ps.gpuShare
        sh.allowed_gpu_models.extend(ps.gpuModels)
        sh.min_gpu_memory_mib = ps.minGpuMemoryMiB
        sh.mig_profile = ps.migProfile
        sh.mig_count = ps.migCount
        sh.cpu_milli = cpu_milli(ps.cpu) if ps.cpu else 0
        sh.memory_bytes = to_int_bytes(ps.memory) if ps.memory else 0
        sh.extended_resources.update(ps.extendedResources)
    return s


def default_key(jf: JobFile) -> str:
    """A stable key from the file's content, so re-running the same submit is idempotent."""
    return "file-" + hashlib.sha256(jf.model_dump_json().encode()).hexdigest()[:32]
