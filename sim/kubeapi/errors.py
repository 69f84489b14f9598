"""API errors as the real API server writes them: `kind: Status` bodies with reason, code and causes.

Every failure inside the fake is an `ApiError`; only the HTTP edge turns it into a response.
Constructors are named after the apimachinery helpers (NewNotFound, NewConflict, ...), so a
message here can be checked against the real server's text one to one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = [
    "STALE",
    "ApiError",
    "Cause",
    "already_exists",
    "bad_request",
    "conflict",
    "expired",
    "forbidden",
    "injected",
    "internal_error",
    "invalid",
    "method_not_allowed",
    "not_acceptable",
    "not_found",
    "path_not_found",
    "qualified",
    "status_success",
    "too_many_requests",
    "unauthorized",
    "unsupported_media_type",
]


@dataclasses.dataclass(frozen=True)
class Cause:
    """One entry of `details.causes` (field.Error in Go): reason type, message, field path."""

    reason: str
    message: str
    field: str

    def as_json(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


class ApiError(Exception):
    """A failed request: HTTP code plus the Status body's reason, message and details."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        list_meta: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}
        self.list_meta = list_meta or {}

    def status(self) -> dict[str, Any]:
        """The Status object, key for key as `kubectl get --raw` shows it."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.list_meta),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def qualified(group: str, plural: str) -> str:
    """GroupResource.String(): "pods", "jobs.batch"."""
    return f"{plural}.{group}" if group else plural


def _details(group: str, kind: str, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = kind
    details.update(extra)
    return details


def not_found(group: str, plural: str, name: str) -> ApiError:
    message = f'{qualified(group, plural)} "{name}" not found' if name else f"{qualified(group, plural)} not found"
    return ApiError(404, "NotFound", message, details=_details(group, plural, name))


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", details={})


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified(group, plural)} "{name}" already exists',
        details=_details(group, plural, name),
    )


def conflict(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": {why}',
        details=_details(group, plural, name),
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(group: str, kind: str, name: str, causes: Sequence[Cause]) -> ApiError:
    """NewInvalid: 422 with one cause per field error; the message joins them as Go's aggregate does."""
    texts = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified_kind = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qualified_kind} "{name}" is invalid: {joined}',
        details=_details(group, kind, name, causes=[c.as_json() for c in causes]),
    )


def forbidden(group: str, plural: str, name: str, why: str) -> ApiError:
    subject = f'{qualified(group, plural)} "{name}"' if name else qualified(group, plural)
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", details=_details(group, plural, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def expired(message: str, *, continue_token: str | None = None) -> ApiError:
    meta = {"continue": continue_token} if continue_token else None
    return ApiError(410, "Expired", message, list_meta=meta)


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", details={}
    )


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    return (
        ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}",
            details={},
        )
        if content_type
        else ApiError(415, "UnsupportedMediaType", "unsupported media type", details={})
    )


def not_acceptable() -> ApiError:
    return ApiError(
        406,
        "NotAcceptable",
        "the server was unable to respond with a content type that the client supports",
        details={},
    )


def too_many_requests(retry_after_s: int | None) -> ApiError:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else {}
    details: dict[str, Any] = {"retryAfterSeconds": retry_after_s} if retry_after_s is not None else {}
    return ApiError(
        429, "TooManyRequests", "Too many requests, please try again later.", details=details, headers=headers
    )


def internal_error(message: str) -> ApiError:
    return ApiError(
        500, "InternalError", f"Internal error occurred: {message}", details={"causes": [{"message": message}]}
    )


_REASON_BY_CODE = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    401: ("Unauthorized", "Unauthorized"),
    403: ("Forbidden", "the server does not allow access to the requested resource"),
    404: ("NotFound", "the server could not find the requested resource"),
    405: ("MethodNotAllowed", "the server does not allow this method on the requested resource"),
    409: ("Conflict", "the server reported a conflict"),
    410: ("Expired", "the requested resource is no longer available"),
    422: ("Invalid", "the server rejected our request due to an error in our request"),
    500: ("InternalError", "an error on the server has prevented the request from succeeding"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: (
        "Timeout",
        "the server was unable to return a response in the time allotted, but may still be processing the request",
    ),
}


def injected(code: int, retry_after_s: int | None) -> ApiError:
    """The error a fault injection answers with: the Status the real server sends for that code."""
    if code == 429:
        return too_many_requests(retry_after_s)
    if code == 500:
        return internal_error("injected fault")
    reason, message = _REASON_BY_CODE.get(code, ("Unknown", f"the server responded with the status code {code}"))
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else {}
    details: dict[str, Any] = {"retryAfterSeconds": retry_after_s} if retry_after_s is not None else {}
    return ApiError(code, reason, message, details=details, headers=headers)


def status_success(code: int | None = None, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Success Status: a delete's reply (details name the object) or a binding's (code 201)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details is not None:
        body["details"] = details
    if code is not None:
        body["code"] = code
    return body
