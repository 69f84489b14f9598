"""The broker's one error hierarchy: each error knows its gRPC status and HTTP code and carries structured details.

Raise these anywhere in the broker (with ``raise ... from cause``); only the
service edge translates them into a gRPC status with details (``code.value`` is
the numeric gRPC status, ``grpc.StatusCode[code.name]`` the enum member;
``http_status`` for HTTP edges). This module does not import grpc, so pure
modules (queue, lifecycle) may raise and return these errors.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "Code",
    "FieldViolation",
    "QuotaViolation",
    "PolicyViolation",
    "ErrorDetails",
    "TandemError",
    "InvalidArgument",
    "InvalidPageToken",
    "NotFound",
    "JobNotFound",
    "AlreadyExists",
    "IdempotencyConflict",
    "FailedPrecondition",
    "InvalidTransition",
    "JobFinished",
    "Unschedulable",
    "Aborted",
    "StaleTransition",
    "OutOfRange",
    "RevisionCompacted",
    "PermissionDenied",
    "PolicyDenied",
    "Unauthenticated",
    "ResourceExhausted",
    "QuotaExceeded",
    "RateLimited",
    "Unavailable",
    "StoreUnavailable",
    "BatchFailed",
    "DeadlineExceeded",
    "Internal",
]


class Code(enum.Enum):
    """gRPC status codes by name and number (same numbering as grpc.StatusCode)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# HTTP equivalents (google.rpc code mapping), for HTTP edges.
