"""Small helpers over JSON objects: copies, timestamps, conditions, and the server's identity for a call."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["Call", "User", "clone", "rfc3339", "set_condition", "parse_time"]

Obj = dict[str, Any]


def clone(obj: Any) -> Any:
    """A deep copy of a JSON value (stored objects are shared with events and are never mutated)."""
    return orjson.loads(orjson.dumps(obj))


def rfc3339(when: dt.datetime) -> str:
    """metav1.Time as the server writes it: UTC, whole seconds, "Z"."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC)


def set_condition(status: Obj, condition: Obj) -> None:
    """Replace (or append) the condition of that type in status.conditions."""
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != condition["type"]]
    conditions.append(condition)
    status["conditions"] = conditions


@dataclasses.dataclass(frozen=True)
class User:
    """An authenticated caller: username and groups (system:authenticated always among them)."""

    name: str
    groups: tuple[str, ...] = ()
    token: str = ""

    @classmethod
    def of(cls, name: str, groups: Sequence[str], token: str = "") -> User:
        all_groups = tuple(dict.fromkeys([*groups, "system:authenticated"]))
        return cls(name, all_groups, token)

    @property
    def privileged(self) -> bool:
        return "system:masters" in self.groups


@dataclasses.dataclass
class Call:
    """One parsed API request: verb as RBAC computes it, target, options and the caller."""

    verb: str
    group: str
    version: str
    plural: str
    namespace: str
    name: str
    subresource: str
    query: dict[str, str]
    body: bytes
    content_type: str
    user: User
    warnings: list[str] = dataclasses.field(default_factory=list)

    def flag(self, key: str) -> bool:
        return self.query.get(key, "").lower() in ("1", "true", "t", "yes")

    @property
    def dry_run(self) -> bool:
        return self.query.get("dryRun", "") == "All"
