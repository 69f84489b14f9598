"""One error hierarchy for the placement core, so shells translate core failures in one place."""

from __future__ import annotations

__all__ = ["PlacementError", "QuantityError", "PodSpecError", "SelectorError", "CapacityError"]


class PlacementError(ValueError):
    """Base of every error the core raises on bad input (a ValueError: the caller sent it)."""


class QuantityError(PlacementError):
    """A string is not a valid Kubernetes quantity."""


class PodSpecError(PlacementError):
    """A pod object is malformed; `field` names the offending JSON path."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class SelectorError(PlacementError):
    """A DRA CEL selector does not compile; `expression` is the selector text."""

    def __init__(self, expression: str, problem: str) -> None:
        super().__init__(f"selector {expression!r}: {problem}")
        self.expression = expression
        self.problem = problem


class CapacityError(PlacementError):
    """allocate() was asked for more replicas than fit; `reason` says what ran out."""

    def __init__(self, node: str, wanted: int, fits: int, reason: object, detail: str) -> None:
        super().__init__(f"node {node}: {wanted} replicas requested, {fits} fit ({detail})")
        self.node = node
        self.wanted = wanted
        self.fits = fits
        self.reason = reason
        self.detail = detail
