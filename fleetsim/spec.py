"""The fleet description: YAML fleets validated into `fleetsim.model.FleetSpec`, the shipped default fleet, a fleet
built from the Alibaba openb node list, and each cluster's nodes as real-format Kubernetes Node objects."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import ipaddress
import os
import re
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, get_args

import numpy as np
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from extender.agent.config import LEVEL_NAMES
from fleetsim.model import ClusterSpec, FleetSpec, Level, NodeGroup, TenantSpec
from placement import mig
from placement.model import (
    CLIQUE_LABEL,
    DEFAULT_BLOCK_LABEL,
    DEFAULT_RACK_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    HOSTNAME_LABEL,
    ZONE_LABEL,
)
from placement.podspec import GPU_RESOURCE
from sim.nodes import node_conditions
from sim.trace import load_nodes

__all__ = [
    "DEFAULT_LEVEL_KEYS",
    "FleetSpecError",
    "NodeLocation",
    "alibaba_fleet",
    "check_fleet",
    "default_fleet",
    "load_fleet",
    "mig_layout",
    "node_locations",
    "node_objects",
    "parse_fleet",
]

DEFAULT_LEVEL_KEYS: dict[str, str] = {
    "zone": ZONE_LABEL,
    "block": DEFAULT_BLOCK_LABEL,
    "rack": DEFAULT_RACK_LABEL,
    "nvlink": CLIQUE_LABEL,
    "host": HOSTNAME_LABEL,
}
"""The node label of each level name when the fleet file gives none: the extender's shipped keys. The names
are the agent's (`LEVEL_NAMES`), since jobs ask for a level by the name the agent reports in its Hello."""

_LEVEL_HINTS = {"clique": "nvlink", "hostname": "host", "node": "host", "spine": "block"}
"""Level names people write that the agent reports under another name."""

MAX_NODES_PER_CLUSTER = 32768
"""Node addresses come from 10.0.0.0/9 and pod CIDRs (a /24 per node) from 10.128.0.0/9: 32768 of them."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HOST_NAME_LIMIT = 63  # a node name is also its hostname label value


class FleetSpecError(ValueError):
    """A fleet description that cannot be used: `source` (the file) and, per problem, the field and what is wrong."""

    def __init__(self, source: str, problems: Sequence[tuple[str, str]]) -> None:
        self.source = source
        self.problems = tuple(problems)
        self.field = self.problems[0][0] if self.problems else ""
        lines = [f"{field}: {msg}" if field else msg for field, msg in self.problems]
        super().__init__(f"{source}: " + ("\n  ".join(lines) if len(lines) < 2 else "\n  " + "\n  ".join(lines)))


class _FieldError(ValueError):
    """A validator's complaint about a field below the one it validates (`loc` relative to it)."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


# --------------------------------------------------------------------------- the file's schema


def _dns_label(v: str) -> str:
    if not _DNS_LABEL.fullmatch(v):
        raise ValueError(f"{v!r} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)")
    return v


def _label_value(v: str) -> str:
    if not v or not _LABEL_VALUE.fullmatch(v):
        raise ValueError(f"{v!r} is not a Kubernetes label value (letters, digits, '-', '_', '.', at most 63)")
    return v


def _label_key(v: str) -> str:
    prefix, _, name = v.rpartition("/")
    if (
        (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)))
        or not name
        or not _LABEL_VALUE.fullmatch(name)
    ):
        raise ValueError(f"{v!r} is not a Kubernetes label key ([prefix/]name)")
    return v


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
LabelValue = Annotated[str, AfterValidator(_label_value)]


def _field_default(cls: type, name: str) -> Any:
    """A model dataclass field's default, so the file's defaults are fleetsim.model's."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


class _Doc(BaseModel):
    # strict: `nodes: "8"` is a mistake to report, not a string to coerce
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LevelDoc(_Doc):
    name: str
    key: str = ""
    """"" = DEFAULT_LEVEL_KEYS[name]."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in LEVEL_NAMES:
            hint = f"; the agent calls it {_LEVEL_HINTS[v]!r}" if v in _LEVEL_HINTS else ""
            raise ValueError(f"unknown level {v!r} (known: {', '.join(LEVEL_NAMES)}){hint}")
        return v

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        return _label_key(v) if v else v

    @property
    def label_key(self) -> str:
        return self.key or DEFAULT_LEVEL_KEYS[self.name]


