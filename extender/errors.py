"""The extender's error hierarchy; each error knows how it leaves the process (HTTP code or `Error`)."""

from __future__ import annotations

__all__ = ["ExtenderError", "UndecodableBody", "BadRequest", "NotSynced", "InventoryError"]


class ExtenderError(Exception):
    """Base of every error the extender raises on purpose.

    http_status: the status the app answers with. The extender protocol treats any non-200 as a
    failed call, so only an undecodable body gets a non-200; the rest travel in the `Error` field.
    """

    http_status = 200


class UndecodableBody(ExtenderError):
    """The body is not JSON at all: HTTP 400."""

    http_status = 400


class BadRequest(ExtenderError):
    """Decodable JSON that is not a valid request (wrong types, missing pod, unknown claim)."""


class NotSynced(ExtenderError):
    """The inventory has not finished its first full sync, so no decision can be trusted yet."""


class InventoryError(ExtenderError):
    """An inventory object could not be understood (reported, then the object is skipped)."""
