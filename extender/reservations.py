"""Gang reservations as the agent records them in the cluster: one ConfigMap format, written and parsed here.

A reservation holds resources on named nodes for a gang that the broker dispatched here but that has not
fully started. The agent writes it before creating the workload and deletes it when the attempt ends;
the extender loads every one before it reports ready and keeps other pods off what it holds. The held
part is the core's `placement.overlay.Reservation` (per pod set and node: replicas of one shape), the
same type the broker's overlay and the agent's validation use.

Format (ConfigMap in the configured namespace, labelled ``tandem.dev/reservation: "true"``)::

    data:
      job: train-42                      # value of the pods' tandem.dev/job label
      attempt: "3"                       # value of the pods' tandem.dev/attempt label
      pod_sets: '[{"name": "workers", "nodes": {"node-0007": 2, "node-0008": 2},
                   "shape": {"gpus": 2, "cpu": "8", "memory": "64Gi"}}]'
      expires_at: "2026-12-01T10:15:00Z" # optional: ignored after this (RFC 3339, UTC)
      domain: 'network.example.com/rack=r7'   # optional: the domain, for messages
      dispatch: 4f1c2d/train-42/3        # optional: the dispatch it belongs to

The older single-shape form (``nodes`` + ``shape``, with ``mig`` as ``{profile: count}``) is still read.
Each bound replica of (job, attempt, pod set) on a node consumes one of that node's reserved replicas, so
the part still held is ``reserved - bound`` (never below 0); nothing is counted twice.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from extender.errors import InventoryError
from placement.model import WHOLE_GPU_MILLI, DraRequest, PodShape, Toleration
from placement.overlay import Reservation, ReservedPart
from placement.quantity import QuantityError, cpu_milli, to_int_bytes

__all__ = [
    "HeldReservation",
    "parse_reservation",
    "reservation_configmap",
    "is_hold",
    "shape_document",
    "domain_label",
    "RESERVATION_LABEL_VALUE",
]

RESERVATION_LABEL_VALUE = "true"

_TOLERATE_ALL = (Toleration(operator="Exists"),)
"""A hold sits on a node the gang was placed on: taints and selectors were judged then."""


class _DraDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    device_class: str
    selectors: list[str] = Field(default_factory=list)
    count: int = Field(1, ge=1)


class _ShapeDoc(BaseModel):
    """One replica's resources (the JSON in a pod set's `shape`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    gpus: int = Field(0, ge=0)
    gpu_milli: int = Field(WHOLE_GPU_MILLI, ge=1, le=WHOLE_GPU_MILLI)
    cpu: str | int = 0
    memory: str | int = 0
    mig: dict[str, int] = Field(default_factory=dict)
    """MIG instances per replica by profile ("3g.40gb": 1); one profile per pod set (several only in the
    older single-shape form)."""
    extended: dict[str, int] = Field(default_factory=dict)
    dra: list[_DraDoc] = Field(default_factory=list)


class _PodSetDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = ""
    nodes: dict[str, int]
    shape: _ShapeDoc = Field(default_factory=_ShapeDoc)


def shape_document(shape: PodShape) -> dict[str, Any]:
    """The resources of one replica as the ConfigMap holds them (what a hold takes off a node)."""
    doc: dict[str, Any] = {"gpus": shape.gpus, "cpu": f"{shape.cpu_milli}m", "memory": str(shape.memory)}
    if shape.gpus and shape.gpu_milli != WHOLE_GPU_MILLI:
        doc["gpu_milli"] = shape.gpu_milli
    if shape.mig_profile and shape.mig_count:
        doc["mig"] = {shape.mig_profile: shape.mig_count}
    if shape.extended:
        doc["extended"] = dict(shape.extended)
    if shape.dra:
        doc["dra"] = [
            {"device_class": r.device_class, "selectors": list(r.selectors), "count": r.count} for r in shape.dra
        ]
    return doc


