"""The kube-scheduler extender v1 wire format (Go PascalCase fields), decoded and encoded in one place.

kube-scheduler marshals `k8s.io/kube-scheduler/extender/v1` structs, which carry no json tags, so
the top-level fields are PascalCase (`Pod`, `NodeNames`, ...) while the embedded Pod and NodeList
are ordinary camelCase Kubernetes JSON. Go's decoder matches field names case-insensitively, so we
accept any casing on the way in and always write PascalCase on the way out.

Duplicate keys, which JSON allows, are read as Go's decoder reads them: of the top-level keys that
match one field (any casing, Go's folding), the last in the document wins (for the Pod, an object,
Go would merge the two; the last one is taken whole here). The raw-bytes shortcuts
(extender/names.py) only ever read the body's last member, so they and a full parse agree.

Hot path: requests are parsed with orjson and checked by hand (a pydantic model over 5,000 node
names would cost more than the whole decision); the preemption arguments, which are small and rare,
go through pydantic.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from extender.errors import BadRequest, UndecodableBody
from extender.names import RawNames, find_raw_names

__all__ = [
    "ExtenderArgs",
    "PreemptionArgs",
    "MetaVictims",
    "parse_extender_args",
    "parse_preemption_args",
    "encode_filter_result",
    "encode_filter_error",
    "encode_priorities",
    "encode_preemption_result",
    "encode_preemption_error",
    "SCORE_MAX",
]

SCORE_MAX = 10
"""extenderv1.MaxExtenderPriority: scores are 0..10; kube-scheduler scales them by the weight."""


class ExtenderArgs:
    """A decoded ExtenderArgs body.

    pod: the Pod object; nodes: the NodeList items when kube-scheduler sent full Nodes
    (nodeCacheCapable: false), else None; raw: the body as received; count: how many candidates.
    node_names: candidate names in request order (both modes). When the body carries them as Go
    writes them (raw_names is set), they are decoded only if something asks: the hot path reads
    them straight from the body's bytes.
    """

    __slots__ = ("pod", "nodes", "raw", "raw_names", "count", "_names")

    def __init__(
        self,
        pod: dict[str, Any],
        node_names: list[str] | None,
        nodes: list[dict[str, Any]] | None,
        raw: bytes = b"",
        raw_names: RawNames | None = None,
    ) -> None:
        if node_names is None and raw_names is None:
            raise ValueError("ExtenderArgs needs node_names or raw_names")
        self.pod = pod
        self.nodes = nodes
        self.raw = raw
        self.raw_names = raw_names
        self._names = node_names
        self.count = len(node_names) if node_names is not None else len(raw_names.quotes) // 2  # type: ignore[union-attr]

    @property
    def node_names(self) -> list[str]:
        if self._names is None:
            assert self.raw_names is not None
            rn = self.raw_names
            names = _decode(b"[" + self.raw[rn.start : rn.end] + b"]")
            if not isinstance(names, list):  # cannot happen for a checked slice; keeps mypy honest
                raise BadRequest("NodeNames must be a list of strings")
            self._names = names
        return self._names


_LAZY_BYTES = 16 << 10
"""Bodies above this size get their NodeNames left undecoded (a few hundred names and up)."""

_GC_PAUSE_BYTES = 1 << 20


def _decode(body: bytes) -> Any:
    # A NodeList body holds hundreds of thousands of fresh containers; JSON has no cycles, so
    # collecting while they are created only costs time (about half of a 13 MB parse).
    pause = len(body) > _GC_PAUSE_BYTES and gc.isenabled()
    if pause:
        gc.disable()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise UndecodableBody(f"body is not JSON: {e}") from e
    finally:
        if pause:
            gc.enable()


_GO_FOLD = str.maketrans({"\u017f": "s", "\u212a": "k", "\u0131": "i", "\u0130": "i"})
"""The non-ASCII runes Go's key folding (ToUpper(ToLower(r))) turns into ASCII letters."""