class GroupDoc(_Doc):
    name: DnsLabel
    gpu_model: LabelValue
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    gpu_memory_mib: int = Field(ge=0)
    cpu_cores: int = Field(ge=1)
    memory_gib: int = Field(ge=1)
    mig: str = _field_default(NodeGroup, "mig")
    nodes_per_rack: int = Field(_field_default(NodeGroup, "nodes_per_rack"), ge=1)
    racks_per_block: int = Field(_field_default(NodeGroup, "racks_per_block"), ge=1)
    clique_nodes: int = Field(_field_default(NodeGroup, "clique_nodes"), ge=0)
    zone: str = _field_default(NodeGroup, "zone")

    @field_validator("mig")
    @classmethod
    def _mig(cls, v: str, info: ValidationInfo) -> str:
        model = info.data.get("gpu_model")
        if v and model is not None:
            mig_layout(model, v)  # raises ValueError naming the model and the layouts it has
        return v

    @field_validator("zone")
    @classmethod
    def _zone(cls, v: str) -> str:
        return _label_value(v) if v else v


class ClusterDoc(_Doc):
    name: DnsLabel
    region: LabelValue
    role: LabelValue
    levels: list[LevelDoc] = Field(min_length=1)
    groups: list[GroupDoc] = Field(min_length=1)
    background_pods_per_min: float = Field(
        _field_default(ClusterSpec, "background_pods_per_min"), ge=0, allow_inf_nan=False
    )

    @field_validator("levels", mode="before")
    @classmethod
    def _level_names(cls, v: Any) -> Any:
        # `levels: [zone, rack]` is short for `[{name: zone}, {name: rack}]`
        return [{"name": x} if isinstance(x, str) else x for x in v] if isinstance(v, list) else v

    @field_validator("levels")
    @classmethod
    def _level_order(cls, v: list[LevelDoc]) -> list[LevelDoc]:
        seen: dict[str, int] = {}
        for i, level in enumerate(v):
            if level.name in seen:
                raise _FieldError((i, "name"), f"level {level.name!r} given twice")
            if seen and LEVEL_NAMES.index(level.name) < LEVEL_NAMES.index(next(reversed(seen))):
                raise _FieldError(
                    (i, "name"),
                    f"level {level.name!r} out of order: levels go broad to narrow, {' > '.join(LEVEL_NAMES)}",
                )
            seen[level.name] = i
        keys = [level.label_key for level in v]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                raise _FieldError((i, "key"), f"label key {key!r} already holds level {v[keys.index(key)].name!r}")
        return v

    @field_validator("groups")
    @classmethod
    def _unique_groups(cls, v: list[GroupDoc]) -> list[GroupDoc]:
        names = [g.name for g in v]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _FieldError((i, "name"), f"duplicate node group {name!r} in this cluster")
        return v

    @model_validator(mode="after")
    def _node_names_fit(self) -> ClusterDoc:
        for i, g in enumerate(self.groups):
            longest = len(_node_name(self.name, g.name, g.nodes - 1, g.nodes))
            if longest > _HOST_NAME_LIMIT:
                raise _FieldError(
                    ("groups", i, "name"),
                    f"node names '{self.name}-{g.name}-NNN' would be {longest} "
                    f"characters, over {_HOST_NAME_LIMIT}: shorten the names",
                )
        total = sum(g.nodes for g in self.groups)
        if total > MAX_NODES_PER_CLUSTER:
            raise _FieldError(("groups",), f"{total} nodes, over {MAX_NODES_PER_CLUSTER} per cluster")
        return self


class TenantDoc(_Doc):
    name: DnsLabel
    weight: float = Field(_field_default(TenantSpec, "weight"), gt=0, allow_inf_nan=False)
    namespace: str = ""
    quota: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    """GPU model (the `nvidia.com/gpu.product` value) or "*" -> nominal GPUs."""

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return _dns_label(v) if v else v


