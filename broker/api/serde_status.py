"""Broker errors -> google.rpc.Status, in one place: sized for a response body, a trailer or the smallest form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from broker.domain.errors import TandemError

__all__ = ["status_from_error"]


@dataclass(frozen=True, slots=True)
class _Limits:
    """Bounds on what an error echoes back (field paths and descriptions quote the caller's own input)."""

    message: int
    field: int
    description: int
    violations: int
    meta: int


_BODY = _Limits(message=2048, field=512, description=1024, violations=100, meta=256)
"""A SubmitJobs item's error, inside the response message."""
_TRAILER = _Limits(message=300, field=128, description=160, violations=8, meta=128)
"""A call's error travels in its trailers (grpc-message and grpc-status-details-bin), and a client refuses
trailers past 8 KiB (grpcio's default soft limit) as RESOURCE_EXHAUSTED: the error it was meant to read is
lost. These bounds keep the worst case (every character outside ASCII, percent-encoded) under 6 KiB."""


_MINIMAL = _Limits(message=120, field=128, description=120, violations=1, meta=64)
"""A SubmitJobs item's error once the response's room for errors is spent (a thousand items each quoting
their bad input must not make a response larger than the client may receive)."""
_LIMITS = {"body": _BODY, "trailer": _TRAILER, "minimal": _MINIMAL}


def _clip(text: str, limit: int) -> str:
    """At most `limit` UTF-8 bytes, cut on a character boundary, an ellipsis marking the cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: max(0, limit - 3)].decode("utf-8", "ignore") + "\u2026"


def status_from_error(err: TandemError, *, size: Literal["body", "trailer", "minimal"] = "body") -> status_pb2.Status:
    """A google.rpc.Status with the error's structured details (BadRequest, QuotaFailure, ...), every text bounded:
    `size` "body" for an item's error in a response, "trailer" for a call's own error, "minimal" past a
    response's room for errors (one field violation, still naming the field)."""
    lim = _LIMITS[size]
    d = err.details
    shown = d.field_violations[: lim.violations]
    message = err.message
    if len(d.field_violations) > len(shown):
        message = f"{len(d.field_violations)} bad fields: {message}"
    out = status_pb2.Status(code=err.code.value, message=_clip(message, lim.message))

    def add(msg: object) -> None:
        packed = any_pb2.Any()
        packed.Pack(msg)  # type: ignore[arg-type]
        out.details.append(packed)

    if shown:
        add(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=_clip(v.field, lim.field), description=_clip(v.description, lim.description)
                    )
                    for v in shown
                ]
            )
        )
    if d.quota_violations:
        add(
            error_details_pb2.QuotaFailure(
                violations=[
                    error_details_pb2.QuotaFailure.Violation(
                        subject=_clip(f"{v.subject}/{v.quota}", lim.field),
                        description=f"used {v.used:g} + {v.requested:g} > limit {v.limit:g}",
                    )
                    for v in d.quota_violations[: lim.violations]
                ]
            )
        )
    if d.policy_violations:
        add(
            error_details_pb2.PreconditionFailure(
                violations=[
                    error_details_pb2.PreconditionFailure.Violation(
                        type=v.type,
                        subject=_clip(v.subject, lim.field),
                        description=_clip(v.description, lim.description),
                    )
                    for v in d.policy_violations[: lim.violations]
                ]
            )
        )
    if d.retry_after_s is not None:
        info = error_details_pb2.RetryInfo()
        info.retry_delay.FromNanoseconds(int(d.retry_after_s * 1e9))
        add(info)
    add(
        error_details_pb2.ErrorInfo(
            reason=d.reason, domain="tandem.dev", metadata={k: _clip(v, lim.meta) for k, v in d.metadata}
        )
    )
    assert code_pb2.OK == 0
    return out
