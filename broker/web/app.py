"""The fleet view's HTTP edge: static page, JSON API and server-sent events, inside the broker process.

A thin layer beside the gRPC API, not a second source of truth: every call authenticates with the same
`Authorizer` (the session's bearer token), is authorised per `Method` by the same `Edge.caller_for`, and
runs the same call the gRPC servicer runs (`broker.api.services.jobs` / `.clusters`), so validation, tenant
scoping and audit records are the API's. Job documents are the API's own messages in protobuf's JSON
mapping (original field names, defaults included); the fleet and queue documents are aggregates
(`broker.web.views`).

Errors: a body that is not JSON is HTTP 400; every other refusal is the API's error — its gRPC code's HTTP
status with `{"error": {"code", "message", "reason", "field_violations"}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from broker.api.ports import ApiPorts
from broker.api.services import clusters as cluster_calls
from broker.api.services import jobs as job_calls
from broker.api.services.edge import Edge
from broker.config import WebConfig
from broker.domain import errors
from broker.tenancy.auth import Caller, CallerKind, Credentials, Listener, Method
from broker.web.sessions import COOKIE, LoginThrottle, Sessions, WebSession
from broker.web.views import FleetPicture, queues_document
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc

__all__ = ["WebServer", "message_json"]

_log = logging.getLogger("tandem.broker.web")

STATIC = Path(__file__).parent / "static"

_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

_MAX_BODY = 64 * 1024
"""Largest request body: a login or a reason, never more."""

_BOOKMARK_S = 15
"""Idle seconds between bookmarks on a live stream (they also find a closed browser tab)."""


def message_json(msg: Message) -> dict[str, Any]:
    """The API's JSON: original field names, enum names, every field (defaults too), so a page reads
    `status.state` without guessing what an absent field means."""
    out: dict[str, Any] = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return out


_COMPRESS_OVER = 16 * 1024
"""JSON bodies larger than this go compressed to a browser that accepts it (the fleet picture of 100
clusters is ~2 MB of JSON, ~10x smaller compressed)."""


def _json(body: Any, status: int = 200) -> web.Response:
    raw = orjson.dumps(body)
    response = web.Response(
        body=raw, status=status, content_type="application/json", headers={"Cache-Control": "no-store"}
    )
    if len(raw) > _COMPRESS_OVER:
        response.enable_compression()
    return response


def _error_response(err: errors.TandemError) -> web.Response:
    d = err.details
    body: dict[str, Any] = {
        "code": err.code.name,
        "message": err.message,
        "reason": d.reason,
        "field_violations": [{"field": v.field, "description": v.description} for v in d.field_violations],
    }
    headers = {}
    if d.retry_after_s:
        headers["Retry-After"] = str(max(int(d.retry_after_s + 0.999), 1))
    response = _json({"error": body}, err.http_status)
    response.headers.update(headers)
    return response


class _Refused(Exception):
    """Carries the API error of a refused HTTP call to the error middleware."""

    def __init__(self, err: errors.TandemError) -> None:
        super().__init__(err.message)
        self.err = err


def _violation(field: str, description: str) -> _Refused:
    return _Refused(errors.InvalidArgument.fields(errors.FieldViolation(field, description)))


class WebServer:
    """One aiohttp application on `cfg.address` (HTTPS when `cfg.tls` names a certificate)."""

    def __init__(self, api: ApiPorts, cfg: WebConfig) -> None:
        self.api = api
        self.cfg = cfg
        self.edge = Edge(api.gate, Listener.TENANT)
        self.sessions = Sessions(cfg.session_ttl_s, cfg.max_sessions)
        self.throttle = LoginThrottle()
        self.picture = FleetPicture(api.clusters, cfg.probe_gpus)
        self._streams: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.app = self._build()

    # ------------------------------------------------------------------ lifecycle

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=_MAX_BODY)
        r = app.router
        r.add_get("/", self._index)
        r.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
        r.add_get("/api/session", self._session_info)
        r.add_post("/api/login", self._login)
        r.add_post("/api/logout", self._logout)
        r.add_get("/api/fleet", self._fleet)
        r.add_get("/api/queues", self._queues)
        r.add_get("/api/jobs", self._list_jobs)
        r.add_get("/api/jobs/{job_id}", self._get_job)
        r.add_post("/api/jobs/{job_id}/cancel", self._cancel_job)
        r.add_post("/api/clusters/{name}/{action:cordon|uncordon}", self._cordon)
        r.add_get("/api/events", self._events)
        return app

    async def start(self) -> int:
        host, _, port = self.cfg.address.rpartition(":")
        context = None
        if self.cfg.tls.enabled:
            assert self.cfg.tls.cert_file and self.cfg.tls.key_file
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.cfg.tls.cert_file, self.cfg.tls.key_file)
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host.strip("[]") or "127.0.0.1", int(port), ssl_context=context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        for task in list(self._streams):  # live streams never end on their own
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ the edge

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            response = await handler(request)
        except _Refused as refused:
            response = _error_response(refused.err)
        except web.HTTPRequestEntityTooLarge:
            response = _error_response(errors.InvalidArgument(f"request body over {_MAX_BODY} bytes"))
            response.set_status(413)
        except web.HTTPException as exc:  # 404 / 405 of the router: JSON like every other refusal
            if exc.status < 400:
                raise
            code = {404: errors.NotFound, 405: errors.InvalidArgument}.get(exc.status, errors.InvalidArgument)
            response = _error_response(code(exc.reason))
            response.set_status(exc.status)
        except Exception:
            _log.exception("fleet view request failed", extra={"path": request.path})
            response = _error_response(errors.Internal("internal error"))
        if not response.prepared:
            response.headers.update(_HEADERS)
        return response

    def _peer(self, request: web.Request) -> str:
        return request.remote or ""

    def _session(self, request: web.Request) -> WebSession:
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            raise _Refused(errors.Unauthenticated("not logged in"))
        return session

    def _check_origin(self, request: web.Request, session: WebSession) -> None:
        """A change needs the session's CSRF token in a header, and comes from this origin (when the
        browser says where from): SameSite=Strict already keeps the cookie off other sites' requests."""
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            raise _Refused(errors.PermissionDenied("cross-origin request refused"))
        if not session.csrf_ok(request.headers.get("X-CSRF-Token")):
            raise _Refused(errors.PermissionDenied("missing or wrong X-CSRF-Token header"))

    def _caller(self, request: web.Request, session: WebSession, method: Method, **audit: Any) -> Caller:
        creds = Credentials(bearer_token=session.token, peer=self._peer(request))
        try:
            return self.edge.caller_for(creds, method)
        except Exception as exc:
            if isinstance(exc, errors.Unauthenticated):  # the token left the policy: the login ends with it
                self.sessions.close(session.id)
            raise _Refused(self.edge.failed(exc, method, None, self._peer(request), **audit)) from exc

    async def _call(
        self, request: web.Request, method: Method, run: Callable[[Caller], Awaitable[Any]], **audit: Any
    ) -> Any:
        """Authenticate from the session, check the method (and CSRF for changes), run, map errors."""
        session = self._session(request)
        if request.method != "GET":
            self._check_origin(request, session)
        caller = self._caller(request, session, method, **audit)
        try:
            return await run(caller)
        except Exception as exc:
            raise _Refused(self.edge.failed(exc, method, caller, self._peer(request), **audit)) from exc

    async def _body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw:
            return {}
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _Refused(errors.InvalidArgument("the request body is not JSON")) from None
        if not isinstance(body, dict):
            raise _violation("body", "must be a JSON object")
        return body

    @staticmethod
    def _text(body: dict[str, Any], field: str, default: str = "") -> str:
        value = body.get(field, default)
        if not isinstance(value, str):
            raise _violation(field, "must be a string")
        return value

    # ------------------------------------------------------------------ page and login

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    def _session_body(self, caller: Caller, session: WebSession) -> dict[str, Any]:
        return {
            "caller": {"kind": caller.kind.value, "name": caller.name},
            "csrf_token": session.csrf,
            "poll_interval_s": self.cfg.poll_interval_s,
            "probe_gpus": self.cfg.probe_gpus,
        }

    async def _session_info(self, request: web.Request) -> web.Response:
        session = self._session(request)
        caller = self._caller(request, session, Method.LIST_CLUSTERS)
        return _json(self._session_body(caller, session))

    async def _login(self, request: web.Request) -> web.Response:
        client = self._peer(request)
        wait = self.throttle.retry_after_s(client)
        if wait > 0:
            raise _Refused(
                errors.RateLimited(
                    "too many failed logins from this address", details=errors.ErrorDetails(retry_after_s=wait)
                )
            )
        token = self._text(await self._body(request), "token").strip()
        if not token:
            raise _violation("token", "required: a tenant's or an admin's bearer token")
        try:
            caller = self.api.gate.authz.authenticate(Credentials(bearer_token=token, peer=client), Listener.TENANT)
        except errors.Unauthenticated as exc:
            self.throttle.failed(client)
            raise _Refused(exc) from exc
        if caller.kind not in (CallerKind.TENANT, CallerKind.ADMIN):
            raise _Refused(errors.PermissionDenied("only tenants and admins log in to the fleet view"))
        session = self.sessions.open(token)
        response = _json(self._session_body(caller, session))
        response.set_cookie(
            COOKIE,
            session.id,
            httponly=True,
            secure=self.cfg.tls.enabled,
            samesite="Strict",
            path="/",
            max_age=int(self.cfg.session_ttl_s),
        )
        _log.info("fleet view login", extra={"caller": caller.name, "kind": caller.kind.value, "peer": client})
        return response

    async def _logout(self, request: web.Request) -> web.Response:
        session = self._session(request)
        self._check_origin(request, session)
        self.sessions.close(session.id)
        response = web.Response(status=204)
        response.del_cookie(COOKIE, path="/")
        return response

    # ------------------------------------------------------------------ aggregates

    async def _fleet(self, request: web.Request) -> web.Response:
        async def run(caller: Caller) -> dict[str, Any]:
            return self.picture.document(caller)

        return _json(await self._call(request, Method.LIST_CLUSTERS, run))

    async def _queues(self, request: web.Request) -> web.Response:
        async def run(caller: Caller) -> dict[str, Any]:
            return queues_document(self.api.queues, caller)

        return _json(await self._call(request, Method.GET_USAGE, run))

    # ------------------------------------------------------------------ jobs

    _LIST_PARAMS = frozenset({"tenant", "state", "queue", "job_set", "cluster", "gpu_model", "page_size", "page_token"})

    def _list_request(self, request: web.Request) -> svc.ListJobsRequest:
        q = request.query
        unknown = sorted(set(q) - self._LIST_PARAMS)
        if unknown:
            raise _violation(unknown[0], "unknown query parameter")
        out = svc.ListJobsRequest(
            tenant=q.get("tenant", ""),
            queue=q.get("queue", ""),
            job_set_id=q.get("job_set", ""),
            cluster=q.get("cluster", ""),
            gpu_model=q.get("gpu_model", ""),
            page_token=q.get("page_token", ""),
        )
        for i, name in enumerate(q.getall("state", [])):
            try:
                out.states.append(job_pb2.JobState.Value(name))
            except ValueError:
                raise _violation(f"state[{i}]", f"{name!r} is not a JobState name") from None
        raw_size = q.get("page_size", "")
        if raw_size:
            if not raw_size.isdigit():
                raise _violation("page_size", "must be a whole number")
            out.page_size = min(int(raw_size), 2**32 - 1)
        return out

    async def _list_jobs(self, request: web.Request) -> web.Response:
        req = self._list_request(request)

        async def run(caller: Caller) -> svc.ListJobsResponse:
            return await job_calls.list_jobs(self.api.jobs, caller, req)

        return _json(message_json(await self._call(request, Method.LIST_JOBS, run)))

    async def _get_job(self, request: web.Request) -> web.Response:
        req = svc.GetJobRequest(job_id=request.match_info["job_id"], view=svc.JOB_VIEW_FULL)

        async def run(caller: Caller) -> svc.GetJobResponse:
            return await job_calls.get_job(self.api.jobs, caller, req)

        return _json(message_json(await self._call(request, Method.GET_JOB, run)))

    async def _cancel_job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        body = await self._body(request)
        req = svc.CancelJobRequest(job_id=job_id, reason=self._text(body, "reason", "cancelled from the fleet view"))

        async def run(caller: Caller) -> svc.CancelJobResponse:
            return await job_calls.cancel_job(self.api.jobs, self.api.gate.audit, caller, req)

        return _json(message_json(await self._call(request, Method.CANCEL_JOB, run, job_id=job_id)))

    async def _cordon(self, request: web.Request) -> web.Response:
        name, on = request.match_info["name"], request.match_info["action"] == "cordon"
        body = await self._body(request)
        req = cs.CordonRequest(name=name, reason=self._text(body, "reason"))

        async def run(caller: Caller) -> cs.ClusterSummary:
            return await cluster_calls.cordon(self.api.clusters, self.api.gate.audit, caller, req, on)

        method = Method.CORDON if on else Method.UNCORDON
        summary = await self._call(request, method, run, cluster=name)
        return _json({"cluster": message_json(summary)})

    # ------------------------------------------------------------------ live

    _EVENT_PARAMS = frozenset({"job_id", "tenant", "job_set", "from_revision"})

    def _watch_request(self, request: web.Request) -> svc.WatchJobsRequest:
        q = request.query
        unknown = sorted(set(q) - self._EVENT_PARAMS)
        if unknown:
            raise _violation(unknown[0], "unknown query parameter")
        # EventSource resends the last `id:` it saw when it reconnects: resume there, missing nothing.
        raw = request.headers.get("Last-Event-ID") or q.get("from_revision", "")
        if raw and not raw.isdigit():
            raise _violation("from_revision", "must be a whole number")
        return svc.WatchJobsRequest(
            from_revision=min(int(raw or 0), 2**63 - 1),
            tenant=q.get("tenant", ""),
            job_set_id=q.get("job_set", ""),
            job_ids=q.getall("job_id", []),
            bookmark_interval_seconds=_BOOKMARK_S,
        )

    async def _events(self, request: web.Request) -> web.StreamResponse:
        req = self._watch_request(request)
        session = self._session(request)
        caller = self._caller(request, session, Method.WATCH_JOBS)
        if len(self._streams) >= self.cfg.max_event_streams:
            raise _Refused(
                errors.Unavailable(f"{len(self._streams)} live streams already open; the page polls instead")
            )
        stream = job_calls.watch_jobs(self.api.jobs, caller, req)
        try:
            first = await anext(stream)  # a bad filter or a compacted revision fails here, before any event
        except Exception as exc:
            raise _Refused(self.edge.failed(exc, Method.WATCH_JOBS, caller, self._peer(request))) from exc
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
                **_HEADERS,
            }
        )
        await response.prepare(request)
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            event: svc.JobEvent | None = first
            while event is not None:
                await response.write(self._frame(event))
                # the login may have ended (logout, expiry, token out of the policy) while the stream stayed open
                if self.sessions.get(session.id) is None:
                    break
                self._caller(request, session, Method.WATCH_JOBS)
                event = await anext(stream, None)
        except (ConnectionResetError, asyncio.CancelledError, _Refused):
            pass
        except Exception as exc:
            err = self.edge.failed(exc, Method.WATCH_JOBS, caller, self._peer(request))
            with contextlib.suppress(ConnectionResetError):
                await response.write(
                    b"event: error\ndata: " + orjson.dumps({"code": err.code.name, "message": err.message}) + b"\n\n"
                )
        finally:
            self._streams.discard(task)
            await stream.aclose()
        return response

    @staticmethod
    def _frame(event: svc.JobEvent) -> bytes:
        body = message_json(event)
        kind = b"bookmark" if event.type == svc.JOB_EVENT_TYPE_BOOKMARK else b"job"
        return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.revision, kind, orjson.dumps(body))