class FleetDoc(_Doc):
    name: LabelValue
    clusters: list[ClusterDoc] = Field(min_length=1)
    tenants: list[TenantDoc] = Field(min_length=1)
    synthesised_topology: bool = _field_default(FleetSpec, "synthesised_topology")

    @field_validator("clusters")
    @classmethod
    def _unique_clusters(cls, v: list[ClusterDoc]) -> list[ClusterDoc]:
        names = [c.name for c in v]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _FieldError((i, "name"), f"duplicate cluster {name!r} (also clusters[{names.index(name)}])")
        return v

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, v: list[TenantDoc]) -> list[TenantDoc]:
        names = [t.name for t in v]
        spaces = [t.namespace or t.name for t in v]
        for i, t in enumerate(v):
            if names[i] in names[:i]:
                raise _FieldError((i, "name"), f"duplicate tenant {t.name!r}")
            if spaces[i] in spaces[:i]:
                raise _FieldError(
                    (i, "namespace"),
                    f"namespace {spaces[i]!r} already belongs to tenant {names[spaces.index(spaces[i])]!r}",
                )
        return v

    @model_validator(mode="after")
    def _quota_models_exist(self) -> FleetDoc:
        # a quota on a model no cluster has is almost always a misspelt product name
        models = {g.gpu_model for c in self.clusters for g in c.groups}
        for i, t in enumerate(self.tenants):
            for model in t.quota:
                if model != "*" and model not in models:
                    close = difflib.get_close_matches(model, sorted(models), n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else f" (models: {', '.join(sorted(models))})"
                    raise _FieldError(("tenants", i, "quota", model), f"no cluster has GPU model {model!r}{hint}")
        return self


# --------------------------------------------------------------------------- loading and checking


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys without a word; a fleet file with one is a mistake."""


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Hashable, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_fleet(path: str | os.PathLike[str]) -> FleetSpec:
    """The fleet described by a YAML file (format: the header of fleetsim/fleets/default.yaml)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise FleetSpecError(str(path), [("", f"cannot read: {e.strerror or e}")]) from e
    return parse_fleet(text, str(path))


def parse_fleet(text: str, source: str = "<fleet>") -> FleetSpec:
    """The fleet described by YAML text; `source` names it in errors."""
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise FleetSpecError(source, [("", f"{where}{getattr(e, 'problem', None) or e}")]) from e
    return _validated(doc, source)


def check_fleet(spec: FleetSpec, source: str = "<fleet>") -> None:
    """Raise FleetSpecError if a fleet built in code breaks a rule a fleet file is held to (the same rules:
    the spec goes through the file's schema)."""
    quota_models = [[m for m, _ in t.quota] for t in spec.tenants]
    for i, models in enumerate(quota_models):
        dup = next((m for j, m in enumerate(models) if m in models[:j]), None)
        if dup is not None:
            raise FleetSpecError(source, [(f"tenants[{i}]({spec.tenants[i].name}).quota", f"{dup!r} given twice")])
    _validated(_doc_of(spec), source)


def _validated(doc: Any, source: str) -> FleetSpec:
    if not isinstance(doc, dict):
        kind = type(doc).__name__
        raise FleetSpecError(source, [("", f"a fleet is a mapping (name, clusters, tenants), not {kind}")])
    try:
        parsed = FleetDoc.model_validate(doc)
    except ValidationError as e:
        raise FleetSpecError(source, _problems(e, doc)) from e
    return _spec_of(parsed)


def _problems(exc: ValidationError, doc: Any) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, _FieldError):
            loc += cause.loc
        if isinstance(cause, ValueError):
            msg = str(cause)
        elif err["type"] == "extra_forbidden":
            msg = _unknown_field(loc)
        elif err["type"] == "missing":
            msg = "required, missing"
        else:
            msg = err["msg"]
        out.append((_field_path(loc, doc), msg))
    return out


def _field_path(loc: tuple[str | int, ...], doc: Any) -> str:
    """`clusters[1](infer-a100).groups[0](a100-mig).mig`: indices with the item's name, as people find it."""
    parts: list[str] = []
    node = doc
    for x in loc:
        if isinstance(x, int):
            item = node[x] if isinstance(node, list) and 0 <= x < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            step = f"[{x}]" + (f"({name})" if isinstance(name, str) else "")
            if parts:
                parts[-1] += step
            else:
                parts.append(step)
            node = item
        else:
            parts.append(str(x))
            node = node.get(x) if isinstance(node, dict) else None
    return ".".join(parts)


