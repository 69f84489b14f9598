"""The retry budget and back-off of failed attempts: one policy, also the broker config's ``retry:`` section."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RetryPolicy", "backoff_s"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry budget and back-off: the one definition, also the broker config's ``retry:`` section (its keys
    are these fields). A job's own ``max_infra_retries`` overrides the policy's."""

    max_infra_retries: int = 4
    """Attempts ending INFRA_FAILED / GANG_TIMEOUT / LOST-after-start allowed before the job FAILS (count)."""
    max_attempts: int = 20
    """Hard cap on attempts of any outcome, so rejection loops end (count)."""
    backoff_base_s: float = 5.0
    """Back-off after the first spent retry (seconds)."""
    backoff_factor: float = 2.0
    """Multiplier of the back-off per further spent retry (dimensionless)."""
    backoff_max_s: float = 300.0
    """Back-off cap (seconds)."""
    preempted_backoff_s: float = 1.0
    """A preempted job waits this long before it is placed again (about one inventory report), so its next
    attempt is decided over a report that no longer shows its old pods (FLEET-NOTES F-9)."""

    def __post_init__(self) -> None:
        # Raised as ValueError so the config loader reports the field (pydantic wraps it).
        if self.max_infra_retries < 0 or self.max_attempts < 1:
            raise ValueError("retry: max_infra_retries must be >= 0 and max_attempts >= 1")
        if min(self.backoff_base_s, self.backoff_max_s, self.preempted_backoff_s) < 0 or self.backoff_factor < 1:
            raise ValueError("retry: back-offs must be >= 0 seconds and backoff_factor >= 1")


def backoff_s(policy: RetryPolicy, retries_spent: int) -> float:
    """Exponential, capped back-off after the ``retries_spent``-th spent retry (1-based)."""
    if retries_spent <= 0:
        return 0.0
    return min(policy.backoff_max_s, policy.backoff_base_s * policy.backoff_factor ** (retries_spent - 1))
