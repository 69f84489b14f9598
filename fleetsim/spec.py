"""The fleet description: YAML fleets validated against the file's schema (`fleetsim.fleet_schema`) into
`fleetsim.model.FleetSpec`, with errors that name the field and what is wrong; fleets built in code checked by the
same rules; the shipped default fleet."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import os
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from fleetplan.catalog import Level
from fleetsim.fleet_schema import FieldError, FleetDoc, first_repeat
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, TenantSpec

__all__ = ["FleetSpecError", "check_fleet", "default_fleet", "load_fleet", "parse_fleet"]


class FleetSpecError(ValueError):
    """A fleet description that cannot be used: `source` (the file) and, per problem, the field and what is wrong."""

    def __init__(self, source: str, problems: Sequence[tuple[str, str]]) -> None:
        self.source = source
        self.problems = tuple(problems)
        self.field = self.problems[0][0] if self.problems else ""
        lines = [f"{field}: {msg}" if field else msg for field, msg in self.problems]
        super().__init__(f"{source}: " + ("\n  ".join(lines) if len(lines) < 2 else "\n  " + "\n  ".join(lines)))


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
    for i, tenant in enumerate(spec.tenants):
        models = [m for m, _ in tenant.quota]
        if (repeat := first_repeat(models)) is not None:
            dup = models[repeat[0]]
            raise FleetSpecError(source, [(f"tenants[{i}]({tenant.name}).quota", f"{dup!r} given twice")])
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
        if isinstance(cause, FieldError):
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
