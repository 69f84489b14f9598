"""What every servicer method does at the edge: who is calling, may they, audit, and errors -> gRPC status."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc
from grpc_status import rpc_status

from broker import errors
from broker.auth import Caller, Credentials, Listener, Method, MUTATING, credentials_from_metadata
from broker.hub import Hub
from broker.serde import status_from_error

__all__ = ["caller_for", "abort", "Edge"]

_log = logging.getLogger("tandem.broker.edge")


def _credentials(context: grpc.aio.ServicerContext) -> Credentials:
    auth_ctx = context.auth_context() or {}
    names = {k: v for k, v in auth_ctx.items() if k.startswith("x509_")}
    return credentials_from_metadata(context.invocation_metadata(), names, context.peer())


async def abort(context: grpc.aio.ServicerContext, err: errors.TandemError) -> NoReturn:
    await context.abort_with_status(rpc_status.to_status(status_from_error(err)))
    raise AssertionError("unreachable")


class Edge:
    """Shared per-call steps of the servicers."""

    def __init__(self, hub: Hub, listener: Listener) -> None:
        self.hub = hub
        self.listener = listener

    def caller(self, context: grpc.aio.ServicerContext, method: Method) -> Caller:
        caller = self.hub.authz.authenticate(_credentials(context), self.listener)
        try:
            self.hub.authz.authorize(caller, method)
        except errors.TandemError as exc:
            if method in MUTATING:
                self.hub.audit.record(caller, method, "denied", reason=exc.details.reason, message=exc.message)
            raise
        return caller

    async def fail(self, context: grpc.aio.ServicerContext, exc: BaseException, method: Method,
                   caller: Caller | None = None, **audit: Any) -> NoReturn:
        err = exc if isinstance(exc, errors.TandemError) else errors.Internal("internal error")
        if not isinstance(exc, errors.TandemError):
            _log.exception("handler failed", extra={"method": method.rpc})
        if method in MUTATING and caller is not None:
            self.hub.audit.record(caller, method, "error", reason=err.details.reason, **audit)
        elif caller is None and method in MUTATING:
            self.hub.audit.record(None, method, "unauthenticated", reason=err.details.reason, peer=context.peer())
        await abort(context, err)
