"""Request bodies into objects: media types, kind/version checks and schema decoding with field validation.

`fieldValidation` is honoured as on the real server: Strict refuses unknown fields (400 on a
create or update, 422 on a patch, as the real handlers answer), Warn (the default) and Ignore
drop them, Warn with one `Warning` header per field.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import yaml

from sim.kubeapi import errors, schema
from sim.kubeapi.objects import Call
from sim.kubeapi.resources import ResourceType

__all__ = ["decode_object", "parse_json_body", "field_validation", "media_type"]

Obj = dict[str, Any]

BODY_TYPES = ("application/json", "application/yaml", "application/vnd.kubernetes.protobuf")


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def field_validation(call: Call) -> str:
    value = call.query.get("fieldValidation", "Warn") or "Warn"
    if value not in ("Ignore", "Warn", "Strict"):
        raise errors.bad_request(
            f'fieldValidation: Unsupported value: "{value}": supported values: "Ignore", "Strict", "Warn"'
        )
    return value


def parse_json_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {e}") from e


def _parse_body(call: Call) -> Any:
    kind = media_type(call.content_type) or "application/json"
    if kind == "application/json":
        return parse_json_body(call.body)
    if kind == "application/yaml":
        try:
            return yaml.safe_load(call.body)
        except yaml.YAMLError as e:
            raise errors.bad_request(f"couldn't get version/kind; yaml parse error: {e}") from e
    raise errors.unsupported_media_type(kind, ["application/json", "application/yaml"])


def handled_as(rt: ResourceType, detail: str) -> str:
    return f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {detail}'


def _patch_invalid(patched: Obj, detail: str) -> errors.ApiError:
    """A patched object that does not decode: the patch handler's 422 on the field "patch"."""
    value = json.dumps(orjson.dumps(patched).decode())
    return errors.ApiError(
        422,
        "Invalid",
        f' "" is invalid: patch: Invalid value: {value}: {detail}',
        details={
            "causes": [
                {"reason": "FieldValueInvalid", "message": f"Invalid value: {value}: {detail}", "field": "patch"}
            ]
        },
    )


def decode_object(call: Call, rt: ResourceType, raw: Any = None, *, patched: bool = False) -> Obj:
    """Decode a create/update body (or a patched object) into a normalised object of rt's kind."""
    body = _parse_body(call) if raw is None else raw
    if not isinstance(body, dict):
        raise errors.bad_request(handled_as(rt, "json: cannot unmarshal array into Go value of type struct"))
    api_version = body.get("apiVersion") or rt.api_version
    kind = body.get("kind") or rt.kind
    if api_version != rt.api_version:
        raise errors.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version ({rt.api_version})"
        )
    if kind != rt.kind:
        raise errors.bad_request(
            f"the object provided is unrecognized (must be of type {rt.kind}): kind {kind!r} in version {api_version!r}"
        )
    body = dict(body, apiVersion=rt.api_version, kind=rt.kind)
    body.setdefault("metadata", {})
    mode = field_validation(call)
    node = schema.root_node(rt.group, rt.version, rt.kind)
    if node is None:
        return body
    try:
        obj, unknown = schema.decode(node, body, drop_unknown=True)
    except schema.DecodeError as e:
        if patched:
            raise _patch_invalid(body, str(e)) from e
        raise errors.bad_request(handled_as(rt, str(e))) from e
    if unknown:
        texts = [f'unknown field "{path}"' for path in unknown]
        if mode == "Strict":
            detail = "strict decoding error: " + ", ".join(texts)
            raise _patch_invalid(body, detail) if patched else errors.bad_request(handled_as(rt, detail))
        if mode == "Warn":
            call.warnings.extend(texts)
    if not isinstance(obj.get("metadata"), dict):
        obj["metadata"] = {}
    return obj
