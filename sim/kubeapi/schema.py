"""Decode what clients write as the real server's typed decoder would, from the Kubernetes 1.36 schemas.

The strict OpenAPI-derived schemas shipped with `kubernetes_validate` (`v1.36.0-local-strict`)
are compiled once, per definition, into small nodes. One walk over an object then does what
Go's JSON decoding into the API types does: unknown fields found (refused with
`fieldValidation=Strict`, else dropped with a warning), wrong JSON types refused (400),
nulls and empty optional lists and maps dropped (omitempty), quantities, `Time` and `MicroTime` rewritten in canonical form (MicroTime must
have exactly six fractional digits). The same nodes carry the strategic-merge-patch metadata
(`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib.resources
import json
import re
from typing import Any

from sim.kubeapi.quantities import QuantityError, canonical_quantity

__all__ = ["DecodeError", "Node", "Prop", "decode", "root_node"]

SCHEMA_SET = "v1.36.0-local-strict"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
_MICROTIME = "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime"


class DecodeError(Exception):
    """The object cannot be decoded into its API type (the message is Go's decoder error)."""


@dataclasses.dataclass
class Prop:
    node: Node
    strategy: str = ""
    merge_key: str | None = None


@dataclasses.dataclass(eq=False)
class Node:
    """A compiled schema: `kind` is object, map, array, string, integer, number, boolean,
    quantity, intorstring, time, microtime or any."""

    kind: str
    name: str = ""
    go_type: str = ""
    props: dict[str, Prop] = dataclasses.field(default_factory=dict)
    required: frozenset[str] = frozenset()
    closed: bool = False
    values: Node | None = None
    items: Node | None = None
    strategy: str = ""
    merge_key: str | None = None

    def prop(self, field: str) -> Prop | None:
        return self.props.get(field)


@functools.cache
def _definitions() -> dict[str, Any]:
    base = importlib.resources.files("kubernetes_validate").joinpath(f"kubernetes-json-schema/{SCHEMA_SET}")
    defs: dict[str, Any] = json.loads(base.joinpath("_definitions.json").read_text())["$defs"]
    return defs


@functools.cache
def _gvk_index() -> dict[tuple[str, str, str], str]:
    index: dict[tuple[str, str, str], str] = {}
    for name, schema in _definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            index.setdefault((gvk["group"], gvk["version"], gvk["kind"]), name)
    return index


_compiled: dict[str, Node] = {}


def _types(schema: dict[str, Any]) -> set[str]:
    t = schema.get("type")
    if t is None:
        return set()
    return {t} if isinstance(t, str) else set(t) - {"null"}


def _compile_ref(ref: str) -> Node:
    name = ref.rsplit("/", 1)[-1]
    node = _compiled.get(name)
    if node is not None:
        return node
    short = name.rsplit(".", 1)[-1]
    if name == _QUANTITY:
        node = Node("quantity", short, "resource.Quantity")
    elif name == _INT_OR_STRING:
        node = Node("intorstring", short, "intstr.IntOrString")
    elif name == _TIME:
        node = Node("time", short, "v1.Time")
    elif name == _MICROTIME:
        node = Node("microtime", short, "v1.MicroTime")
    else:
        node = Node("any", short, f"v1.{short}")
        _compiled[name] = node  # before filling in: definitions are recursive
        _fill(node, _definitions()[name])
        return node
    _compiled[name] = node
    return node


def _fill(node: Node, schema: dict[str, Any]) -> None:
    types = _types(schema)
    if "properties" in schema:
        node.kind = "object"
        node.closed = schema.get("additionalProperties") is False
        node.required = frozenset(schema.get("required") or ())
        for field, sub in schema["properties"].items():
            node.props[field] = Prop(
                _compile(sub, node.name),
                str(sub.get("x-kubernetes-patch-strategy", "")),
                sub.get("x-kubernetes-patch-merge-key"),
            )
    elif "object" in types:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            node.kind = "map"
            node.values = _compile(extra, node.name)
            node.go_type = f"map[string]{node.values.go_type}"
        else:
            node.kind = "any"


def _compile(schema: dict[str, Any], owner: str) -> Node:
    if "$ref" in schema:
        target = _compile_ref(schema["$ref"])
        if schema.get("x-kubernetes-patch-strategy") and target.kind in ("object", "map"):
            return dataclasses.replace(target, strategy=str(schema["x-kubernetes-patch-strategy"]))
        return target
    types = _types(schema)
    if "array" in types:
        items = _compile(schema.get("items") or {}, owner)
        return Node(
            "array",
            owner,
            f"[]{items.go_type}",
            items=items,
            strategy=str(schema.get("x-kubernetes-patch-strategy", "")),
            merge_key=schema.get("x-kubernetes-patch-merge-key"),
        )
    if "string" in types:
        return Node("string", owner, "string")
    if "integer" in types:
        return Node("integer", owner, "int64" if schema.get("format") == "int64" else "int32")
    if "number" in types:
        return Node("number", owner, "float64")
    if "boolean" in types:
        return Node("boolean", owner, "bool")
    node = Node("any", owner, "map[string]interface {}")
    _fill(node, schema)
    return node


def root_node(group: str, version: str, kind: str) -> Node | None:
    name = _gvk_index().get((group, version, kind))
    return None if name is None else _compile_ref(name)


# -- decoding -------------------------------------------------------------------------

_RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_TIME_LAYOUT = "2006-01-02T15:04:05Z07:00"


def _parse_rfc3339(text: str) -> dt.datetime | None:
    m = _RFC3339.match(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    frac = m.group(7) or ""
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    zone = m.group(8)
    tz = dt.UTC
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        tz = dt.timezone(sign * dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        return dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    except ValueError:
        return None


def _time(text: object) -> str:
    if not isinstance(text, str):
        raise DecodeError("Time.UnmarshalJSON: input is not a JSON string")
    return _time_text(text)


@functools.lru_cache(maxsize=8192)
def _time_text(text: str) -> str:
    parsed = _parse_rfc3339(text)
    if parsed is None:
        raise DecodeError(f'parsing time "{text}" as "{_TIME_LAYOUT}": cannot parse "{text}" as "2006"')
    return parsed.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _microtime(text: object) -> str:
    """Go parses MicroTime with the fixed layout RFC3339Micro: exactly six fractional digits."""
    if not isinstance(text, str):
        raise DecodeError("MicroTime.UnmarshalJSON: input is not a JSON string")
    return _microtime_text(text)


@functools.lru_cache(maxsize=8192)
def _microtime_text(text: str) -> str:
    head, rest = text[:19], text[19:]
    prefix = f'parsing time "{text}" as "{_MICRO_LAYOUT}": cannot parse'
    if _parse_rfc3339(head + "Z") is None:
        raise DecodeError(f'{prefix} "{text}" as "2006"')
    if len(rest) < 7 or rest[0] != "." or not rest[1:7].isdigit():
        raise DecodeError(f'{prefix} "{rest}" as ".000000"')
    zone = rest[7:]
    if zone != "Z" and not re.fullmatch(r"[+-]\d{2}:\d{2}", zone):
        raise DecodeError(f'{prefix} "{zone}" as "Z07:00"')
    parsed = _parse_rfc3339(text)
    if parsed is None:
        raise DecodeError(f'{prefix} "{text}" as "2006"')
    return parsed.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class _Walk:
    def __init__(self, drop_unknown: bool) -> None:
        self.unknown: list[str] = []
        self.drop_unknown = drop_unknown
        self.path: list[str] = []

    def _dotted(self) -> str:
        out = ""
        for part in self.path:
            out += part if part.startswith("[") else (f".{part}" if out else part)
        return out

    def _type_error(self, node: Node, value: object) -> DecodeError:
        fields = ".".join(p for p in self.path if not p.startswith("["))
        return DecodeError(
            f"json: cannot unmarshal {_json_type(value)} into Go struct field {node.name}.{fields} of type {node.go_type}"
        )

    def value(self, node: Node, value: Any) -> Any:
        kind = node.kind
        if kind == "object":
            if not isinstance(value, dict):
                raise self._type_error(node, value)
            out: dict[str, Any] = {}
            for field, sub in value.items():
                if sub is None:
                    continue
                prop = node.props.get(field)
                if prop is None:
                    if node.closed:
                        self.path.append(field)
                        self.unknown.append(self._dotted())
                        self.path.pop()
                        if self.drop_unknown:
                            continue
                    out[field] = sub
                    continue
                self.path.append(field)
                decoded = self.value(prop.node, sub)
                self.path.pop()
                if decoded in ([], {}) and prop.node.kind in ("array", "map") and field not in node.required:
                    continue  # Go's omitempty: an empty list or map is not written back
                out[field] = decoded
            return out
        if kind == "map":
            if not isinstance(value, dict):
                raise self._type_error(node, value)
            assert node.values is not None
            result: dict[str, Any] = {}
            for key, sub in value.items():
                self.path.append(key)
                result[key] = "" if sub is None and node.values.kind == "string" else self.value(node.values, sub)
                self.path.pop()
            return result
        if kind == "array":
            if not isinstance(value, list):
                raise self._type_error(node, value)
            assert node.items is not None
            items = []
            for i, sub in enumerate(value):
                self.path.append(f"[{i}]")
                items.append(self.value(node.items, sub))
                self.path.pop()
            return items
        return self._scalar(node, value)

    def _scalar(self, node: Node, value: Any) -> Any:
        kind = node.kind
        if kind == "string":
            if not isinstance(value, str):
                raise self._type_error(node, value)
        elif kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self._type_error(node, value)
        elif kind == "number":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._type_error(node, value)
        elif kind == "boolean":
            if not isinstance(value, bool):
                raise self._type_error(node, value)
        elif kind == "quantity":
            try:
                return canonical_quantity(value)
            except QuantityError as e:
                raise DecodeError(str(e)) from e
        elif kind == "intorstring":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise self._type_error(node, value)
        elif kind == "time":
            return _time(value)
        elif kind == "microtime":
            return _microtime(value)
        return value


def decode(node: Node, obj: dict[str, Any], *, drop_unknown: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Decode obj against its root node: (normalised copy, unknown field paths). Raises DecodeError."""
    walk = _Walk(drop_unknown)
    out = walk.value(node, obj)
    assert isinstance(out, dict)
    return out, walk.unknown
