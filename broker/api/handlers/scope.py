"""Whom a call acts for: the tenant it may touch, the scope of its store reads, the actor its records name."""

from __future__ import annotations

from broker.domain import errors
from broker.tenancy.auth import Caller, CallerKind

__all__ = ["tenant_of", "scope_of", "actor_of"]


def tenant_of(caller: Caller, requested: str) -> str:
    """The tenant a call acts for: tenants only for themselves, admins for whom they name."""
    if caller.kind is CallerKind.TENANT:
        if requested and requested != caller.name:
            raise errors.PermissionDenied(f"tenant {caller.name} may not act for tenant {requested}")
        return caller.name
    if caller.kind is CallerKind.ADMIN:
        return requested
    raise errors.PermissionDenied("agents may not use the job API")


def scope_of(caller: Caller) -> str | None:
    """The tenant whose jobs a store read is limited to (None: an admin sees every tenant's)."""
    return None if caller.is_admin else caller.name


def actor_of(caller: Caller) -> str:
    return f"{caller.kind.value}/{caller.name}"
