"""Enum numbers a protobuf message holds that its enum does not define, found through a plan built once per type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.domain.errors import FieldViolation

__all__ = ["unknown_enums"]

V = FieldViolation


@dataclass(frozen=True, slots=True)
class _EnumPlan:
    """Where a message type keeps enum numbers: its own enum fields, and the message fields that lead to more.
    Built once per type, so a 5,000-node inventory snapshot is checked without listing every field it sets."""

    enums: tuple[tuple[str, bool, frozenset[int], str], ...]
    """(field, repeated, defined numbers, enum name)"""
    children: tuple[tuple[str, str, Any], ...]
    """(field, "one" | "many" | "map" | "map-enum", descriptor of the message or enum below)"""


_PLANS: dict[str, _EnumPlan | None] = {}


def _enum_plan(desc: Any) -> _EnumPlan | None:
    """The plan of a message type, None when no enum lies anywhere below it (memoised per type)."""
    if desc.full_name in _PLANS:
        return _PLANS[desc.full_name]
    _PLANS[desc.full_name] = None  # a recursive type ends here; its own enum fields still count
    enums, children = [], []
    for fd in desc.fields:
        if fd.type == fd.TYPE_ENUM:
            enums.append((fd.name, fd.is_repeated, frozenset(fd.enum_type.values_by_number), fd.enum_type.full_name))
        elif fd.type == fd.TYPE_MESSAGE:
            sub = fd.message_type
            if sub.GetOptions().map_entry:
                vfd = sub.fields_by_name["value"]
                if vfd.type == vfd.TYPE_ENUM:
                    children.append((fd.name, "map-enum", vfd.enum_type))
                elif vfd.type == vfd.TYPE_MESSAGE and _enum_plan(vfd.message_type) is not None:
                    children.append((fd.name, "map", vfd.message_type))
            elif _enum_plan(sub) is not None:
                children.append((fd.name, "many" if fd.is_repeated else "one", sub))
    plan = _EnumPlan(tuple(enums), tuple(children)) if enums or children else None
    _PLANS[desc.full_name] = plan
    return plan


def _bad_enum(value: int, enum_name: str, path: str) -> FieldViolation:
    return V(path, f"{value} is not a {enum_name} value")


def unknown_enums(message: Any, path: str = "") -> list[FieldViolation]:
    """Every enum field of a protobuf message (nested, repeated and map fields too) holding a number its enum
    does not define: proto3 keeps such numbers and `Enum.Name()` raises on them. Duck-typed (descriptors only)."""
    out: list[FieldViolation] = []
    plan = _enum_plan(message.DESCRIPTOR)
    if plan is not None:
        _walk_enums(message, plan, path, out)
    return out


def _walk_enums(msg: Any, plan: _EnumPlan, path: str, out: list[FieldViolation]) -> None:
    for name, repeated, known, enum_name in plan.enums:
        value = getattr(msg, name)
        p = f"{path}.{name}" if path else name
        if repeated:
            out.extend(_bad_enum(v, enum_name, f"{p}[{i}]") for i, v in enumerate(value) if v not in known)
        elif value not in known:
            out.append(_bad_enum(value, enum_name, p))
    for name, kind, desc in plan.children:
        p = f"{path}.{name}" if path else name
        if kind == "one":
            if msg.HasField(name):
                _walk_enums(getattr(msg, name), _PLANS[desc.full_name], p, out)  # type: ignore[arg-type]
        elif kind == "many":
            sub = _PLANS[desc.full_name]
            for i, m in enumerate(getattr(msg, name)):
                _walk_enums(m, sub, f"{p}[{i}]", out)  # type: ignore[arg-type]
        elif kind == "map":
            sub = _PLANS[desc.full_name]
            for k, m in getattr(msg, name).items():
                _walk_enums(m, sub, f"{p}[{k!r}]", out)  # type: ignore[arg-type]
        else:
            known_values = frozenset(desc.values_by_number)
            out.extend(
                _bad_enum(v, desc.full_name, f"{p}[{k!r}]")
                for k, v in getattr(msg, name).items()
                if v not in known_values
            )
