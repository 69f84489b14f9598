"""Fuzzing the extender and the webhook over real HTTP: mutated real-format bodies and random bytes.

One server (the extender app with the webhook mounted, as main() runs it) answers every example on
127.0.0.1. Bodies start from the fixtures (args-*.json, pending-pods.json, cluster pods as victims)
and are mutated as trees that keep duplicate keys and raw key spellings (values changed, keys
dropped, duplicated, reordered, recased or escaped, `"NodeNames":[` planted inside the pod, huge
arrays, deep nesting) and then as bytes (truncated, non-UTF-8 bytes, trailing garbage).

Properties, per example: never a 5xx; 400 exactly when the body is not JSON (the webhook allows
those too); otherwise 200 with a well-formed reply that names only nodes the body asked about (as
Go reads it: `tests.extender.test_hardening.go_fields`) and no internal error; and afterwards the
genuine fixture requests get exactly the answers they got before any fuzzing. Example counts are
bounded (the whole module runs in a few seconds).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import http.client
import itertools
import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender import protocol, webhook
from extender.app import METRICS_KEY, make_app
from tests.extender.extender_support import ALL_NODES, cluster_items, fixture_json, fixture_pod, make_inventory
from tests.extender.test_hardening import go_fields, go_fold
from tests.extender.test_webhook import PENDING, admission_review, as_created

# ------------------------------------------------------------------------------ JSON as trees


class Obj:
    """A JSON object as ordered members [raw key text, value]: duplicate keys and escapes survive."""

    __slots__ = ("members",)

    def __init__(self, members: list[list[Any]]) -> None:
        self.members = members


@dataclass(frozen=True, slots=True)
class Raw:
    """Bytes written as they are (numbers or nesting the encoder would refuse, broken strings)."""

    text: bytes


def tree(v: Any) -> Any:
    if isinstance(v, dict):
        return Obj([[orjson.dumps(k), tree(x)] for k, x in v.items()])
    if isinstance(v, list):
        return [tree(x) for x in v]
    return v


def enc(v: Any) -> bytes:
    """Compact JSON, as Go writes it."""
    if isinstance(v, Obj):
        return b"{" + b",".join(k + b":" + enc(x) for k, x in v.members) + b"}"
    if isinstance(v, list):
        return b"[" + b",".join(enc(x) for x in v) + b"]"
    if isinstance(v, Raw):
        return v.text
    return orjson.dumps(v)


def nodes_of(root: Any, limit: int = 3000) -> list[Any]:
    """Every object and array of a tree (breadth first, at most `limit`)."""
    out: list[Any] = []
    todo = [root]
    while todo and len(out) < limit:
        v = todo.pop(0)
        if isinstance(v, Obj):
            out.append(v)
            todo.extend(x for _, x in v.members)
        elif isinstance(v, list):
            out.append(v)
            todo.extend(v)
    return out


def member(root: Obj, key: str) -> Any:
    for k, v in reversed(root.members):
        if k == orjson.dumps(key):
            return v
    return None


# -------------------------------------------------------------------------------- mutations

KNOWN = ALL_NODES
NAMES = [*KNOWN, "ghost", "", "h100-r1-n1 ", "H100-R1-N1", "ü-node", "a,b", 'we"ird', "x]y"]
DEEP = (40, 300, 700, 1100)  # orjson reads at most 1024 levels: the last is undecodable


def rand_text(r: random.Random) -> str:
    alphabet = 'ab-.09"\\/:[]{},\u00fc\u017f\u212a\u0130\n\t\x00\x7f'
    return "".join(r.choice(alphabet) for _ in range(r.randrange(12)))


def rand_value(r: random.Random) -> Any:
    k = r.randrange(22)
    if k < 12:
        return [None, True, False, 0, -1, 8, (1 << 63) - 1, -(1 << 63), 1.5, 1e308, "", "8"][k]
    if k == 12:
        return r.choice(NAMES)
    if k == 13:
        return rand_text(r)
    if k == 14:
        return [r.choice(NAMES) for _ in range(r.randrange(4))]
    if k == 15:
        return Obj([])
    if k == 16:
        return Obj([[orjson.dumps(rand_text(r)), rand_value(r)]])
    if k == 17:
        return Raw(r.choice([b"18446744073709551616", b"1e400", b"-0", b"1E2", b'"\\ud800"', b'"\\u0000"']))
    if k == 18:
        d = r.choice(DEEP)
        return Raw(b"[" * d + b"]" * d)
    if k == 19:
        return '"NodeNames":["' + r.choice(KNOWN) + '"]'
    if k == 20:
        return ["nvidia.com/gpu", "8", {"requests": {"nvidia.com/gpu": "8"}}]
    return [1, "a", None, [], {}]


def _pick(r: random.Random, root: Any, kind: type) -> Any:
    """An object or array of the tree; half the time one inside the Pod (where the fields are read)."""
    pod = member(root, "Pod") if isinstance(root, Obj) and r.random() < 0.5 else None
    found = [
        n
        for n in nodes_of(pod if isinstance(pod, Obj) else root)
        if isinstance(n, kind) and (kind is list or (isinstance(n, Obj) and n.members))
    ]
    return r.choice(found) if found else None


QUANTITIES = ["0", "1", "2", "4", "8", "16", "-1", "1.5", "500m", "1e3", "64Gi", "lots", "", 3, 0.5]


def _retune(r: random.Random, root: Obj) -> None:
    """A plausible change to what the pod asks (its uid and version stay): a request, a limit,
    a selector, a label."""
    for o in nodes_of(member(root, "Pod")):
        if not isinstance(o, Obj):
            continue
        for m in o.members:
            key = orjson.loads(m[0])
            if isinstance(m[1], str) and (key.startswith(("nvidia.com/", "tandem.dev/")) or key in ("cpu", "memory")):
                if r.random() < 0.5:
                    m[1] = r.choice(QUANTITIES)
            elif key in ("nodeSelector", "labels") and isinstance(m[1], Obj) and r.random() < 0.5:
                m[1].members.append(
                    [
                        orjson.dumps(r.choice(["nvidia.com/gpu.product", "tandem.dev/job", "x"])),
                        r.choice(["NVIDIA-H100-80GB-HBM3", "job-1", "y"]),
                    ]
                )


def _recase(r: random.Random, raw_key: bytes) -> bytes:
    key = orjson.loads(raw_key)
    if not isinstance(key, str) or not key:
        return raw_key
    how = r.randrange(5)
    if how == 0:
        return orjson.dumps(key.lower())
    if how == 1:
        return orjson.dumps(key.swapcase())
    if how == 2:  # the first letter as a \\u escape
        return b'"\\u%04x' % ord(key[0]) + orjson.dumps(key[1:])[1:]
    if how == 3:  # Go folds these runes onto s / k
        return orjson.dumps(key.replace("s", "\u017f").replace("k", "\u212a"))
    return orjson.dumps(key + r.choice(["", " ", "x"]))


def mutate_tree(r: random.Random, root: Obj) -> None:
    """One structural mutation somewhere in the tree."""
    k = r.randrange(13)
    if k == 12:
        _retune(r, root)
    elif k == 0:  # change a value
        o = _pick(r, root, Obj)
        if o is not None:
            r.choice(o.members)[1] = rand_value(r)
    elif k == 1:  # drop a key or an element
        o = _pick(r, root, Obj)
        if o is not None:
            del o.members[r.randrange(len(o.members))]
    elif k == 2:  # duplicate a key, same or other value, anywhere in its object
        o = _pick(r, root, Obj)
        if o is not None:
            m = r.choice(o.members)
            o.members.insert(
                r.randrange(len(o.members) + 1), [m[0], copy.deepcopy(m[1]) if r.random() < 0.5 else rand_value(r)]
            )
    elif k == 3:  # reorder an object's keys
        o = _pick(r, root, Obj)
        if o is not None:
            r.shuffle(o.members)
    elif k == 4:  # another spelling of a key
        o = _pick(r, root, Obj)
        if o is not None:
            m = r.choice(o.members)
            m[0] = _recase(r, m[0])
    elif k == 5:  # a NodeNames key planted in some object, or its text in some string
        o = _pick(r, root, Obj)
        if o is not None:
            o.members.insert(
                r.randrange(len(o.members) + 1), [b'"NodeNames"', [r.choice(NAMES) for _ in range(r.randrange(1, 4))]]
            )
    elif k == 6:  # a huge array (of up to 256 KiB: one element written once, repeated)
        arr = _pick(r, root, list)
        if arr:
            one = Raw(enc(arr[r.randrange(len(arr))]))
            arr.extend([one] * min(r.choice((50, 500, 3000)), (256 << 10) // (len(one.text) + 1)))
    elif k == 7:  # an element of an array changed, or its order
        arr = _pick(r, root, list)
        if arr:
            if r.random() < 0.5:
                arr[r.randrange(len(arr))] = rand_value(r)
            else:
                r.shuffle(arr)
    elif k == 8:  # a pod large enough for the raw NodeNames path
        pod = member(root, "Pod")
        meta = member(pod, "metadata") if isinstance(pod, Obj) else None
        if isinstance(meta, Obj):
            meta.members.append([b'"annotations"', Obj([[b'"pad"', "p" * (protocol._LAZY_BYTES + 10)]])])
    elif k == 9:  # deep nesting in place of a value
        o = _pick(r, root, Obj)
        if o is not None:
            d = r.choice(DEEP)
            r.choice(o.members)[1] = Raw(b"[" * d + b"1" + b"]" * d)
    elif k == 10:  # the candidates themselves: known, unknown, odd
        names = [r.choice(NAMES) for _ in range(r.choice((0, 1, 3, 12, 400)))]
        odd: list[Any] = [1, None, ["x"], {"a": 1}]
        if r.random() < 0.2:
            names.append(r.choice(odd))
        root.members.append([r.choice([b'"NodeNames"', b'"nodeNames"', b'"\\u004eodeNames"']), tree(names)])
    else:  # the whole top level reordered
        r.shuffle(root.members)


def mutate_bytes(r: random.Random, body: bytes) -> bytes:
    """One byte-level mutation (or none)."""
    k = r.randrange(8)
    if k == 0 and body:
        return body[: r.randrange(len(body))]  # truncated
    if k == 1 and body:
        at = r.randrange(len(body))
        return body[:at] + r.choice([b"\xff", b"\xc3", b"\xc0\x80", b"\xed\xa0\x80", b"\x00"]) + body[at:]
    if k == 2:
        return body + r.choice([b"\n", b" \t\r\n", b"\x0c", b"\x0b", b"}", b"]", b",", b"x", b"{}"])
    if k == 3 and body:
        at = r.randrange(len(body))
        return body[:at] + bytes([r.randrange(256)]) + body[at + 1 :]
    return body


def mutated(r: random.Random, base: Any, rounds: int = 3) -> bytes:
    root = tree(copy.deepcopy(base))
    for _ in range(r.randrange(rounds + 1)):
        mutate_tree(r, root)
    return mutate_bytes(r, enc(root)) if r.random() < 0.35 else enc(root)


# ------------------------------------------------------------------------ the served app


def _uid(name: str) -> str:
    return next(
        str(o["metadata"]["uid"]) for o in cluster_items() if o["kind"] == "Pod" and o["metadata"]["name"] == name
    )


def preempt_body() -> dict[str, Any]:
    """What kube-scheduler sends a nodeCacheCapable extender: victims by UID per candidate node."""
    return {
        "Pod": fixture_pod("want-8"),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "h100-r1-n1": {"Pods": [{"UID": _uid("llm-pretrain-0")}], "NumPDBViolations": 1},
            "h100-r2-n1": {"Pods": [{"UID": _uid("finetune-0")}], "NumPDBViolations": 0},
            "gb200-r5-n1": {"Pods": [{"UID": _uid("nvl-worker-0")}], "NumPDBViolations": 0},
            "ghost": {"Pods": [{"UID": _uid("finetune-1")}], "NumPDBViolations": 0},
        },
    }


def full_victims_body() -> dict[str, Any]:
    """The same for an extender that is not nodeCacheCapable: the victim Pods in full."""
    pods = {o["metadata"]["name"]: o for o in cluster_items() if o["kind"] == "Pod"}
    return {
        "Pod": fixture_pod("want-8"),
        "NodeNameToMetaVictims": None,
        "NodeNameToVictims": {
            "h100-r1-n1": {"Pods": [pods["llm-pretrain-0"]], "NumPDBViolations": 0},
            "h100-r2-n1": {"Pods": [pods["finetune-0"]], "NumPDBViolations": 0},
        },
    }


def review_body() -> dict[str, Any]:
    return admission_review(as_created(PENDING["want-4-h100"]), "team-a")


BASES: dict[str, list[Any]] = {
    "names": [
        fixture_json(f"args-{n}-names.json") for n in ("want-8", "want-4-h100", "want-mig-3g", "want-dra-4", "no-gpu")
    ]
    + [fixture_json(f"args-{n}-allnodes.json") for n in ("want-8", "want-4-h100", "no-gpu")],
    "nodelist": [fixture_json("args-want-4-h100-nodelist.json")],
    "preempt": [preempt_body(), full_victims_body()],
    "review": [review_body(), admission_review(as_created(PENDING["want-mig-3g"]), "inference", operation="UPDATE")],
}

SENTINELS: list[tuple[str, bytes]] = [
    ("filter", orjson.dumps(fixture_json("args-want-8-allnodes.json"))),
    ("filter", orjson.dumps(fixture_json("args-want-4-h100-nodelist.json"))),
    ("prioritize", orjson.dumps(fixture_json("args-want-4-h100-names.json"))),
    ("preempt", orjson.dumps(preempt_body())),
    ("mutate", orjson.dumps(review_body())),
]
"""Genuine requests sent between fuzzed ones: their answers must never change."""


class Served:
    """The app on 127.0.0.1:0 in a thread of its own; blocking HTTP/1.1 keep-alive calls to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.inventory = make_inventory()
        self.app = make_app(self.inventory, extra_routes=webhook.add_routes)
        self.runner = web.AppRunner(self.app, access_log=None)
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.conn: http.client.HTTPConnection | None = None
        self._turn = itertools.count()
        self.expected = [self.post(path, body) for path, body in SENTINELS]
        assert all(status == 200 for status, _ in self.expected)

    async def _start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        prefix = "" if path == "mutate" else self.inventory.config.url_prefix
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conn.request("POST", f"{prefix}/{path}", body, {"Content-Type": "application/json"})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None  # the server may close a connection; one fresh try
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def internal_errors(self) -> float:
        reg = self.app[METRICS_KEY].registry
        return sum(
            reg.get_sample_value("tandem_extender_request_errors_total", {"verb": v, "kind": "internal"}) or 0.0
            for v in ("filter", "prioritize", "preempt")
        )

    def check_sentinels(self, every: bool = False) -> None:
        """The genuine requests still get their answers: the next one in turn, or all of them."""
        picks = range(len(SENTINELS)) if every else [next(self._turn) % len(SENTINELS)]
        for i in picks:
            path, body = SENTINELS[i]
            assert self.post(path, body) == self.expected[i], path

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    # Thousands of refused requests would each log a warning; errors (a handler failing) still show.
    logger = logging.getLogger("tandem.extender")
    level = logger.level
    logger.setLevel(logging.ERROR)
    s = Served()
    try:
        yield s
        s.check_sentinels(every=True)
        assert s.internal_errors() == 0
    finally:
        s.close()
        logger.setLevel(level)


