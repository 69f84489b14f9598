"""What every servicer method does at the edge: who is calling, may they, audit, and errors -> gRPC status.

`register` puts a servicer on a server the way the generated `add_*Servicer_to_server` does, with two
changes that make every bad request an INVALID_ARGUMENT naming the field instead of grpcio's UNKNOWN:
request bytes are decoded without raising (`wire.decoder`), and each unary request is refused, naming
the field, when it does not decode or holds an enum number its enum does not define. Methods the servicer
does not implement on that listener answer UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import Any, NoReturn

import grpc
from grpc_status import rpc_status

from broker.api import validation
from broker.api.ports import Gate
from broker.api.serde_status import status_from_error
from broker.api.services.wire import Undecodable, decoder
from broker.domain import errors
from broker.tenancy.auth import AUDITED, Caller, Credentials, Listener, Method, credentials_from_metadata

__all__ = ["abort", "Edge", "register", "request_violations"]

_METHODS = {m.rpc: m for m in Method}

_log = logging.getLogger("tandem.broker.edge")


def _credentials(context: grpc.aio.ServicerContext) -> Credentials:
    auth_ctx = context.auth_context() or {}
    names = {k: v for k, v in auth_ctx.items() if k.startswith("x509_")}
    return credentials_from_metadata(context.invocation_metadata(), names, context.peer())


async def abort(context: grpc.aio.ServicerContext, err: errors.TandemError) -> NoReturn:
    await context.abort_with_status(rpc_status.to_status(status_from_error(err, size="trailer")))
    raise AssertionError("unreachable")


class Edge:
    """Shared per-call steps of the servicers."""

    def __init__(self, gate: Gate, listener: Listener) -> None:
        self.gate = gate
        self.listener = listener

    def caller(self, context: grpc.aio.ServicerContext, method: Method) -> Caller:
        return self.caller_for(_credentials(context), method)

    def caller_for(self, creds: Credentials, method: Method) -> Caller:
        """Who is calling and may they: the one check both edges (gRPC, the fleet view's HTTP) make."""
        caller = self.gate.authz.authenticate(creds, self.listener)
        try:
            self.gate.authz.authorize(caller, method)
        except errors.TandemError as exc:
            if method in AUDITED:
                self.gate.audit.record(caller, method, "denied", reason=exc.details.reason, message=exc.message)
            raise
        return caller

    async def refuse(
        self, context: grpc.aio.ServicerContext, method: Method, violations: list[errors.FieldViolation]
    ) -> NoReturn:
        """INVALID_ARGUMENT naming `violations`, after authentication (an unknown caller learns nothing about
        the request) and with the audit record of an audited method."""
        caller: Caller | None = None
        try:
            caller = self.caller(context, method)
            raise errors.InvalidArgument.fields(*violations)
        except Exception as exc:
            await self.fail(context, exc, method, caller)

    async def fail(
        self,
        context: grpc.aio.ServicerContext,
        exc: BaseException,
        method: Method,
        caller: Caller | None = None,
        **audit: Any,
    ) -> NoReturn:
        await abort(context, self.failed(exc, method, caller, context.peer(), **audit))

    def failed(
        self, exc: BaseException, method: Method, caller: Caller | None, peer: str, **audit: Any
    ) -> errors.TandemError:
        """The error a failed call answers with (an unexpected exception is logged, the caller told only
        "internal error"), with the audit record of an audited method."""
        err = exc if isinstance(exc, errors.TandemError) else errors.Internal("internal error")
        if not isinstance(exc, errors.TandemError):
            _log.exception("handler failed", extra={"method": method.rpc})
        if method in AUDITED and caller is not None:
            self.gate.audit.record(caller, method, "error", reason=err.details.reason, **audit)
        elif caller is None and method in AUDITED:
            self.gate.audit.record(None, method, "unauthenticated", reason=err.details.reason, peer=peer)
        return err


def request_violations(request: object, skip: Collection[str] = (), root: str = "") -> list[errors.FieldViolation]:
    """Why a decoded (or undecodable) request is refused before its method runs: bytes that are not the
    message, or unknown enum numbers outside the top-level fields in `skip` (checked by the method itself).
    Paths start at `root` (a stream's `messages[3]`); bytes broken before any field is named the root, or
    `request` for a unary call."""
    if isinstance(request, Undecodable):
        path = ".".join(p for p in (root, request.field) if p) or "request"
        return [errors.FieldViolation(path, f"{request.description} (the bytes are not a {request.type_name})")]
    return [
        errors.FieldViolation(f"{root}.{v.field}" if root else v.field, v.description)
        for v in validation.unknown_enums(request)
        if v.field.partition(".")[0].partition("[")[0] not in skip
    ]


class _Capture:
    """Stands in for the server when the generated add_*Servicer_to_server is called: keeps its handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, dict(handlers)


def register(
    add: Callable[[Any, Any], None],
    servicer: Any,
    base: type,
    edge: Edge,
    server: grpc.aio.Server,
    *,
    checked_per_item: Mapping[str, Collection[str]] | None = None,
) -> None:
    """Serve `servicer` on `server` like `add(servicer, server)` would, with never-raising request decoding,
    requests refused at the edge when they are not what the method takes, and UNIMPLEMENTED (without a
    traceback) for the methods `base` declares but the servicer does not override. `checked_per_item`: per
    method, top-level fields whose enums the method checks itself (SubmitJobs items fail one by one)."""
    captured = _Capture()
    add(servicer, captured)
    if not captured.handlers:
        raise RuntimeError(f"{add.__name__} registered no method handlers")
    handlers = {}
    for name, handler in captured.handlers.items():
        served = getattr(type(servicer), name, None) is not getattr(base, name, None)
        skip = (checked_per_item or {}).get(name, ())
        handlers[name] = _guarded(name, handler, edge, served, skip)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(captured.service, handlers),))
    server.add_registered_method_handlers(captured.service, handlers)


def _guarded(name: str, handler: Any, edge: Edge, served: bool, skip: Collection[str]) -> Any:
    decode = decoder(handler.request_deserializer.__self__)
    method = _METHODS[name]
    if not served:

        async def unimplemented(request: object, context: grpc.aio.ServicerContext) -> NoReturn:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not served on this listener")
            raise AssertionError("unreachable")

        kind = {
            (False, False): "unary_unary",
            (False, True): "unary_stream",
            (True, False): "stream_unary",
            (True, True): "stream_stream",
        }[(handler.request_streaming, handler.response_streaming)]
        return handler._replace(request_deserializer=decode, **{kind: unimplemented})
    if handler.request_streaming:
        return handler._replace(request_deserializer=decode)  # streams check each message themselves
    if handler.response_streaming:
        inner_stream: Callable[..., AsyncIterator[Any]] = handler.unary_stream

        async def stream(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            bad = request_violations(request, skip)
            if bad:
                await edge.refuse(context, method, bad)
            async for item in inner_stream(request, context):
                yield item

        return handler._replace(request_deserializer=decode, unary_stream=stream)
    inner: Callable[..., Awaitable[Any]] = handler.unary_unary

    async def unary(request: object, context: grpc.aio.ServicerContext) -> Any:
        bad = request_violations(request, skip)
        if bad:
            await edge.refuse(context, method, bad)
        return await inner(request, context)

    return handler._replace(request_deserializer=decode, unary_unary=unary)