def _shapes(doc: _ShapeDoc) -> list[PodShape]:
    """Core shapes of one replica: whole/shared GPUs with CPU, memory, extended and DRA, then one per MIG
    profile (the older form may hold several profiles per replica; CPU and memory go with the first)."""
    cpu, memory = cpu_milli(doc.cpu), to_int_bytes(doc.memory)
    extended = tuple(sorted(doc.extended.items()))
    dra = tuple(DraRequest(d.device_class, tuple(d.selectors), d.count) for d in doc.dra)
    migs = sorted((p, n) for p, n in doc.mig.items() if n > 0)
    out: list[PodShape] = []
    if doc.gpus or not migs:
        out.append(
            PodShape(
                gpus=doc.gpus,
                gpu_milli=doc.gpu_milli,
                cpu_milli=cpu,
                memory=memory,
                extended=extended,
                dra=dra,
                tolerations=_TOLERATE_ALL,
            )
        )
    for profile, count in migs:
        first = not out
        out.append(
            PodShape(
                mig_profile=profile,
                mig_count=count,
                tolerations=_TOLERATE_ALL,
                cpu_milli=cpu if first else 0,
                memory=memory if first else 0,
                extended=extended if first else (),
                dra=dra if first else (),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class HeldReservation:
    """A parsed reservation ConfigMap: the core reservation plus what only the cluster side needs."""

    key: tuple[str, str]
    """(namespace, name) of the ConfigMap."""
    reservation: Reservation
    domain: str = ""
    expires_at: float | None = None
    """Wall-clock seconds after which it is ignored; None = never."""
    dispatch_id: str = ""

    @property
    def job(self) -> str:
        return self.reservation.job_id

    @property
    def attempt(self) -> str:
        """As the pods' `tandem.dev/attempt` label spells it."""
        return str(self.reservation.attempt)

    @property
    def gang(self) -> tuple[str, str]:
        return (self.job, self.attempt)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(p.node for p in self.reservation.parts)

    @property
    def gpus(self) -> int:
        """Whole-GPU devices one replica of any part takes (0 when the gang takes none)."""
        return max((p.shape.gpus for p in self.reservation.parts), default=0)

    @property
    def domain_label(self) -> str:
        """ "network.example.com/rack=r7" -> "rack r7" (for messages); other text as written."""
        return domain_label(self.domain)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def domain_label(domain: str) -> str:
    key, sep, value = domain.partition("=")
    if not sep:
        return domain
    return f"{key.rsplit('/', 1)[-1]} {value}"


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str, name: str) -> float:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as e:
        raise InventoryError(f"reservation {name}: data.expires_at is not an RFC 3339 time: {text!r}") from e


def parse_reservation(cm: Mapping[str, Any]) -> HeldReservation:
    """ConfigMap -> HeldReservation; raises InventoryError naming the bad field."""
    meta = cm.get("metadata") or {}
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    data = cm.get("data") or {}
    try:
        job = data["job"]
        if not isinstance(job, str) or not job:
            raise InventoryError(f"reservation {key[1]}: data.job must be a non-empty string")
        raw_attempt = str(data.get("attempt", "0") or "0")
        if not (raw_attempt.isascii() and raw_attempt.isdigit()):
            raise InventoryError(f"reservation {key[1]}: data.attempt must be a number, not {raw_attempt!r}")
        if "pod_sets" in data:
            docs = [_PodSetDoc.model_validate(d) for d in orjson.loads(data["pod_sets"])]
        else:
            docs = [
                _PodSetDoc(
                    nodes=orjson.loads(data["nodes"]),
                    shape=_ShapeDoc.model_validate(orjson.loads(data.get("shape", "{}"))),
                )
            ]
        parts: list[ReservedPart] = []
        for doc in docs:
            if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in doc.nodes.items()):
                raise InventoryError(f"reservation {key[1]}: nodes must map node names to replica counts")
            for shape in _shapes(doc.shape):
                parts.extend(ReservedPart(doc.name, node, n, shape) for node, n in sorted(doc.nodes.items()) if n)
        expires = data.get("expires_at")
        return HeldReservation(
            key=key,
            reservation=Reservation(job, int(raw_attempt), tuple(parts)),
            domain=str(data.get("domain", "")),
            expires_at=_parse_time(str(expires), key[1]) if expires else None,
            dispatch_id=str(data.get("dispatch", "")),
        )
    except KeyError as e:
        raise InventoryError(f"reservation {key[1]}: data.{e.args[0]} is missing") from e
    except (orjson.JSONDecodeError, ValidationError, QuantityError, ValueError, TypeError) as e:
        if isinstance(e, InventoryError):
            raise
        raise InventoryError(f"reservation {key[1]}: {e}") from e


_HOLD_KEY = "hold"


def is_hold(cm: Mapping[str, Any]) -> bool:
    """A reservation written by `reservation_configmap(hold=True)`: nodes kept for an attempt that has no
    workload yet (it is the attempt's dispatch that will hold them next)."""
    return bool((cm.get("data") or {}).get(_HOLD_KEY) == "true")


def reservation_configmap(
    reservation: Reservation,
    shapes: Mapping[str, PodShape],
    *,
    namespace: str,
    name: str,
    label: str,
    domain: str = "",
    expires_at: float | None = None,
    dispatch_id: str = "",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    hold: bool = False,
) -> dict[str, Any]:
    """The ConfigMap the agent writes for one attempt; `parse_reservation` reads it back unchanged.
    No ownerReference: cross-namespace owners are invalid, and the garbage collector would delete it."""
    nodes: dict[str, dict[str, int]] = {}
    for part in reservation.parts:
        per = nodes.setdefault(part.pod_set, {})
        per[part.node] = per.get(part.node, 0) + part.replicas
    data = {
        "job": reservation.job_id,
        "attempt": str(reservation.attempt),
        "pod_sets": orjson.dumps(
            [{"name": ps, "nodes": per, "shape": shape_document(shapes[ps])} for ps, per in nodes.items()]
        ).decode(),
    }
    if domain:
        data["domain"] = domain
    if expires_at is not None:
        data["expires_at"] = _rfc3339(expires_at)
    if dispatch_id:
        data["dispatch"] = dispatch_id
    if hold:
        data[_HOLD_KEY] = "true"  # nodes kept for an attempt not dispatched yet (no workload of its own)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(labels or {}), label: RESERVATION_LABEL_VALUE},
            "annotations": dict(annotations or {}),
        },
        "data": data,
    }