def _unknown_field(loc: tuple[str | int, ...]) -> str:
    model: type[BaseModel] | None = FleetDoc
    for x in loc[:-1]:
        if isinstance(x, int) or model is None:
            continue
        info = model.model_fields.get(x)
        model = (
            next(
                (
                    a
                    for a in (info.annotation, *get_args(info.annotation))
                    if isinstance(a, type) and issubclass(a, BaseModel)
                ),
                None,
            )
            if info is not None
            else None
        )
    name = str(loc[-1])
    if model is None:
        return f"unknown field {name!r}"
    allowed = list(model.model_fields)
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown field {name!r}{hint} (allowed: {', '.join(allowed)})"


def _spec_of(doc: FleetDoc) -> FleetSpec:
    clusters = tuple(
        ClusterSpec(
            name=c.name,
            region=c.region,
            role=c.role,
            levels=tuple(Level(level.name, level.label_key) for level in c.levels),
            groups=tuple(NodeGroup(**g.model_dump()) for g in c.groups),
            background_pods_per_min=c.background_pods_per_min,
        )
        for c in doc.clusters
    )
    tenants = tuple(TenantSpec(t.name, t.weight, t.namespace, tuple(t.quota.items())) for t in doc.tenants)
    return FleetSpec(doc.name, clusters, tenants, doc.synthesised_topology)


def _doc_of(spec: FleetSpec) -> dict[str, Any]:
    """A spec in the file's shape (what `_spec_of` inverts)."""
    return {
        "name": spec.name,
        "synthesised_topology": spec.synthesised_topology,
        "clusters": [
            {
                "name": c.name,
                "region": c.region,
                "role": c.role,
                "levels": [{"name": level.name, "key": level.key} for level in c.levels],
                "groups": [dataclasses.asdict(g) for g in c.groups],
                "background_pods_per_min": c.background_pods_per_min,
            }
            for c in spec.clusters
        ],
        "tenants": [
            {"name": t.name, "weight": t.weight, "namespace": t.namespace, "quota": dict(t.quota)} for t in spec.tenants
        ],
    }


def default_fleet() -> FleetSpec:
    """The shipped demo fleet (fleetsim/fleets/default.yaml): four heterogeneous clusters, three tenants."""
    resource = importlib.resources.files("fleetsim") / "fleets" / "default.yaml"
    return parse_fleet(resource.read_text(encoding="utf-8"), "fleetsim/fleets/default.yaml")


# --------------------------------------------------------------------------- MIG


def mig_layout(gpu_model: str, layout: str) -> dict[str, int]:
    """MIG instances on each GPU of `gpu_model` under a mig-manager layout ("all-<profile>" or "all-balanced"),
    profile -> count; ValueError when the model has no MIG or no such layout (MIG-GEOMETRY.md §1-2)."""
    family = mig.family_of(gpu_model)
    if family is None:
        raise ValueError(f"{gpu_model!r} has no MIG (MIG-capable: A100, A30, H100, H200, B200, GB200)")
    profiles = mig.FAMILY_PROFILES[family]
    classes = mig.CLASSES_A30 if family == "A30" else mig.CLASSES_8
    by_class: dict[str, str] = {}
    for profile, cls in profiles.items():
        by_class.setdefault(cls, profile)  # GB200: the production-board names come first
    if layout == "all-balanced":
        # mig-parted's default config: two 1g, one 2g (and one 3g on 8-slice GPUs)
        wanted = {"1g": 2, "2g": 1} if family == "A30" else {"1g": 2, "2g": 1, "3g": 1}
        return {by_class[c]: n for c, n in wanted.items()}
    profile = layout.removeprefix("all-")
    cls_name = profiles.get(profile) if layout.startswith("all-") else None
    if cls_name is None or classes[cls_name].media:  # a +me profile exists once per GPU: no "all-" of it
        known = ["all-balanced", *(f"all-{p}" for p, c in profiles.items() if not classes[c].media)]
        raise ValueError(f"unknown MIG layout {layout!r} for {gpu_model} (known: {', '.join(known)})")
    return {profile: classes[cls_name].max_count}


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class NodeLocation:
    """Where one node of a cluster sits. Each group starts a new block and rack (a rack holds one kind of
    node); racks, blocks and cliques are numbered through the cluster."""

    name: str
    group: NodeGroup
    index: int
    """Position in the cluster (its addresses come from it)."""
    zone: str
    block: str
    rack: str
    clique: str
    """`nvidia.com/gpu.clique` value ("" = not in an NVLink clique)."""

    def level_value(self, level: str) -> str:
        """The node's value of a level name ("" = no such label on the node)."""
        return {"zone": self.zone, "block": self.block, "rack": self.rack, "nvlink": self.clique, "host": self.name}[
            level
        ]


