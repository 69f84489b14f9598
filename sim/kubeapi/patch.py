"""The three patch types the server accepts: JSON Patch (RFC 6902), JSON merge patch (RFC 7386), and
strategic merge patch driven by the schema's patch strategy and merge key.

A patch that cannot be applied raises `PatchError` (422 at the edge, the real server's generic
"the server rejected our request due to an error in our request"). A strategic-merge directive
this module does not implement raises `UnsupportedPatch` (415): never a silent merge-patch.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.kubeapi.schema import Node

__all__ = ["PatchError", "UnsupportedPatch", "json_patch", "merge_patch", "strategic_merge_patch"]


class PatchError(Exception):
    """The patch is well-formed but does not apply (failed test, missing path, ...)."""


class UnsupportedPatch(Exception):
    """A strategic-merge construct the fake does not implement."""


# -- RFC 6902 ---------------------------------------------------------------------------


def _pointer(path: object) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if token == "-" and for_add:
        return len(container)
    if not (token.isascii() and token.isdigit()) or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    i = int(token)
    if i > len(container) or (i == len(container) and not for_add):
        raise PatchError(f"array index {i} out of bounds")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for token in tokens[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise PatchError(f"missing path segment {token!r}")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, for_add=False)]
        else:
            raise PatchError(f"cannot traverse into a scalar at {token!r}")
    return cur


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"missing key {last!r}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise PatchError("cannot read a scalar")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise PatchError("cannot add to a scalar")
    return doc


def _remove(doc: Any, tokens: list[str]) -> tuple[Any, Any]:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"missing key {last!r}")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, for_add=False))
    raise PatchError("cannot remove from a scalar")


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def json_patch(doc: dict[str, Any], ops: Any) -> dict[str, Any]:
    """Apply an RFC 6902 operation list to a copy of doc."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    out: Any = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError("operation without 'op'")
        kind = op["op"]
        tokens = _pointer(op.get("path"))
        if kind == "add":
            if "value" not in op:
                raise PatchError("add without value")
            out = _add(out, tokens, copy.deepcopy(op["value"]))
        elif kind == "remove":
            out, _ = _remove(out, tokens)
        elif kind == "replace":
            if "value" not in op:
                raise PatchError("replace without value")
            _get(out, tokens)
            if tokens:
                out, _ = _remove(out, tokens)
            out = _add(out, tokens, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            if kind == "move" and tokens[: len(source)] == source and tokens != source:
                raise PatchError("cannot move a value into itself")
            if kind == "move":
                out, value = _remove(out, source)
            else:
                value = copy.deepcopy(_get(out, source))
            out = _add(out, tokens, value)
        elif kind == "test":
            if not _equal(_get(out, tokens), op.get("value")):
                raise PatchError(f"testing value {op.get('path')} failed: test failed")
        else:
            raise PatchError(f"unexpected kind of operation {kind!r}")
        if not isinstance(out, dict):
            raise PatchError("the patched document is not an object")
    assert isinstance(out, dict)
    return out


# -- RFC 7386 ---------------------------------------------------------------------------


def merge_patch(doc: Any, patch: Any) -> Any:
    """JSON merge patch: objects merged recursively, null deletes, everything else (lists too) replaced."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# -- strategic merge ---------------------------------------------------------------------

_DIRECTIVE = "$patch"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_ORDER = "$setElementOrder/"
_RETAIN = "$retainKeys"


def strategic_merge_patch(doc: dict[str, Any], patch: Any, node: Node | None) -> dict[str, Any]:
    """Strategic merge of patch into a copy of doc, following the schema's list strategies."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    out = _merge_map(copy.deepcopy(doc), patch, node)
    assert isinstance(out, dict)
    return out


def _child(node: Node | None, field: str) -> Node | None:
    if node is None:
        return None
    if node.kind == "map":
        return node.values
    prop = node.prop(field)
    return prop.node if prop is not None else None


def _merge_map(original: Any, patch: dict[str, Any], node: Node | None) -> Any:
    directive = patch.get(_DIRECTIVE)
    if directive == "replace":
        return {k: v for k, v in patch.items() if k != _DIRECTIVE}
    if directive == "delete":
        return None
    if directive is not None:
        raise UnsupportedPatch(f"unknown patch directive {directive!r}")
    out: dict[str, Any] = dict(original) if isinstance(original, dict) else {}
    retain = patch.get(_RETAIN)
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key == _RETAIN:
            continue
        if key.startswith(_ORDER):
            orders[key[len(_ORDER) :]] = value if isinstance(value, list) else []
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            field = key[len(_DELETE_PRIMITIVE) :]
            drop = value if isinstance(value, list) else []
            if isinstance(out.get(field), list):
                out[field] = [v for v in out[field] if v not in drop]
            continue
        if key.startswith("$"):
            raise UnsupportedPatch(f"unsupported strategic merge directive {key!r}")
        if value is None:
            out.pop(key, None)
            continue
        child = _child(node, key)
        if isinstance(value, dict):
            if child is not None and child.kind == "array":
                raise PatchError(f"field {key!r} is a list, the patch gives an object")
            merged = _merge_map(out.get(key), value, child)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        elif isinstance(value, list):
            out[key] = _merge_list(out.get(key), value, child)
        else:
            out[key] = value
    for field, order in orders.items():
        if isinstance(out.get(field), list):
            out[field] = _apply_order(out[field], order, _child(node, field))
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(original: Any, patch: list[Any], node: Node | None) -> list[Any]:
    strategy = node.strategy if node is not None else ""
    if "merge" not in strategy.split(","):
        # No merge strategy: the list is atomic, the patch's list replaces it (real SMP semantics).
        if any(isinstance(v, dict) and _DIRECTIVE in v for v in patch):
            replaced = [v for v in patch if not (isinstance(v, dict) and v.get(_DIRECTIVE) == "replace")]
            return replaced
        return copy.deepcopy(patch)
    current = list(original) if isinstance(original, list) else []
    assert node is not None
    key = node.merge_key
    if any(isinstance(v, dict) and v.get(_DIRECTIVE) == "replace" for v in patch):
        return [v for v in patch if not (isinstance(v, dict) and v.get(_DIRECTIVE) == "replace")]
    if key is None:
        # A merged list of primitives (finalizers): union, original order first.
        for v in patch:
            if isinstance(v, (dict, list)):
                raise UnsupportedPatch("merging a list of objects without a merge key")
            if v not in current:
                current.append(v)
        return current
    items = node.items
    for entry in patch:
        if not isinstance(entry, dict) or key not in entry:
            raise PatchError(f"map: {entry!r} does not contain declared merge key: {key}")
        pos = next((i for i, v in enumerate(current) if isinstance(v, dict) and v.get(key) == entry[key]), None)
        if entry.get(_DIRECTIVE) == "delete":
            if pos is not None:
                current.pop(pos)
            continue
        if pos is None:
            merged = _merge_map({}, entry, items)
            if merged is not None:
                current.append(merged)
        else:
            merged = _merge_map(current[pos], entry, items)
            if merged is None:
                current.pop(pos)
            else:
                current[pos] = merged
    return current


def _apply_order(items: list[Any], order: list[Any], node: Node | None) -> list[Any]:
    """$setElementOrder: items named in the order list first, in that order; the rest after."""
    key = node.merge_key if node is not None else None

    def ident(v: Any) -> Any:
        found = v.get(key) if key is not None and isinstance(v, dict) else v
        return found if isinstance(found, (str, int, float, bool)) else None

    rank: dict[Any, int] = {}
    for i, o in enumerate(order):
        w = ident(o)
        if w is not None:
            rank.setdefault(w, i)
    listed = sorted((v for v in items if ident(v) in rank), key=lambda v: rank[ident(v)])
    rest = [v for v in items if ident(v) not in rank]
    return listed + rest
