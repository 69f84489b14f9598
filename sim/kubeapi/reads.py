"""GET and LIST: selectors, resourceVersion semantics and limit/continue pagination.

A list answers the store's current revision as the collection resourceVersion. A paginated
list is served from the snapshot at the revision of its first page (the continue token carries
it), so pages are consistent; once that revision is compacted the token is 410 Expired, as on
a real server. List items carry no apiVersion/kind (the real server drops TypeMeta of items).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from sim.kubeapi import errors
from sim.kubeapi.objects import Call, Obj
from sim.kubeapi.resources import ResourceType
from sim.kubeapi.selectors import parse_field_selector, parse_label_selector
from sim.kubeapi.state import ApiState

__all__ = ["Reader", "parse_rv"]

_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


def parse_rv(text: str, field: str = "resourceVersion") -> int:
    try:
        value = int(text)
        if value < 0:
            raise ValueError(text)
        return value
    except ValueError as e:
        raise errors.ApiError(
            400,
            "BadRequest",
            f'invalid resource version "{text}": strconv.ParseUint: parsing "{text}": invalid syntax',
        ) from e


def _encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.b64decode(token.encode(), validate=True))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError) as e:
        raise errors.bad_request(f"continue key is not valid: {e}") from e


def _list_options_invalid(field: str, message: str) -> errors.ApiError:
    return errors.ApiError(
        422,
        "Invalid",
        f'ListOptions.meta.k8s.io "" is invalid: {field}: Forbidden: {message}',
        details={
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [{"reason": "FieldValueForbidden", "message": f"Forbidden: {message}", "field": field}],
        },
    )


def _item(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}


class Reader:
    def __init__(self, state: ApiState) -> None:
        self.state = state

    def get(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        obj = self.state.store.get(rt.key, call.namespace, call.name)
        if obj is None:
            raise errors.not_found(rt.group, rt.plural, call.name)
        return 200, obj

    def list(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        store = self.state.store
        q = call.query
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), rt)
        namespace = call.namespace if rt.namespaced and call.namespace else None
        token = q.get("continue") or ""
        rv_text = q.get("resourceVersion", "")
        match = q.get("resourceVersionMatch", "")
        if token and rv_text:
            raise _list_options_invalid(
                "resourceVersion", "specifying resource version is not allowed when using continue"
            )
        if match and not rv_text:
            raise _list_options_invalid(
                "resourceVersionMatch", "resourceVersionMatch is forbidden unless resourceVersion is provided"
            )
        if match and match not in ("Exact", "NotOlderThan"):
            raise errors.bad_request(
                f'resourceVersionMatch: Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"'
            )
        if match == "Exact" and rv_text == "0":
            raise _list_options_invalid(
                "resourceVersionMatch", 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
            )
        start = ""
        if token:
            list_rv, start = _decode_continue(token)
            try:
                objects = store.snapshot(rt.key, list_rv, namespace)
            except errors.ApiError:
                raise errors.expired(_CONTINUE_EXPIRED, continue_token=_encode_continue(store.rv, start)) from None
        elif match == "Exact":
            list_rv = parse_rv(rv_text)
            if list_rv > store.rv:
                raise self.too_large(list_rv)
            try:
                objects = store.snapshot(rt.key, list_rv, namespace)
            except errors.ApiError:
                raise errors.expired("The resourceVersion for the provided list is too old.") from None
        else:
            if rv_text and rv_text != "0" and parse_rv(rv_text) > store.rv:
                raise self.too_large(parse_rv(rv_text))
            list_rv = store.rv
            objects = store.items(rt.key, namespace)
        if start:
            after = tuple(start.split("/", 1)) if "/" in start else ("", start)
            objects = [o for o in objects if _sort_key(o) > after]
        selected = [o for o in objects if labels.matches(o["metadata"].get("labels")) and fields.matches(o)]
        limit = self._limit(q.get("limit"))
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if limit is not None and len(selected) > limit:
            page = selected[:limit]
            meta["continue"] = _encode_continue(list_rv, "/".join(_sort_key(page[-1])))
            if labels.empty and fields.empty:
                meta["remainingItemCount"] = len(selected) - limit
            selected = page
        return 200, {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": meta,
            "items": [_item(o) for o in selected],
        }

    def _limit(self, text: str | None) -> int | None:
        if not text:
            return None
        try:
            limit = int(text)
        except ValueError as e:
            raise errors.bad_request(f"limit: invalid value {text!r}") from e
        if limit <= 0:
            return None
        cap = self.state.page_size_cap
        return min(limit, cap) if cap else limit

    def too_large(self, rv: int) -> errors.ApiError:
        return errors.ApiError(
            504,
            "Timeout",
            f"Timeout: Too large resource version: {rv}, current: {self.state.store.rv}",
            details={
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            },
        )


def _sort_key(obj: Obj) -> tuple[str, str]:
    """The store's order: namespace, then name (the continue token names the last one served)."""
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])