def _node_name(cluster: str, group: str, i: int, count: int) -> str:
    return f"{cluster}-{group}-{i:0{max(3, len(str(count - 1)))}d}"


def node_locations(cluster: ClusterSpec) -> list[NodeLocation]:
    """Every node of a cluster, in order, with its topology."""
    out: list[NodeLocation] = []
    racks = blocks = 0
    for g in cluster.groups:
        fabric = uuid.uuid5(uuid.NAMESPACE_DNS, f"{g.name}.{cluster.name}.fleetsim")  # GFD: <ClusterUUID>.<CliqueId>
        zone = g.zone or f"{cluster.region}-a"
        for i in range(g.nodes):
            rack = i // g.nodes_per_rack
            out.append(
                NodeLocation(
                    name=_node_name(cluster.name, g.name, i, g.nodes),
                    group=g,
                    index=len(out),
                    zone=zone,
                    block=f"b{blocks + rack // g.racks_per_block + 1}",
                    rack=f"r{racks + rack + 1}",
                    clique=f"{fabric}.{i // g.clique_nodes + 1}" if g.clique_nodes else "",
                )
            )
        group_racks = -(-g.nodes // g.nodes_per_rack)
        racks += group_racks
        blocks += -(-group_racks // g.racks_per_block)
    return out


# GFD's family and compute capability labels, by product name (most specific first)
_ARCHITECTURES: tuple[tuple[re.Pattern[str], str, int, int], ...] = tuple(
    (re.compile(p, re.IGNORECASE), family, major, minor)
    for p, family, major, minor in (
        (r"B200", "blackwell", 10, 0),
        (r"H100|H200|H800|GH200", "hopper", 9, 0),
        (r"A100|A800|A30\b", "ampere", 8, 0),
        (r"A10\b|A10G|A40|A6000", "ampere", 8, 6),
        (r"V100", "volta", 7, 0),
        (r"T4\b", "turing", 7, 5),
        (r"P100", "pascal", 6, 0),
    )
)
_GRACE = re.compile(r"GB200|GH200", re.IGNORECASE)
"""Superchips whose host CPU is Grace: the node is arm64."""
_HEARTBEAT_S = 1_764_460_800.0
"""Condition times of a fresh node (the fixtures' GFD timestamp); the kubelet stand-in posts its own."""
_NODE_IPS = ipaddress.IPv4Network("10.0.0.0/9")
_POD_CIDRS = ipaddress.IPv4Network("10.128.0.0/9")


def _gfd_labels(g: NodeGroup, mig_strategy: str) -> dict[str, str]:
    """The GPU feature discovery and mig-manager labels of a node of group `g`."""
    family = mig.family_of(g.gpu_model)
    capable = family is not None
    labels = {
        "nvidia.com/gpu.present": "true",
        GPU_PRODUCT_LABEL: g.gpu_model,
        "nvidia.com/gpu.count": str(g.gpus_per_node),
        "nvidia.com/gpu.machine": "generic-server",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.full": "580.95.05",
        "nvidia.com/mig.capable": str(capable).lower(),
        "nvidia.com/mig.strategy": mig_strategy,
    }
    if g.gpu_memory_mib:  # 0 = not known (the trace's undisclosed models): no label rather than a wrong one
        labels[GPU_MEMORY_LABEL] = str(g.gpu_memory_mib)
    arch = next(((f, ma, mi) for p, f, ma, mi in _ARCHITECTURES if p.search(g.gpu_model)), None)
    if arch is not None:
        labels.update(
            {
                "nvidia.com/gpu.family": arch[0],
                "nvidia.com/gpu.compute.major": str(arch[1]),
                "nvidia.com/gpu.compute.minor": str(arch[2]),
            }
        )
    if capable and mig_strategy == "mixed":
        labels.update({"nvidia.com/mig.config": g.mig or "all-disabled", "nvidia.com/mig.config.state": "success"})
    if g.mig and family is not None:
        classes = mig.CLASSES_A30 if family == "A30" else mig.CLASSES_8
        for profile, per_gpu in mig_layout(g.gpu_model, g.mig).items():
            slices = str(classes[mig.FAMILY_PROFILES[family][profile]].compute)
            prefix = mig.resource_name(profile)
            # memory and SM counts are left out: MIG-GEOMETRY has no verified figures for every model
            labels.update(
                {
                    f"{prefix}.count": str(per_gpu * g.gpus_per_node),
                    f"{prefix}.product": f"{g.gpu_model}-MIG-{profile}",
                    f"{prefix}.replicas": "1",
                    f"{prefix}.sharing-strategy": "none",
                    f"{prefix}.slices.gi": slices,
                    f"{prefix}.slices.ci": slices,
                }
            )
    return labels


def _node_object(cluster: ClusterSpec, loc: NodeLocation, mig_strategy: str) -> dict[str, Any]:
    g = loc.group
    arch = "arm64" if _GRACE.search(g.gpu_model) else "amd64"
    labels = {
        HOSTNAME_LABEL: loc.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "topology.kubernetes.io/region": cluster.region,
        ZONE_LABEL: loc.zone,
    }
    for level in cluster.levels:
        value = loc.level_value(level.name)
        if value:  # a node outside any clique has no clique label (GFD sets it on fabric-attached GPUs only)
            labels[level.key] = value
    if loc.clique:
        labels[CLIQUE_LABEL] = loc.clique
    labels.update(_gfd_labels(g, mig_strategy))
    resources = {"cpu": str(g.cpu_cores), "memory": f"{g.memory_gib}Gi", "pods": "110", "ephemeral-storage": "1800Gi"}
    if g.mig:  # mixed strategy: every GPU is partitioned, so none is published whole
        for profile, per_gpu in mig_layout(g.gpu_model, g.mig).items():
            resources[mig.resource_name(profile)] = str(per_gpu * g.gpus_per_node)
        resources[GPU_RESOURCE] = "0"
    else:
        resources[GPU_RESOURCE] = str(g.gpus_per_node)
    ip = str(_NODE_IPS.network_address + 1 + loc.index)
    pod_cidr = str(ipaddress.IPv4Network((int(_POD_CIDRS.network_address) + 256 * loc.index, 24)))
    ident = uuid.uuid5(uuid.NAMESPACE_DNS, f"{loc.name}.{cluster.name}.fleetsim")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": loc.name,
            "labels": labels,
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": node_conditions(None, True, _HEARTBEAT_S),
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": loc.name}],
            "nodeInfo": {
                "kubeletVersion": "v1.35.2",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kernelVersion": "6.8.0-60-generic",
                "osImage": "Ubuntu 24.04.2 LTS",
                "operatingSystem": "linux",
                "architecture": arch,
                "machineID": ident.hex,
                "systemUUID": str(ident),
                "bootID": str(uuid.uuid5(ident, "boot")),
                "kubeProxyVersion": "",
            },
        },
    }


