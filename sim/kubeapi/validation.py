"""Field errors and the generic checks every object gets: names, labels, annotations, owner references.

Messages are apimachinery's (`validation.IsDNS1123Subdomain`, `IsQualifiedName`, ...) so a
422 from the fake reads like one from the real server, cause for cause.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from sim.kubeapi.errors import Cause

__all__ = [
    "Causes",
    "dns1035_label",
    "dns1123_label",
    "dns1123_subdomain",
    "go_value",
    "label_value",
    "path_segment_name",
    "qualified_name",
    "validate_metadata",
]

NameCheck = Callable[[str], list[str]]

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = _DNS1123_LABEL + r"(\." + _DNS1123_LABEL + ")*"
_DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(" + _QUALIFIED_NAME + ")?"


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def go_value(value: Any) -> str:
    """A bad value as field.Error prints it: strings quoted, simple types bare, the rest as JSON."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class Causes:
    """Collects field errors (field.ErrorList) in the order found."""

    def __init__(self) -> None:
        self.items: list[Cause] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def required(self, field: str, detail: str = "") -> None:
        self.items.append(Cause("FieldValueRequired", "Required value" + (f": {detail}" if detail else ""), field))

    def invalid(self, field: str, value: Any, detail: str) -> None:
        self.items.append(Cause("FieldValueInvalid", f"Invalid value: {go_value(value)}: {detail}", field))

    def not_supported(self, field: str, value: Any, supported: list[str]) -> None:
        allowed = ", ".join(f'"{s}"' for s in supported)
        self.items.append(
            Cause("FieldValueNotSupported", f"Unsupported value: {go_value(value)}: supported values: {allowed}", field)
        )

    def forbidden(self, field: str, detail: str) -> None:
        self.items.append(Cause("FieldValueForbidden", f"Forbidden: {detail}", field))

    def too_long(self, field: str, limit: int) -> None:
        self.items.append(Cause("FieldValueTooLong", f"Too long: must have at most {limit} bytes", field))

    def duplicate(self, field: str, value: Any) -> None:
        self.items.append(Cause("FieldValueDuplicate", f"Duplicate value: {go_value(value)}", field))


def dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not re.fullmatch(_DNS1123_LABEL, value):
        errs.append(
            _regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                "start and end with an alphanumeric character",
                _DNS1123_LABEL,
                "my-name",
                "123-abc",
            )
        )
    return errs


def dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not re.fullmatch(_DNS1123_SUBDOMAIN, value):
        errs.append(
            _regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
                "must start and end with an alphanumeric character",
                _DNS1123_SUBDOMAIN,
                "example.com",
            )
        )
    return errs


def dns1035_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not re.fullmatch(_DNS1035_LABEL, value):
        errs.append(
            _regex_error(
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                "alphabetic character, and end with an alphanumeric character",
                _DNS1035_LABEL,
                "my-name",
                "abc-123",
            )
        )
    return errs


def path_segment_name(value: str) -> list[str]:
    """ValidatePathSegmentName: RBAC objects may be named "system:kube-scheduler"."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]


def qualified_name(value: str) -> list[str]:
    """IsQualifiedName: an optional DNS subdomain prefix and '/', then a name part (label keys)."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        errs: list[str] = []
    elif len(parts) == 2:
        prefix, name = parts
        errs = []
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + e for e in dns1123_subdomain(prefix))
    else:
        return [
            _regex_error(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character",
                _QUALIFIED_NAME,
                "MyName",
                "my.name",
                "123-abc",
            )
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if name and not re.fullmatch(_QUALIFIED_NAME, name):
        errs.append(
            "name part "
            + _regex_error(
                "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character",
                _QUALIFIED_NAME,
                "MyName",
                "my.name",
                "123-abc",
            )
        )
    return errs


def label_value(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not re.fullmatch(_LABEL_VALUE, value):
        errs.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
                "must start and end with an alphanumeric character",
                _LABEL_VALUE,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errs


def validate_labels(labels: Mapping[str, Any], field: str, causes: Causes) -> None:
    for key, value in labels.items():
        for msg in qualified_name(key):
            causes.invalid(field, key, msg)
        for msg in label_value(str(value)):
            causes.invalid(field, value, msg)


_ANNOTATIONS_MAX = 256 * 1024


def validate_metadata(meta: Mapping[str, Any], *, namespaced: bool, name_check: NameCheck, causes: Causes) -> None:
    """ValidateObjectMeta: name (per kind), namespace, labels, annotations, owner references, finalizers."""
    name = str(meta.get("name") or "")
    if not name:
        causes.required("metadata.name", "name or generateName is required")
    else:
        for msg in name_check(name):
            causes.invalid("metadata.name", name, msg)
    namespace = str(meta.get("namespace") or "")
    if namespaced:
        if not namespace:
            causes.required("metadata.namespace")
        else:
            for msg in dns1123_label(namespace):
                causes.invalid("metadata.namespace", namespace, msg)
    elif namespace:
        causes.forbidden("metadata.namespace", "not allowed on this type")
    validate_labels(meta.get("labels") or {}, "metadata.labels", causes)
    annotations = meta.get("annotations") or {}
    size = 0
    for key, value in annotations.items():
        for msg in qualified_name(key.lower()):
            causes.invalid("metadata.annotations", key, msg)
        size += len(key) + len(str(value))
    if size > _ANNOTATIONS_MAX:
        causes.too_long("metadata.annotations", _ANNOTATIONS_MAX)
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        base = f"metadata.ownerReferences[{i}]"
        for field in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(field):
                causes.invalid(f"{base}.{field}", ref.get(field, ""), f"{field} must not be empty")
        if ref.get("controller"):
            controllers += 1
    if controllers > 1:
        causes.invalid(
            "metadata.ownerReferences",
            meta.get("ownerReferences"),
            "Only one reference can have Controller set to true",
        )
    for value in meta.get("finalizers") or []:
        for msg in qualified_name(value):
            causes.invalid("metadata.finalizers", value, msg)
