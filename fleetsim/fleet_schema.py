"""The schema of a fleet file: one pydantic model per level of the YAML (fleet, cluster, node group, level,
tenant) with the rules a fleet is held to, and the node label each topology level name defaults to."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from extender.agent.config import LEVEL_NAMES
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, TenantSpec
from fleetsim.node_objects import mig_layout, node_name
from placement.model import CLIQUE_LABEL, DEFAULT_BLOCK_LABEL, DEFAULT_RACK_LABEL, HOSTNAME_LABEL, ZONE_LABEL

__all__ = [
    "DEFAULT_LEVEL_KEYS",
    "MAX_NODES_PER_CLUSTER",
    "ClusterDoc",
    "FieldError",
    "FleetDoc",
    "GroupDoc",
    "LevelDoc",
    "TenantDoc",
    "first_repeat",
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


class FieldError(ValueError):
    """A validator's complaint about a field below the one it validates (`loc` relative to it)."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def first_repeat(values: Sequence[str]) -> tuple[int, int] | None:
    """The first value that repeats an earlier one, as (its index, the earlier one's index); None when all differ."""
    for i, value in enumerate(values):
        if value in values[:i]:
            return i, values.index(value)
    return None


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


def _unless_empty(check: Callable[[str], str]) -> AfterValidator:
    """`check` for a field where "" means not given."""
    return AfterValidator(lambda v: check(v) if v else v)


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
OptionalDnsLabel = Annotated[str, _unless_empty(_dns_label)]
OptionalLabelValue = Annotated[str, _unless_empty(_label_value)]
OptionalLabelKey = Annotated[str, _unless_empty(_label_key)]


def _field_default(cls: type, name: str) -> Any:
    """A model dataclass field's default, so the file's defaults are fleetsim.model's."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


class _Doc(BaseModel):
    # strict: `nodes: "8"` is a mistake to report, not a string to coerce
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LevelDoc(_Doc):
    name: str
    key: OptionalLabelKey = ""
    """"" = DEFAULT_LEVEL_KEYS[name]."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in LEVEL_NAMES:
            hint = f"; the agent calls it {_LEVEL_HINTS[v]!r}" if v in _LEVEL_HINTS else ""
            raise ValueError(f"unknown level {v!r} (known: {', '.join(LEVEL_NAMES)}){hint}")
        return v

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
    zone: OptionalLabelValue = _field_default(NodeGroup, "zone")

    @field_validator("mig")
    @classmethod
    def _mig(cls, v: str, info: ValidationInfo) -> str:
        model = info.data.get("gpu_model")
        if v and model is not None:
            mig_layout(model, v)  # raises ValueError naming the model and the layouts it has
        return v


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
                raise FieldError((i, "name"), f"level {level.name!r} given twice")
            if seen and LEVEL_NAMES.index(level.name) < LEVEL_NAMES.index(next(reversed(seen))):
                raise FieldError(
                    (i, "name"),
                    f"level {level.name!r} out of order: levels go broad to narrow, {' > '.join(LEVEL_NAMES)}",
                )
            seen[level.name] = i
        keys = [level.label_key for level in v]
        if (repeat := first_repeat(keys)) is not None:
            i, first = repeat
            raise FieldError((i, "key"), f"label key {keys[i]!r} already holds level {v[first].name!r}")
        return v

    @field_validator("groups")
    @classmethod
    def _unique_groups(cls, v: list[GroupDoc]) -> list[GroupDoc]:
        if (repeat := first_repeat([g.name for g in v])) is not None:
            i, _ = repeat
            raise FieldError((i, "name"), f"duplicate node group {v[i].name!r} in this cluster")
        return v

    @model_validator(mode="after")
    def _node_names_fit(self) -> ClusterDoc:
        for i, g in enumerate(self.groups):
            longest = len(node_name(self.name, g.name, g.nodes - 1, g.nodes))
            if longest > _HOST_NAME_LIMIT:
                raise FieldError(
                    ("groups", i, "name"),
                    f"node names '{self.name}-{g.name}-NNN' would be {longest} "
                    f"characters, over {_HOST_NAME_LIMIT}: shorten the names",
                )
        total = sum(g.nodes for g in self.groups)
        if total > MAX_NODES_PER_CLUSTER:
            raise FieldError(("groups",), f"{total} nodes, over {MAX_NODES_PER_CLUSTER} per cluster")
        return self


class TenantDoc(_Doc):
    name: DnsLabel
    weight: float = Field(_field_default(TenantSpec, "weight"), gt=0, allow_inf_nan=False)
    namespace: OptionalDnsLabel = ""
    quota: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    """GPU model (the `nvidia.com/gpu.product` value) or "*" -> nominal GPUs."""


class FleetDoc(_Doc):
    name: LabelValue
    clusters: list[ClusterDoc] = Field(min_length=1)
    tenants: list[TenantDoc] = Field(min_length=1)
    synthesised_topology: bool = _field_default(FleetSpec, "synthesised_topology")

    @field_validator("clusters")
    @classmethod
    def _unique_clusters(cls, v: list[ClusterDoc]) -> list[ClusterDoc]:
        if (repeat := first_repeat([c.name for c in v])) is not None:
            i, first = repeat
            raise FieldError((i, "name"), f"duplicate cluster {v[i].name!r} (also clusters[{first}])")
        return v

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, v: list[TenantDoc]) -> list[TenantDoc]:
        names = [t.name for t in v]
        spaces = [t.namespace or t.name for t in v]
        name_repeat, space_repeat = first_repeat(names), first_repeat(spaces)
        # the first tenant that repeats either; on the same tenant, its name is reported
        if name_repeat is not None and (space_repeat is None or name_repeat[0] <= space_repeat[0]):
            i, _ = name_repeat
            raise FieldError((i, "name"), f"duplicate tenant {names[i]!r}")
        if space_repeat is not None:
            i, first = space_repeat
            raise FieldError((i, "namespace"), f"namespace {spaces[i]!r} already belongs to tenant {names[first]!r}")
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
                    raise FieldError(("tenants", i, "quota", model), f"no cluster has GPU model {model!r}{hint}")
        return self