def node_objects(cluster: ClusterSpec) -> list[dict[str, Any]]:
    """The cluster's nodes as a kubelet registers them and `kubectl get node -o json` shows them (without the
    server-set uid, resourceVersion and creationTimestamp): GFD labels, the GPU taint, device-plugin resources
    (MIG instances under the mixed strategy), topology labels of the cluster's levels."""
    mig_strategy = "mixed" if any(g.mig for g in cluster.groups) else "none"
    return [_node_object(cluster, loc, mig_strategy) for loc in node_locations(cluster)]


# --------------------------------------------------------------------------- the Alibaba openb fleet

_OPENB_FAMILIES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("g2", ("G2",), "training"),
    ("g3", ("G3",), "training"),
    ("v100", ("V100M16", "V100M32"), "batch"),
    ("p100", ("P100",), "batch"),
    ("t4", ("T4", "A10"), "inference"),
)
"""Models that plausibly share a cluster, in an order where neighbours are alike (8-GPU G2/G3 nodes, then V100,
then the older P100, then the small inference boards): fewer clusters merge neighbours."""
_OPENB_GPU_MEMORY_MIB = {"P100": 16384, "V100M16": 16384, "V100M32": 32768, "T4": 15360, "A10": 23028}
"""The trace gives no GPU memory: the boards' nominal sizes (G1/G2/G3 are undisclosed: 0, unknown)."""
_OPENB_REGION = "openb"
_OPENB_TENANTS = (TenantSpec("research", 2.0), TenantSpec("product", 1.0), TenantSpec("analytics", 1.0))
_OPENB_LEVELS = tuple(Level(n, DEFAULT_LEVEL_KEYS[n]) for n in ("zone", "block", "rack"))


