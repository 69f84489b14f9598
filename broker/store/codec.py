"""Row ↔ record conversion, request fingerprints, signed page tokens and job ids for the SQL store."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import orjson

from broker.domain.errors import InvalidPageToken
from broker.domain.records import (
    AttemptRecord,
    DispatchOrder,
    EventKind,
    JobFilter,
    JobRecord,
    NewJob,
    OrderKind,
    ReplicaRecord,
    WatchEvent,
)
from broker.domain.states import AttemptOutcome, JobState
from fleetplan.catalog import ReplicaPlacement

__all__ = [
    "store_id",
    "dumps",
    "fingerprint",
    "new_job_id",
    "job_from_row",
    "attempt_from_row",
    "replica_from_row",
    "with_replicas",
    "event_from_row",
    "order_from_row",
    "assignments_json",
    "PageTokens",
]


class Row(Protocol):
    """A result row addressable by column name (sqlite3.Row, asyncpg.Record)."""

    def __getitem__(self, key: str, /) -> Any: ...


_B32 = "abcdefghijklmnopqrstuvwxyz234567"


def new_job_id(clock_ms: Callable[[], int] | None = None) -> str:
    """'j' + 26 base32 chars: 48 bits of milliseconds then 80 random bits (sortable, DNS-1035)."""
    import time

    ms = clock_ms() if clock_ms else int(time.time() * 1000)
    n = ((ms & ((1 << 48) - 1)) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_B32[n & 31])
        n >>= 5
    return "j" + "".join(reversed(chars))


def dumps(value: object) -> str:
    """Compact JSON text for a TEXT column (orjson: this runs once per write on the single writer thread)."""
    return orjson.dumps(value).decode()


def fingerprint(job: NewJob) -> bytes:
    """sha256 of the canonical request: everything that defines the job, not the key or id.

    Persisted with the job: changing this encoding makes retries of older submissions conflict.
    """
    canon = orjson.dumps(
        [
            job.tenant,
            job.queue,
            job.job_set,
            job.priority_band,
            job.priority,
            job.preemptible,
            sorted(job.labels),
            job.gpus,
            list(job.gpu_models),
            job.max_infra_retries,
            job.max_runtime_s,
        ],
    )
    h = hashlib.sha256(canon)
    h.update(b"\x00")
    h.update(job.spec)
    return h.digest()


def _opt_float(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


def job_from_row(r: Row) -> JobRecord:
    labels = orjson.loads(r["labels"])
    mir = r["max_infra_retries"]
    held_by = r["held_by"]
    return JobRecord(
        job_id=r["job_id"],
        seq=r["seq"],
        tenant=r["tenant"],
        queue=r["queue"],
        job_set=r["job_set"],
        priority_band=r["priority_band"],
        priority=r["priority"],
        preemptible=bool(r["preemptible"]),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        gpus=r["gpus"],
        gpu_models=tuple(orjson.loads(r["gpu_models"])),
        max_infra_retries=None if mir is None else int(mir),
        max_runtime_s=_opt_float(r["max_runtime_s"]),
        spec=bytes(r["spec"]),
        idempotency_key=r["idem_key"],
        fingerprint=bytes(r["fingerprint"]),
        state=JobState(r["state"]),
        attempt=r["attempt"],
        infra_retries=r["infra_retries"],
        not_before=r["not_before"],
        create_time=r["create_time"],
        update_time=r["update_time"],
        end_time=_opt_float(r["end_time"]),
        reason=r["reason"],
        message=r["message"],
        revision=r["revision"],
        held=held_by is not None,
        held_by=held_by or "",
    )


def assignments_json(assignments: tuple[ReplicaPlacement, ...]) -> str:
    return dumps([[a.pod_set, a.index, a.node] for a in assignments])


def attempt_from_row(r: Row) -> AttemptRecord:
    outcome = r["outcome"]
    ec = r["exit_code"]
    return AttemptRecord(
        job_id=r["job_id"],
        number=r["number"],
        cluster=r["cluster"],
        domain=tuple(orjson.loads(r["domain"])),
        assignments=tuple(ReplicaPlacement(p, int(i), n) for p, i, n in orjson.loads(r["assignments"])),
        gpu_model=r["gpu_model"],
        gpus=r["gpus"],
        reserve_time=r["reserve_time"],
        expires_at=_opt_float(r["expires_at"]),
        dispatch_time=_opt_float(r["dispatch_time"]),
        accept_time=_opt_float(r["accept_time"]),
        start_time=_opt_float(r["start_time"]),
        running_time=_opt_float(r["running_time"]),
        end_time=_opt_float(r["end_time"]),
        outcome=None if outcome is None else AttemptOutcome(outcome),
        exit_code=None if ec is None else int(ec),
        message=r["message"],
        spent_retry=bool(r["spent_retry"]),
        namespace=r["namespace"],
        rejection_reason=r["rejection_reason"],
        rejection_nodes=tuple(orjson.loads(r["rejection_nodes"])),
        rendezvous=r["rendezvous"],
        feedback=r["feedback"],
        feedback_time=_opt_float(r["feedback_time"]),
    )


def replica_from_row(r: Row) -> ReplicaRecord:
    ec = r["exit_code"]
    return ReplicaRecord(
        pod_set=r["pod_set"],
        index=int(r["idx"]),
        pod=r["pod"],
        node=r["node"],
        phase=r["phase"],
        exit_code=None if ec is None else int(ec),
        reason=r["reason"],
        message=r["message"],
    )


def with_replicas(attempts: list[AttemptRecord], rows: Iterable[Row]) -> list[AttemptRecord]:
    """Attach replica rows (any order) to their attempts, ordered by pod set and index."""
    by: dict[int, list[ReplicaRecord]] = {}
    for r in rows:
        by.setdefault(int(r["attempt"]), []).append(replica_from_row(r))
    return [
        dataclasses.replace(a, replicas=tuple(sorted(by[a.number], key=lambda x: (x.pod_set, x.index))))
        if a.number in by
        else a
        for a in attempts
    ]


def event_from_row(r: Row) -> WatchEvent:
    fs = r["from_state"]
    return WatchEvent(
        revision=r["revision"],
        job_id=r["job_id"],
        tenant=r["tenant"],
        job_set=r["job_set"],
        kind=EventKind(r["kind"]),
        from_state=None if fs is None else JobState(fs),
        to_state=JobState(r["to_state"]),
        attempt=r["attempt"],
        reason=r["reason"],
        message=r["message"],
        actor=r["actor"],
        time=r["time"],
    )


def order_from_row(r: Row) -> DispatchOrder:
    return DispatchOrder(
        order_id=r["order_id"],
        cluster=r["cluster"],
        job_id=r["job_id"],
        attempt=r["attempt"],
        kind=OrderKind(r["kind"]),
        grace_s=r["grace_s"],
        created_at=r["created_at"],
        delivered_at=_opt_float(r["delivered_at"]),
    )


def store_id(secret: bytes) -> str:
    """The database's identity, derived from its random per-database secret (created at first open)."""
    return hashlib.sha256(b"tandem-store-id:" + secret).hexdigest()[:12]