_FIELD_NAMES = (
    "Pod",
    "Nodes",
    "NodeNames",
    "NodeNameToMetaVictims",
    "NodeNameToVictims",
    "Pods",
    "NumPDBViolations",
    "UID",
)
_FIELD_OF: dict[str, str] = {n: n for n in _FIELD_NAMES}
_FOLDED: dict[str, str] = {n.lower(): n for n in _FIELD_NAMES}


def go_fold(key: str) -> str:
    """`key` as Go's encoding/json compares it with a field name, for our ASCII field names ("" for
    a key that can match none of them)."""
    k = key.translate(_GO_FOLD)
    return k.lower() if k.isascii() else ""


_TOKEN = re.compile(rb'(?P<s>"[^"\\]*(?:\\.[^"\\]*)*")(?P<colon>[ \t\r\n]*:)?|[\[\]{}]', re.DOTALL)


def _key_order(doc: bytes) -> dict[str, int]:
    """Position of the last occurrence of each top-level key of a valid JSON object. Rare: only
    when keys differing in case both name one field; one regex pass over the document, about three
    times what decoding it costs."""
    order: dict[str, int] = {}
    depth = 0
    for i, m in enumerate(_TOKEN.finditer(doc)):
        c = doc[m.start()]
        if c == 0x22:
            if depth == 1 and m.group("colon") is not None:
                order[orjson.loads(m.group("s"))] = i
        elif c in (0x7B, 0x5B):
            depth += 1
        else:
            depth -= 1
    return order


