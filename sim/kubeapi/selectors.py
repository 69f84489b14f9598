"""Label and field selectors as the API server parses them (labels.Parse, fields.ParseSelector).

Label grammar: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, and
`k>1`/`k<1` (integer comparisons), comma meaning AND. Field selectors accept only `=`, `==`
and `!=` and only the field labels the resource supports.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from sim.kubeapi import errors
from sim.kubeapi.resources import ResourceType, field_value

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "parse_field_selector",
    "parse_label_selector",
    "match_label_selector_object",
]

_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present:
            return False
        try:
            number = int(str(value))
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _bad(text: str, why: str) -> errors.ApiError:
    return errors.bad_request(f"unable to parse requirement: {why}") if text else errors.bad_request(why)


def _check_key(key: str) -> None:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise _bad(
            key,
            f'<nil>: Invalid value: "{key}": name part must consist of alphanumeric characters, '
            "'-', '_' or '.', and must start and end with an alphanumeric character",
        )


def _check_value(key: str, value: str) -> None:
    if not _VALUE.match(value) or len(value) > 63:
        raise _bad(
            value,
            f'values[0][{key}]: Invalid value: "{value}": a valid label must be an empty string or '
            "consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character",
        )


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise errors.bad_request(f"unable to parse requirement: found ')', expected: identifier in {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise errors.bad_request(f"unable to parse requirement: found '', expected: ')' in {text!r}")
    parts.append(text[start:])
    return parts


_SET = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_CMP = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s!=<>(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=<>(),]+)\s*$")


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse `labelSelector`; a syntax error is a 400 as on the real server."""
    if text is None or not text.strip():
        return LabelSelector(())
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        if not part.strip():
            raise errors.bad_request(f"unable to parse requirement: found '', expected: identifier in {text!r}")
        if m := _SET.match(part):
            key = m.group("key")
            _check_key(key)
            values = tuple(v.strip() for v in m.group("values").split(",")) if m.group("values").strip() else ()
            if not values and m.group("op") == "in":
                raise _bad(part, "for 'in', 'notin' operators, values set can't be empty")
            for v in values:
                _check_value(key, v)
            reqs.append(Requirement(key, m.group("op"), values))
        elif m := _CMP.match(part):
            key, op, value = m.group("key"), m.group("op"), m.group("value")
            _check_key(key)
            if op in (">", "<"):
                if not re.fullmatch(r"-?[0-9]+", value):
                    raise _bad(part, "for 'Gt', 'Lt' operators, the value must be an integer")
                reqs.append(Requirement(key, "gt" if op == ">" else "lt", (value,)))
                continue
            _check_value(key, value)
            reqs.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
        elif m := _EXISTS.match(part):
            key = m.group("key")
            _check_key(key)
            reqs.append(Requirement(key, "!" if m.group("neg") else "exists"))
        else:
            raise errors.bad_request(f"unable to parse requirement: invalid selector: {part.strip()!r}")
    return LabelSelector(tuple(reqs))


def match_label_selector_object(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A metav1.LabelSelector (matchLabels + matchExpressions) against labels; None matches nothing."""
    if selector is None:
        return False
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = expr.get("operator")
        key = expr.get("key", "")
        values = tuple(expr.get("values") or ())
        mapped = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(op)
        if mapped is None or not Requirement(key, mapped, values).matches(labels):
            return False
    return True


@dataclasses.dataclass(frozen=True)
class FieldSelector:
    terms: tuple[tuple[str, bool, str], ...]  # (label, equal?, value)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, label) == value) == equal for label, equal, value in self.terms)

    @property
    def empty(self) -> bool:
        return not self.terms


def _unescape_split(text: str, sep: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur))
    return out


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(text: str | None, resource: ResourceType) -> FieldSelector:
    """Parse `fieldSelector`; labels the resource does not support are refused (400)."""
    if text is None or not text.strip():
        return FieldSelector(())
    terms: list[tuple[str, bool, str]] = []
    for part in _unescape_split(text, ","):
        if not part:
            continue
        for op, equal in (("!=", False), ("==", True), ("=", True)):  # noqa: B007 - read after the break
            idx = part.find(op)
            if idx > 0:
                label, value = part[:idx].strip(), _unescape(part[idx + len(op) :])
                break
        else:
            raise errors.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        if label not in resource.field_labels:
            raise errors.bad_request(f"field label not supported: {label}")
        terms.append((label, equal, value))
    return FieldSelector(tuple(terms))