class PageTokens:
    """Opaque keyset page tokens: ``base64url(json{after, filter digest}) . hmac``; bound to the filter."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @staticmethod
    def _digest(flt: JobFilter) -> str:
        canon = json.dumps(
            [
                flt.tenant,
                sorted(s.value for s in flt.states),
                flt.queue,
                flt.job_set,
                sorted(flt.labels),
                flt.cluster,
                flt.gpu_model,
            ],
            separators=(",", ":"),
        )
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()[:16]

    def encode(self, after_seq: int, flt: JobFilter) -> str:
        body = json.dumps({"a": after_seq, "f": self._digest(flt)}, separators=(",", ":")).encode()
        raw = body + self._mac(body)
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, token: str, flt: JobFilter) -> int:
        """The last seq of the previous page; InvalidPageToken if forged, corrupt or for another filter."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError) as e:
            raise InvalidPageToken("page_token is not a token this broker issued") from e
        body, mac = raw[:-16], raw[-16:]
        if len(raw) <= 16 or not hmac.compare_digest(mac, self._mac(body)):
            raise InvalidPageToken("page_token is not a token this broker issued")
        try:
            data = json.loads(body)
            after, digest = int(data["a"]), str(data["f"])
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidPageToken("page_token is corrupt") from e
        if digest != self._digest(flt):
            raise InvalidPageToken("page_token was issued for a different filter")
        return after