# -------------------------------------------------------------------------------- properties


def _decoded(body: bytes) -> tuple[bool, Any]:
    try:
        return True, orjson.loads(body)
    except orjson.JSONDecodeError:
        return False, None


def _asked(body: bytes) -> tuple[str, list[Any]] | None:
    """("names" | "nodes", candidates) as Go reads the body; None when it is no object."""
    obj = _decoded(body)[1]
    if not isinstance(obj, dict):
        return None
    f = go_fields(body)
    if f.get("NodeNames") is not None:
        names = f["NodeNames"]
        return "names", names if isinstance(names, list) else []
    nodes = f.get("Nodes")
    items = nodes.get("items") if isinstance(nodes, dict) else None
    return "nodes", [
        (i.get("metadata") or {}).get("name") if isinstance(i, dict) and isinstance(i.get("metadata"), dict) else None
        for i in items
    ] if isinstance(items, list) else []


def check_filter(body: bytes, status: int, reply: bytes) -> None:
    ok, _ = _decoded(body)
    assert status == (200 if ok else 400)
    out = orjson.loads(reply)
    assert set(out) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert isinstance(out["Error"], str) and "internal error" not in out["Error"]
    if out["Error"]:
        assert out["NodeNames"] is None and out["Nodes"] is None
        assert out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}
        return
    asked = _asked(body)
    assert asked is not None
    mode, names = asked
    assert all(isinstance(n, str) for n in names)
    if mode == "names":
        assert out["Nodes"] is None
        passed = out["NodeNames"]
    else:
        assert out["NodeNames"] is None
        passed = [n["metadata"]["name"] for n in out["Nodes"]["items"]]
    failed, unres = set(out["FailedNodes"]), set(out["FailedAndUnresolvableNodes"])
    assert set(passed) <= set(names) and failed <= set(names) and unres <= set(names)
    assert set(passed) | failed | unres == set(names)  # every candidate answered
    assert not set(passed) & (failed | unres)
    assert all(
        isinstance(v, str) and v for v in [*out["FailedNodes"].values(), *out["FailedAndUnresolvableNodes"].values()]
    )