_HTTP = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad request field (google.rpc.BadRequest.FieldViolation)."""

    field: str
    """Path of the field, e.g. ``pod_sets[0].shape.gpu_count``."""
    description: str


@dataclass(frozen=True, slots=True)
class QuotaViolation:
    """A quota that blocks a request (google.rpc.QuotaFailure.Violation)."""

    subject: str
    """Who is limited, e.g. ``tenant/ml``."""
    quota: str
    """Which limit, e.g. ``gpu/NVIDIA-H100-80GB-HBM3``."""
    used: float
    limit: float
    requested: float = 0.0


@dataclass(frozen=True, slots=True)
class PolicyViolation:
    """A tenancy-policy rule that forbids a request (google.rpc.PreconditionFailure.Violation)."""

    type: str
    """Kind of rule, e.g. ``PRIORITY_BAND``, ``CLUSTER``, ``GPU_MODEL``."""
    subject: str
    description: str


@dataclass(frozen=True, slots=True)
class ErrorDetails:
    """Structured details; the edge turns them into google.rpc detail messages."""

    reason: str = ""
    """Stable UPPER_SNAKE machine-readable reason (google.rpc.ErrorInfo.reason)."""
    field_violations: tuple[FieldViolation, ...] = ()
    quota_violations: tuple[QuotaViolation, ...] = ()
    policy_violations: tuple[PolicyViolation, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    """Extra key/value facts (google.rpc.ErrorInfo.metadata), e.g. ``("job_id", "j…")``."""
    retry_after_s: float | None = None
    """Suggested client back-off (google.rpc.RetryInfo), seconds."""


class TandemError(Exception):
    """Base of every broker error. ``code`` is the gRPC status; ``retryable`` says a plain retry may succeed."""

    code: ClassVar[Code] = Code.INTERNAL
    retryable: ClassVar[bool] = False
    default_reason: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, *, details: ErrorDetails | None = None, **metadata: Any) -> None:
        super().__init__(message)
        self.message = message
        d = details or ErrorDetails()
        if metadata:
            d = ErrorDetails(
                reason=d.reason,
                field_violations=d.field_violations,
                quota_violations=d.quota_violations,
                policy_violations=d.policy_violations,
                metadata=d.metadata + tuple((k, str(v)) for k, v in sorted(metadata.items())),
                retry_after_s=d.retry_after_s,
            )
        if not d.reason:
            d = ErrorDetails(
                reason=self.default_reason,
                field_violations=d.field_violations,
                quota_violations=d.quota_violations,
                policy_violations=d.policy_violations,
                metadata=d.metadata,
                retry_after_s=d.retry_after_s,
            )
        self.details = d

    @property
    def http_status(self) -> int:
        return _HTTP[self.code]

    def meta(self, key: str) -> str | None:
        for k, v in self.details.metadata:
            if k == key:
                return v
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason={self.details.reason})"


class InvalidArgument(TandemError):
    """A bad request. Every one names at least one field (google.rpc.BadRequest): give ``details`` with
    field violations (``InvalidArgument.fields``), or a subclass sets ``default_field`` for the field it is about."""

    code = Code.INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"
    default_field: ClassVar[str] = ""
    """Field path used when the raiser names none (e.g. ``page_token``)."""

    def __init__(self, message: str, *, details: ErrorDetails | None = None, **metadata: Any) -> None:
        if self.default_field and (details is None or not details.field_violations):
            details = dataclasses.replace(
                details or ErrorDetails(), field_violations=(FieldViolation(self.default_field, message),)
            )
        super().__init__(message, details=details, **metadata)

    @classmethod
    def fields(cls, *violations: FieldViolation, message: str | None = None) -> InvalidArgument:
        text = message or "; ".join(f"{v.field}: {v.description}" for v in violations)
        return cls(text, details=ErrorDetails(field_violations=tuple(violations)))


class InvalidPageToken(InvalidArgument):
    default_reason = "INVALID_PAGE_TOKEN"
    default_field = "page_token"


class NotFound(TandemError):
    code = Code.NOT_FOUND
    default_reason = "NOT_FOUND"


class JobNotFound(NotFound):
    """Unknown job, or a job of another tenant (never say which)."""

    default_reason = "JOB_NOT_FOUND"


class AlreadyExists(TandemError):
    code = Code.ALREADY_EXISTS
    default_reason = "ALREADY_EXISTS"


class IdempotencyConflict(AlreadyExists):
    """The idempotency key was used before with a different request body (metadata: job_id, idempotency_key)."""

    default_reason = "IDEMPOTENCY_KEY_REUSED"


class FailedPrecondition(TandemError):
    code = Code.FAILED_PRECONDITION
    default_reason = "FAILED_PRECONDITION"


class InvalidTransition(FailedPrecondition):
    """The state machine has no such edge (metadata: job_id, from_state, to_state)."""

    default_reason = "INVALID_TRANSITION"


class JobFinished(FailedPrecondition):
    """The job already reached a terminal state (e.g. cancelling a SUCCEEDED job)."""

    default_reason = "JOB_FINISHED"


class Unschedulable(FailedPrecondition):
    """The job could not fit in any allowed cluster even if it were empty."""

    default_reason = "UNSCHEDULABLE"


class Aborted(TandemError):
    code = Code.ABORTED
    retryable = True
    default_reason = "ABORTED"


class StaleTransition(Aborted):
    """Compare-and-set lost: the job is no longer in the expected (state, attempt). Re-read and decide again."""

    default_reason = "STALE_TRANSITION"


class OutOfRange(TandemError):
    code = Code.OUT_OF_RANGE
    default_reason = "OUT_OF_RANGE"


class RevisionCompacted(OutOfRange):
    """The requested watch revision was compacted away (metadata: compacted_revision); re-list, then watch."""

    default_reason = "REVISION_COMPACTED"

    def __init__(self, message: str, *, compacted_revision: int) -> None:
        super().__init__(message, compacted_revision=compacted_revision)
        self.compacted_revision = compacted_revision


class PermissionDenied(TandemError):
    code = Code.PERMISSION_DENIED
    default_reason = "PERMISSION_DENIED"


class PolicyDenied(PermissionDenied):
    default_reason = "POLICY_DENIED"


class Unauthenticated(TandemError):
    code = Code.UNAUTHENTICATED
    default_reason = "UNAUTHENTICATED"


class ResourceExhausted(TandemError):
    code = Code.RESOURCE_EXHAUSTED
    default_reason = "RESOURCE_EXHAUSTED"


class QuotaExceeded(ResourceExhausted):
    default_reason = "QUOTA_EXCEEDED"


class RateLimited(ResourceExhausted):
    retryable = True
    default_reason = "RATE_LIMITED"


class Unavailable(TandemError):
    code = Code.UNAVAILABLE
    retryable = True
    default_reason = "UNAVAILABLE"


class StoreUnavailable(Unavailable):
    """The store is closed, not open yet, or its disk failed. Retry (with the same idempotency key)."""

    default_reason = "STORE_UNAVAILABLE"


class BatchFailed(StoreUnavailable):
    """The group-commit transaction holding this request failed; nothing of it was written. Retry."""

    default_reason = "COMMIT_FAILED"


class DeadlineExceeded(TandemError):
    code = Code.DEADLINE_EXCEEDED
    retryable = True
    default_reason = "DEADLINE_EXCEEDED"


class Internal(TandemError):
    code = Code.INTERNAL
    default_reason = "INTERNAL"