def _fields(obj: Mapping[str, Any], doc: bytes, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields `names` of a decoded object as Go's decoder fills a struct: a key names a field
    in any casing and, of several keys naming one field, the last in the document wins (orjson
    already keeps the last value of keys that are exactly equal). `doc` is what obj was decoded from."""
    hits: dict[str, list[str]] = {}
    for k in obj:
        f = _FIELD_OF.get(k) or _FOLDED.get(go_fold(k))
        if f is not None and f in names:
            hits.setdefault(f, []).append(k)
    out: dict[str, Any] = {}
    order: dict[str, int] | None = None
    for f, keys in hits.items():
        if len(keys) > 1:
            if order is None:
                order = _key_order(doc)
            rank = order
            keys.sort(key=lambda k: rank.get(k, -1))
        out[f] = obj[keys[-1]]
    return out


def _check_pod(pod: Any) -> dict[str, Any]:
    """The Pod, checked in the fields the extender reads (Go's decoder would refuse other types)."""
    if pod is None:
        raise BadRequest("Pod is missing")
    if not isinstance(pod, dict):
        raise BadRequest(f"Pod must be an object, got {type(pod).__name__}")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise BadRequest("Pod.metadata.name is missing")
    for key in ("namespace", "uid", "resourceVersion"):
        if not isinstance(meta.get(key), (str, type(None))):
            raise BadRequest(f"Pod.metadata.{key} must be a string")
    labels = meta.get("labels")
    if labels is not None and (not isinstance(labels, dict) or not all(type(v) is str for v in labels.values())):
        raise BadRequest("Pod.metadata.labels must map strings to strings")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise BadRequest("Pod.spec is missing")
    if not isinstance(pod.get("status"), (dict, type(None))):
        raise BadRequest("Pod.status must be an object")
    return pod


_ARGS_FIELDS = ("Pod", "Nodes", "NodeNames")


def parse_extender_args(body: bytes) -> ExtenderArgs:
    """Decode a filter/prioritize body. UndecodableBody -> HTTP 400; BadRequest -> `Error` field."""
    if len(body) > _LAZY_BYTES:
        rn = find_raw_names(body)
        if rn is not None:  # decode the rest only: the pod, and `"NodeNames":null` in the array's place
            rest = body[: rn.start - 1] + b"null}"
            try:
                obj = orjson.loads(rest)
            except orjson.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):  # the array is the last member: NodeNames, whatever came before
                return ExtenderArgs(_check_pod(_fields(obj, rest, ("Pod",)).get("Pod")), None, None, body, rn)
    obj = _decode(body)
    if not isinstance(obj, dict):
        raise BadRequest(f"ExtenderArgs must be an object, got {type(obj).__name__}")
    fields = _fields(obj, body, _ARGS_FIELDS)
    pod = _check_pod(fields.get("Pod"))
    names = fields.get("NodeNames")
    node_list = fields.get("Nodes")
    if names is not None:
        if not isinstance(names, list):  # element types are checked where a name is not found
            raise BadRequest("NodeNames must be a list of strings")
        return ExtenderArgs(pod, names, None, body)
    if node_list is None:
        raise BadRequest("neither NodeNames nor Nodes is set")
    if not isinstance(node_list, dict):
        raise BadRequest(f"Nodes must be a NodeList object, got {type(node_list).__name__}")
    items = node_list.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadRequest("Nodes.items must be a list")
    out_names: list[str] = []
    for i, n in enumerate(items):
        meta = n.get("metadata") if isinstance(n, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str):
            raise BadRequest(f"Nodes.items[{i}].metadata.name is missing")
        out_names.append(name)
    return ExtenderArgs(pod, out_names, items, body)


class MetaPod(BaseModel):
    """extenderv1.MetaPod: a victim named by UID only."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    uid: str = Field(alias="UID")


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1  # NumPDBViolations is an int64 in Go


class MetaVictims(BaseModel):
    """extenderv1.MetaVictims."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    pods: list[MetaPod] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(0, alias="NumPDBViolations", ge=_INT64_MIN, le=_INT64_MAX)


class Victims(BaseModel):
    """extenderv1.Victims: full victim Pods (sent when the extender is not nodeCacheCapable)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    pods: list[dict[str, Any]] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(0, alias="NumPDBViolations", ge=_INT64_MIN, le=_INT64_MAX)


@dataclass(frozen=True, slots=True)
class VictimSet:
    """Victims of one node, normalised: UIDs plus the full pods when kube-scheduler sent them."""

    uids: tuple[str, ...]
    pods: tuple[dict[str, Any], ...]
    num_pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """A decoded ExtenderPreemptionArgs body."""

    pod: dict[str, Any]
    victims: dict[str, VictimSet]


def _victims_map(raw: Any, model: type[BaseModel], field: str) -> dict[str, BaseModel]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"{field} must be an object")
    out: dict[str, BaseModel] = {}
    for node, v in raw.items():
        if v is None:
            v = {}
        try:
            out[node] = model.model_validate(_casefold_keys(v))
        except ValidationError as e:
            raise BadRequest(f"{field}[{node}] is invalid: {e.errors()[0]['msg']}") from e
    return out


def _casefold_keys(v: Any) -> Any:
    """Map any casing of the victims' field names onto the Go names (Go decodes case-insensitively)."""
    if not isinstance(v, dict):
        return v
    canon = {"pods": "Pods", "numpdbviolations": "NumPDBViolations", "uid": "UID"}
    out: dict[str, Any] = {}
    for k, val in v.items():
        key = canon.get(go_fold(str(k))) or str(k)
        if key == "Pods" and isinstance(val, list):
            val = [_casefold_keys(p) if isinstance(p, dict) and "metadata" not in p else p for p in val]
        out[key] = val
    return out


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    """Decode a preempt body (NodeNameToMetaVictims and/or NodeNameToVictims)."""
    obj = _decode(body)
    if not isinstance(obj, dict):
        raise BadRequest(f"ExtenderPreemptionArgs must be an object, got {type(obj).__name__}")
    fields = _fields(obj, body, ("Pod", "NodeNameToMetaVictims", "NodeNameToVictims"))
    pod = _check_pod(fields.get("Pod"))
    meta = _victims_map(fields.get("NodeNameToMetaVictims"), MetaVictims, "NodeNameToMetaVictims")
    full = _victims_map(fields.get("NodeNameToVictims"), Victims, "NodeNameToVictims")
    victims: dict[str, VictimSet] = {}
    for node, mv in meta.items():
        assert isinstance(mv, MetaVictims)
        victims[node] = VictimSet(tuple(p.uid for p in mv.pods), (), mv.num_pdb_violations)
    for node, fv in full.items():
        assert isinstance(fv, Victims)
        if node in victims:
            continue
        uids = []
        for p in fv.pods:
            pm = p.get("metadata")
            uid = pm.get("uid") if isinstance(pm, dict) else None
            if not isinstance(uid, str):
                raise BadRequest(f"NodeNameToVictims[{node}] has a pod without metadata.uid")
            uids.append(uid)
        victims[node] = VictimSet(tuple(uids), tuple(fv.pods), fv.num_pdb_violations)
    return PreemptionArgs(pod, victims)


# ----------------------------------------------------------------------------- encoding


def encode_filter_result(
    *,
    passed_names: bytes | None,
    passed_nodes: Sequence[dict[str, Any]] | None,
    failed: bytes,
    unresolvable: bytes,
) -> bytes:
    """ExtenderFilterResult from pre-serialised parts: passed_names is the inside of the NodeNames
    array (quoted names joined by commas; names mode), passed_nodes the Node objects to echo as a
    NodeList (NodeList mode); failed / unresolvable are the insides of the two maps."""
    if passed_nodes is not None:
        try:
            echo = orjson.dumps({"metadata": {}, "items": passed_nodes})
        except orjson.JSONEncodeError as e:  # decodable, yet nested deeper than the encoder writes
            raise BadRequest(f"a passing node cannot be written back: {e}") from e
        head = [b'{"Nodes":', echo, b',"NodeNames":null']
    else:
        head = [b'{"Nodes":null,"NodeNames":[', passed_names or b"", b"]"]
    # One join: the parts can be hundreds of kilobytes, copied once rather than once per `+`.
    return b"".join(
        [*head, b',"FailedNodes":{', failed, b'},"FailedAndUnresolvableNodes":{', unresolvable, b'},"Error":""}']
    )


def encode_filter_error(message: str) -> bytes:
    """ExtenderFilterResult carrying only a whole-request Error (kube-scheduler fails the cycle)."""
    return orjson.dumps(
        {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}
    )


_SCORE_SUFFIX = [f"{s}}}".encode() for s in range(SCORE_MAX + 1)]


def encode_priorities(host_prefixes: Sequence[bytes], scores: Sequence[int]) -> bytes:
    """HostPriorityList: a bare JSON list of {"Host","Score"}. host_prefixes[i] is the
    pre-serialised `{"Host":"<name>","Score":` of node i; scores are clamped to 0..10."""
    suf = _SCORE_SUFFIX
    return b"[" + b",".join([p + suf[s] for p, s in zip(host_prefixes, scores)]) + b"]"


def host_prefix(name: str) -> bytes:
    """The pre-serialised head of one HostPriority entry."""
    return b'{"Host":' + orjson.dumps(name) + b',"Score":'


def encode_preemption_result(kept: Mapping[str, VictimSet]) -> bytes:
    """ExtenderPreemptionResult: NodeNameToMetaVictims only (what kube-scheduler reads back)."""
    return orjson.dumps(
        {
            "NodeNameToMetaVictims": {
                node: {"Pods": [{"UID": u} for u in v.uids], "NumPDBViolations": v.num_pdb_violations}
                for node, v in kept.items()
            }
        }
    )


def encode_preemption_error(message: str) -> bytes:
    """A preempt reply that keeps no node. The v1 result type has no Error field, so the message
    only goes to the log; an empty map tells kube-scheduler that preemption finds no candidate."""
    del message
    return b'{"NodeNameToMetaVictims":{}}'