def check_prioritize(body: bytes, status: int, reply: bytes) -> None:
    ok, _ = _decoded(body)
    assert status == (200 if ok else 400)
    if not ok:
        return
    out = orjson.loads(reply)
    assert isinstance(out, list)
    if not out:
        return  # no opinion: a refused request (or no candidates)
    asked = _asked(body)
    assert asked is not None
    assert [h["Host"] for h in out] == asked[1]  # exactly the candidates, in their order
    assert all(set(h) == {"Host", "Score"} and type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in out)


def _victim_uids(body: bytes) -> dict[str, set[Any]]:
    """Per node offered, every UID offered for it (under any spelling of Pods / UID Go would read)."""
    f = go_fields(body, ("Pod", "NodeNameToMetaVictims", "NodeNameToVictims"))
    out: dict[str, set[Any]] = {}
    for field in ("NodeNameToMetaVictims", "NodeNameToVictims"):
        victims = f.get(field)
        for node, v in victims.items() if isinstance(victims, dict) else ():
            uids = out.setdefault(node, set())
            for key, pods in v.items() if isinstance(v, dict) else ():
                for p in pods if go_fold(key) == "PODS" and isinstance(pods, list) else ():
                    if isinstance(p, dict) and isinstance(p.get("metadata"), dict):
                        uids.add(p["metadata"].get("uid"))
                    elif isinstance(p, dict):
                        uids.update(u for k, u in p.items() if go_fold(k) == "UID")
    return out


