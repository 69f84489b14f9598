"""Request bytes that are not the message they claim to be: decoded without raising, and where they break.

grpcio's default request deserializer raises on bytes that do not parse (corrupt or truncated wire format,
strings that are not UTF-8), and the server then answers UNKNOWN with the exception text. The method
handlers use `decoder` instead: it returns an `Undecodable` carrying the first field path at which the
bytes stop being the message (found by walking the wire format, never by recursion deeper than the
schema), and the edge answers INVALID_ARGUMENT naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["Undecodable", "decoder", "locate"]

_MAX_DEPTH = 100
"""The protobuf parser's own nesting limit; deeper is refused as such."""
_MAX_STEPS = 20_000
"""Fields and packed numbers the search looks at before it settles for the path it has reached: it runs in
Python on the event loop, and a 4 MiB request holds millions of one-byte fields."""
_OVERLONG = re.compile(rb"[\x80-\xff]{10,}")
"""A varint spans at most ten bytes."""
_VARINT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_BOOL,
        FieldDescriptor.TYPE_ENUM,
    }
)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the request deserializer returns for bytes that are not `type_name`. `field` is relative to the
    message ("" when the bytes break before any field can be named)."""

    type_name: str
    field: str
    description: str


def decoder(cls: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """A request deserializer for `cls` that never raises."""

    def decode(raw: bytes) -> Message | Undecodable:
        try:
            return cls.FromString(raw)
        except Exception:
            field, why = locate(cls.DESCRIPTOR, raw)
            return Undecodable(cls.DESCRIPTOR.full_name, field, why)

    return decode


def locate(desc: Any, data: bytes) -> tuple[str, str]:
    """(field path, what is wrong) for bytes the parser of `desc` refused; best effort, never raises."""
    found = _scan(desc, data, "", 0, [_MAX_STEPS])
    return found or ("", "corrupt wire format (or nested past the parser's limit)")


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < len(data) and shift < 70:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    return None


def _child(path: str, fd: Any, number: int, counts: dict[int, int]) -> str:
    name = fd.name if fd is not None else f"[{number}]"
    base = f"{path}.{name}" if path else name
    if fd is None or not fd.is_repeated:
        return base
    i = counts.get(number, 0)
    counts[number] = i + 1
    return f"{base}[{i}]"


def _skip(data: bytes, pos: int, wire: int, number: int, depth: int) -> int | None:
    """The position after one value of wire type `wire`, or None if the bytes end first."""
    if wire == 0:
        v = _varint(data, pos)
        return None if v is None else v[1]
    if wire in (1, 5):
        end = pos + (8 if wire == 1 else 4)
        return end if end <= len(data) else None
    if wire == 2:
        n = _varint(data, pos)
        if n is None or n[1] + n[0] > len(data):
            return None
        return n[1] + n[0]
    if wire == 3 and depth < _MAX_DEPTH:  # a group (unknown field): skip to its end tag
        while pos < len(data):
            tag = _varint(data, pos)
            if tag is None:
                return None
            key, pos = tag
            if key & 7 == 4:
                return pos if key >> 3 == number else None
            after = _skip(data, pos, key & 7, key >> 3, depth + 1)
            if after is None:
                return None
            pos = after
    return None


def _scan(desc: Any, data: bytes, path: str, depth: int, steps: list[int]) -> tuple[str, str] | None:
    """The first problem in `data` read as `desc`, or None when this level looks sound. `steps` is the
    search's remaining budget, shared by every level."""
    if depth > _MAX_DEPTH:
        return path, f"nested more than {_MAX_DEPTH} messages deep"
    counts: dict[int, int] = {}
    pos = 0
    while pos < len(data):
        steps[0] -= 1
        if steps[0] < 0:
            return path, "corrupt wire format"
        start = pos
        tag = _varint(data, pos)
        if tag is None:
            return path, f"truncated field tag at byte {start}"
        key, pos = tag
        number, wire = key >> 3, key & 7
        if number == 0 or wire > 5:
            return path, f"malformed field tag at byte {start}"
        if wire == 4:
            return path, f"unexpected end-group tag at byte {start}"
        fd = desc.fields_by_number.get(number)
        field = _child(path, fd, number, counts)
        end = _skip(data, pos, wire, number, depth)
        if end is None:
            return field, f"truncated or malformed value at byte {start}"
        if fd is not None and wire == 2:
            length = _varint(data, pos)
            assert length is not None  # _skip read it
            problem = _payload(fd, data[length[1] : end], field, depth, steps)
            if problem is not None:
                return problem
        pos = end
    return None


def _payload(fd: Any, payload: bytes, field: str, depth: int, steps: list[int]) -> tuple[str, str] | None:
    """A length-delimited value of a known field: a nested message, a string, or packed numbers."""
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        cls: Any = message_factory.GetMessageClass(fd.message_type)
        try:
            cls.FromString(payload)
        except Exception:
            return _scan(fd.message_type, payload, field, depth + 1, steps) or (
                field,
                f"not a valid {fd.message_type.full_name}",
            )
        return None
    if fd.type == FieldDescriptor.TYPE_STRING:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            return field, "not valid UTF-8"
        return None
    if fd.is_repeated and fd.type in _VARINT_TYPES:  # packed: every varint ends on a byte below 0x80
        if (payload and payload[-1] & 0x80) or _OVERLONG.search(payload):
            return field, "truncated or overlong packed value"
    return None