@dataclass
class _Part:
    """Nodes (trace row indices) bound for one cluster."""

    base: str
    role: str
    rows: list[int]
    gpus: int


def _dns(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def _rack_size(gpus_per_node: int) -> int:
    """Synthesised racks: about 32 GPUs each (power and cooling), at most 16 nodes."""
    return max(1, min(16, 32 // gpus_per_node))


def alibaba_fleet(node_csv_path: str | os.PathLike[str], clusters: int = 4, seed: int = 0) -> FleetSpec:
    """A fleet of `clusters` clusters from the openb node list (`sim.trace.load_nodes`), split by GPU model so
    each cluster is plausible; nodes without GPUs are skipped. The trace has no topology: zones, blocks and racks
    are made up (`synthesised_topology`). `seed` deals the nodes of a cluster that must be split in two."""
    path = Path(node_csv_path)
    table = load_nodes(path)
    rows = [i for i, n in enumerate(table.gpus) if n > 0]
    if not 1 <= clusters <= len(rows):
        raise ValueError(f"clusters must be 1..{len(rows)} (GPU nodes in {path}), not {clusters}")
    families = list(_OPENB_FAMILIES)
    known = {m for _, models, _ in families for m in models}
    for model in sorted({table.models[i] for i in rows} - known):  # another trace's models: one family each
        families.append((_dns(model), (model,), "batch"))
    parts: list[_Part] = []
    for base, models, role in families:
        mine = [i for i in rows if table.models[i] in models]
        if mine:
            parts.append(_Part(base, role, mine, sum(table.gpus[i] for i in mine)))
    while len(parts) > clusters:
        # the smallest merges into its smaller neighbour, which keeps the role of the bigger of the two
        i = min(range(len(parts)), key=lambda k: parts[k].gpus)
        j = min((k for k in (i - 1, i + 1) if 0 <= k < len(parts)), key=lambda k: parts[k].gpus)
        a, b = sorted((i, j))
        left, right = parts[a], parts[b]
        role = left.role if left.gpus >= right.gpus else right.role
        parts[a : b + 1] = [_Part(f"{left.base}-{right.base}", role, left.rows + right.rows, left.gpus + right.gpus)]
    rng = np.random.default_rng(seed)
    while len(parts) < clusters:
        i = max((k for k in range(len(parts)) if len(parts[k].rows) > 1), key=lambda k: parts[k].gpus)
        dealt = [parts[i].rows[int(k)] for k in rng.permutation(len(parts[i].rows))]
        halves = [sorted(dealt[: len(dealt) // 2]), sorted(dealt[len(dealt) // 2 :])]
        parts[i : i + 1] = [_Part(parts[i].base, parts[i].role, h, sum(table.gpus[r] for r in h)) for h in halves]
    specs = []
    bases = [p.base for p in parts]
    for p in parts:
        name = f"openb-{p.base}"
        if bases.count(p.base) > 1:
            name += f"-{bases[: parts.index(p)].count(p.base) + 1}"
        shapes: dict[tuple[str, int, int, int], int] = {}
        for r in p.rows:
            shape = (table.models[r], table.gpus[r], table.cpu_milli[r], table.mem_mib[r])
            shapes[shape] = shapes.get(shape, 0) + 1
        groups = tuple(
            NodeGroup(
                # the openb nodes hold whole cores and whole GiB
                name=_dns(f"{model}-{gpus}gpu-{cpu // 1000}c-{mem // 1024}g"),
                gpu_model=model,
                nodes=count,
                gpus_per_node=gpus,
                gpu_memory_mib=_OPENB_GPU_MEMORY_MIB.get(model, 0),
                cpu_cores=cpu // 1000,
                memory_gib=mem // 1024,
                nodes_per_rack=_rack_size(gpus),
                racks_per_block=8,
            )
            for (model, gpus, cpu, mem), count in sorted(shapes.items(), key=lambda s: (s[0][0], -s[0][1], s[0][2:]))
        )
        specs.append(ClusterSpec(name, _OPENB_REGION, p.role, _OPENB_LEVELS, groups))
    fleet = FleetSpec(f"alibaba-openb-{clusters}", tuple(specs), _OPENB_TENANTS, synthesised_topology=True)
    check_fleet(fleet, str(path))
    return fleet