def check_preempt(body: bytes, status: int, reply: bytes) -> None:
    ok, obj = _decoded(body)
    assert status == (200 if ok else 400)
    if not ok:
        return
    out = orjson.loads(reply)
    assert set(out) == {"NodeNameToMetaVictims"}
    kept = out["NodeNameToMetaVictims"]
    if not kept:
        return
    asked = _victim_uids(body)
    for node, v in kept.items():
        assert node in asked, node  # never a node that was not offered
        assert v["Pods"] and all(set(p) == {"UID"} for p in v["Pods"])  # at least one victim each
        assert {p["UID"] for p in v["Pods"]} <= asked[node]
        assert type(v["NumPDBViolations"]) is int


def check_review(body: bytes, status: int, reply: bytes) -> None:
    assert status == 200  # undecodable reviews are allowed too: the webhook never blocks a pod
    out = orjson.loads(reply)
    assert out["kind"] == "AdmissionReview" and out["apiVersion"] in webhook.ADMISSION_VERSIONS
    resp = out["response"]
    assert resp["allowed"] is True and isinstance(resp["uid"], str)
    obj = _decoded(body)[1]
    req = obj.get("request") if isinstance(obj, dict) and obj.get("kind") == "AdmissionReview" else None
    uid = req.get("uid") if isinstance(req, dict) else None
    assert resp["uid"] == (uid if isinstance(uid, str) else "")
    assert all(isinstance(w, str) and "internal error" not in w for w in resp.get("warnings") or [])
    if "patch" in resp:
        assert resp["patchType"] == "JSONPatch"
        patch = orjson.loads(base64.b64decode(resp["patch"]))
        assert patch == [{"op": "add", "path": "/spec/schedulerName", "value": "tandem-scheduler"}]


CHECKS: dict[str, Callable[[bytes, int, bytes], None]] = {
    "filter": check_filter,
    "prioritize": check_prioritize,
    "preempt": check_preempt,
    "mutate": check_review,
}


def run_one(served: Served, path: str, body: bytes) -> None:
    before = served.internal_errors()
    status, reply = served.post(path, body)
    assert status < 500, (status, reply[:300])
    CHECKS[path](body, status, reply)
    assert served.internal_errors() == before, "a handler failed on this body"


FUZZ = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(r=st.randoms(use_true_random=False), which=st.integers(0, 7), verb=st.sampled_from(["filter", "prioritize"]))
def test_names_mode_bodies(served: Served, r: random.Random, which: int, verb: str) -> None:
    run_one(served, verb, mutated(r, BASES["names"][which]))
    served.check_sentinels()


def _edited(r: random.Random, passed: list[str]) -> list[str]:
    """What prioritize is asked after a filter passed `passed`: that list, or one close to it."""
    asked = list(passed)
    how = r.randrange(6)
    if how in (0, 1) and len(asked) >= 3:  # another node in the middle: same length, same ends
        asked[r.randrange(1, len(asked) - 1)] = r.choice([n for n in NAMES if n not in asked] or ["ghost"])
    elif how == 2:
        r.shuffle(asked)
    elif how == 3 and asked:
        del asked[r.randrange(len(asked))]
    elif how == 4:
        asked.insert(r.randrange(len(asked) + 1), r.choice(NAMES))
    return asked


_LAYOUTS = ("names-last", "names-first", "escaped-key", "duplicate-after", "other-case-after")


@settings(FUZZ, max_examples=100)
@given(
    r=st.randoms(use_true_random=False),
    which=st.sampled_from([5, 6, 7, 7, 1, 0]),
    layout=st.sampled_from(_LAYOUTS),
    decoy=st.booleans(),
    big=st.booleans(),
)
def test_prioritize_after_filter(
    served: Served, r: random.Random, which: int, layout: str, decoy: bool, big: bool
) -> None:
    """kube-scheduler's own sequence, filter then prioritize of what passed, with the prioritize body
    written every way JSON allows and the filter's list planted where it is not the candidates."""
    base = copy.deepcopy(BASES["names"][which])
    base.pop("NodeNames")
    if big:
        base["Pod"]["metadata"]["annotations"] = {"pad": "p" * (protocol._LAZY_BYTES + 10)}
    status, reply = served.post("filter", orjson.dumps({**base, "NodeNames": BASES["names"][which]["NodeNames"]}))
    assert status == 200
    passed = orjson.loads(reply)["NodeNames"]
    asked = _edited(r, passed)
    root = tree(base)
    if decoy:
        o = _pick(r, member(root, "Pod"), Obj)
        o.members.insert(r.randrange(len(o.members) + 1), [b'"NodeNames"', tree(passed)])
    key = {"escaped-key": b'"\\u004eodeNames"', "other-case-after": b'"nodeNames"'}.get(layout, b'"NodeNames"')
    if layout in ("duplicate-after", "other-case-after"):
        root.members.append([b'"NodeNames"', tree(passed)])
    entry = [key, tree(asked)]
    if layout == "names-first":
        root.members.insert(0, entry)
    else:
        root.members.append(entry)
    run_one(served, "prioritize", enc(root))
    served.check_sentinels()


@settings(FUZZ, max_examples=50)
@given(r=st.randoms(use_true_random=False), verb=st.sampled_from(["filter", "prioritize"]))
def test_nodelist_mode_bodies(served: Served, r: random.Random, verb: str) -> None:
    run_one(served, verb, mutated(r, BASES["nodelist"][0], rounds=2))
    served.check_sentinels()


@settings(FUZZ, max_examples=80)
@given(r=st.randoms(use_true_random=False), which=st.integers(0, 1))
def test_preempt_bodies(served: Served, r: random.Random, which: int) -> None:
    run_one(served, "preempt", mutated(r, BASES["preempt"][which]))
    served.check_sentinels()


@settings(FUZZ, max_examples=100)
@given(r=st.randoms(use_true_random=False), which=st.integers(0, 1))
def test_webhook_reviews(served: Served, r: random.Random, which: int) -> None:
    run_one(served, "mutate", mutated(r, BASES["review"][which]))
    served.check_sentinels()


@settings(FUZZ, max_examples=60)
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.text(max_size=200).map(str.encode),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.text(max_size=8),
            lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
            max_leaves=20,
        ).map(orjson.dumps),
    ),
    path=st.sampled_from(["filter", "prioritize", "preempt", "mutate"]),
)
def test_random_bodies(served: Served, body: bytes, path: str) -> None:
    run_one(served, path, body)
    served.check_sentinels()


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_memory_stays_bounded_and_the_server_keeps_answering(served: Served) -> None:
    r = random.Random(20251201)
    paths = {"filter": "names", "prioritize": "names", "preempt": "preempt", "mutate": "review"}

    def burst(n: int) -> None:
        for _ in range(n):
            path = r.choice([*paths, "filter"])
            kind = "nodelist" if path == "filter" and r.random() < 0.2 else paths[path]
            status, _ = served.post(path, mutated(r, r.choice(BASES[kind])))
            assert status < 500

    burst(60)  # caches and allocator arenas fill up first
    before = _rss_kib()
    burst(240)
    grown_mib = (_rss_kib() - before) / 1024
    assert grown_mib < 96, f"RSS grew {grown_mib:.0f} MiB over 240 requests"
    served.check_sentinels(every=True)
    assert served.internal_errors() == 0
