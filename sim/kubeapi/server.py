"""`KubeAPIServer`: the HTTP edge of the fake (aiohttp on 127.0.0.1), authentication, authorization, faults.

Every request: bearer token → user (401 otherwise), partitioned clients hang, path → route
(404/405), injected faults, RBAC (403 with the real message), then the verb. Errors are
`kind: Status` bodies; warnings are `Warning: 299 - "..."` headers. Only JSON is served:
protobuf clients must accept JSON too (406 otherwise), server-side apply is 415.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from sim.kubeapi import discovery, errors, rbac
from sim.kubeapi.bootstrap import bootstrap
from sim.kubeapi.decoding import parse_json_body
from sim.kubeapi.deletion import Deleter
from sim.kubeapi.gc import Controllers
from sim.kubeapi.objects import Call, User
from sim.kubeapi.reads import Reader
from sim.kubeapi.resources import group_versions
from sim.kubeapi.routing import RequestInfo, Route, parse_route, request_info
from sim.kubeapi.state import ApiState, Fault
from sim.kubeapi.watch import WatchStream
from sim.kubeapi.writes import Writer

__all__ = ["KubeAPIServer"]

log = logging.getLogger("tandem.sim.kubeapi")

_PUBLIC = {"/healthz", "/livez", "/readyz"}
_SERVED = {(g, v) for g, vs in group_versions().items() for v in vs}
_MAX_BODY = 3 * 1024 * 1024 + 64 * 1024


def _acceptable(accept: str) -> bool:
    """True if the Accept header allows plain JSON (a Table or protobuf-only client is refused)."""
    if not accept.strip():
        return True
    for part in accept.split(","):
        media, *params = [p.strip() for p in part.split(";")]
        if media in ("*/*", "application/*"):
            return True
        if media == "application/json" and not any(p.startswith("as=") for p in params):
            return True
        if media == "application/json" and any(p == "as=APIGroupDiscoveryList" for p in params):
            continue
    return False


def _warning_header(text: str) -> str:
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class KubeAPIServer:
    """A Kubernetes API server for tests and the simulator; see the package docstring."""

    def __init__(
        self,
        *,
        rbac_paths: Sequence[Path] = (),
        event_window: int = 10_000,
        watch_delay_max_s: float = 0.1,
        bookmark_interval_s: float = 1.0,
        seed: int | None = None,
        server_version: str = "v1.36.0",
        page_size_cap: int | None = None,
    ) -> None:
        self._rbac_paths = [Path(p) for p in rbac_paths]
        self._watch_delay_max_s = watch_delay_max_s
        self._bookmark_interval_s = bookmark_interval_s
        self._server_version = server_version
        self.state = ApiState(event_window=event_window, seed=seed, page_size_cap=page_size_cap)
        self._reader = Reader(self.state)
        self._writer = Writer(self.state)
        self._deleter = Deleter(self.state)
        self._controllers = Controllers(self.state, self._deleter)
        self._runner: web.AppRunner | None = None
        self._watches: set[WatchStream] = set()
        self.url = ""
        self.admin_token = self.state.new_token()
        self.add_token(self.admin_token, "kubernetes-admin", ["system:masters"])

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        bootstrap(self.state, self._writer, rbac.load_manifests(self._rbac_paths))
        self._controllers.start()
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"

    async def stop(self) -> None:
        self.state.stopping.set()
        for watch in list(self._watches):
            watch.close()
        await self._controllers.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- identities, faults, partitions --------------------------------------------------

    def add_token(self, token: str, username: str, groups: Sequence[str] = ()) -> None:
        self.state.users[token] = User.of(username, groups, token)

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token of system:serviceaccount:<ns>:<name> (the account object need not exist)."""
        return self.state.mint_service_account_token(namespace, name)

    def inject_fault(
        self,
        verb: str,
        resource: str,
        *,
        status: int,
        retry_after_s: int | None = None,
        count: int = 1,
        namespace: str | None = None,
    ) -> None:
        """The next `count` requests with this verb on this resource ("pods", "pods/status", "*") fail."""
        self.state.faults.append(Fault(verb, resource, status, retry_after_s, count, namespace))

    def drop_requests_from(self, token: str, dropped: bool = True) -> None:
        """Partition a client: its new requests hang unanswered (until it gives up) and are never applied;
        its open watches deliver nothing until the partition ends, then resume where they were."""
        if dropped:
            self.state.dropped.add(token)
        else:
            self.state.dropped.discard(token)
        self.state.partition_changed.set()

    # -- HTTP -----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        call_warnings: list[str] = []
        try:
            return await self._serve(request, call_warnings)
        except errors.ApiError as e:
            return self._respond(e.code, e.status(), call_warnings, e.headers)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the edge turns every unexpected failure into a 500 Status
            log.exception("request failed", extra={"path": request.path})
            err = errors.internal_error(repr(e))
            return self._respond(500, err.status(), call_warnings)

    def _respond(
        self, code: int, body: Any, warnings: list[str], headers: dict[str, str] | None = None
    ) -> web.Response:
        out: CIMultiDict[str] = CIMultiDict(headers or {})
        for text in warnings:
            out.add("Warning", _warning_header(text))
        return web.Response(status=code, body=orjson.dumps(body), content_type="application/json", headers=out)

    async def _serve(self, request: web.Request, warnings: list[str]) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in _PUBLIC and request.method == "GET":
            return web.Response(text="ok", content_type="text/plain")
        user = self.state.authenticate(request.headers.get("Authorization"))
        if user.token in self.state.dropped:
            await self.state.stopping.wait()  # a partitioned client never hears back
            raise errors.ApiError(503, "ServiceUnavailable", "the server is shutting down")
        if not _acceptable(request.headers.get("Accept", "")):
            raise errors.not_acceptable()
        parts = [p for p in path.split("/") if p]
        query = {k: v for k, v in request.query.items()}
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return self._non_resource(request, user, path, parts, warnings)
        if not rest:
            return self._non_resource(request, user, path, parts, warnings)
        info = request_info(request.method, rest, query)
        fault = self.state.take_fault(info.verb, info.label, info.namespace)
        if fault is not None:
            raise fault
        self._authorize(user, group, info)
        if (group, version) not in _SERVED:
            raise errors.path_not_found()
        route = parse_route(request.method, group, version, rest, query)
        if route.verb == "watch" and route.name:
            query["fieldSelector"] = ",".join(filter(None, [query.get("fieldSelector"), f"metadata.name={route.name}"]))
        body = await request.read() if request.method in ("POST", "PUT", "PATCH", "DELETE") else b""
        call = Call(
            route.verb,
            group,
            version,
            route.rt.plural,
            route.namespace,
            route.name,
            route.subresource,
            query,
            body,
            request.headers.get("Content-Type", ""),
            user,
            warnings,
        )
        if route.verb == "watch":
            return await self._watch(request, call, route)
        code, obj = self._dispatch(call, route)
        return self._respond(code, obj, warnings)

    def _authorize(self, user: User, group: str, info: RequestInfo) -> None:
        attrs = rbac.Attributes(info.verb, group, info.resource, info.subresource, info.namespace, info.name)
        decision = self.state.authorizer.authorize(user, attrs)
        if not decision.allowed:
            name = info.name if info.verb not in ("list", "watch", "deletecollection") else ""
            raise errors.forbidden(group, info.resource, name, rbac.forbidden_reason(user, attrs, decision))

    def _non_resource(
        self, request: web.Request, user: User, path: str, parts: list[str], warnings: list[str]
    ) -> web.Response:
        decision = self.state.authorizer.authorize(user, rbac.Attributes(request.method.lower(), path=path))
        if not decision.allowed:
            raise errors.ApiError(
                403,
                "Forbidden",
                "forbidden: "
                + rbac.forbidden_reason(user, rbac.Attributes(request.method.lower(), path=path), decision),
                details={},
            )
        if request.method != "GET":
            raise errors.method_not_allowed()
        body: dict[str, Any] | None = None
        if path == "/version":
            body = discovery.version_info(self._server_version)
        elif parts == ["api"]:
            body = discovery.api_versions(self.url.removeprefix("http://"))
        elif parts == ["apis"]:
            body = discovery.api_group_list()
        elif len(parts) == 2 and parts[0] == "apis":
            body = discovery.api_group(parts[1])
        elif len(parts) == 2 and parts[0] == "api":
            body = discovery.resource_list("", parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            body = discovery.resource_list(parts[1], parts[2])
        if body is None:
            raise errors.path_not_found()
        return self._respond(200, body, warnings)

    def _dispatch(self, call: Call, route: Route) -> tuple[int, dict[str, Any]]:
        rt = route.rt
        if call.verb in ("create", "update", "patch", "delete") and call.query.get("dryRun") not in (None, "All"):
            raise errors.bad_request(f'dryRun: Unsupported value: "{call.query["dryRun"]}": supported values: "All"')
        if call.verb == "get":
            return self._reader.get(call, rt)
        if call.verb == "list":
            return self._reader.list(call, rt)
        if call.verb == "create":
            if route.subresource == "binding":
                return self._writer.bind(call, rt)
            if route.subresource == "token":
                return self._writer.token_request(call, rt)
            if rt.kind == "SelfSubjectAccessReview":
                body = parse_json_body(call.body)
                if not isinstance(body, dict):
                    raise errors.bad_request("a SelfSubjectAccessReview must be a JSON object")
                return 201, rbac.self_subject_access_review(self.state.authorizer, call.user, body)
            return self._writer.create(call, rt)
        if call.verb == "update":
            return self._writer.update(call, rt)
        if call.verb == "patch":
            return self._writer.patch(call, rt)
        if call.verb == "delete":
            return self._deleter.delete(call, rt)
        if call.verb == "deletecollection":
            return self._deleter.delete_collection(call, rt)
        raise errors.method_not_allowed()

    async def _watch(self, request: web.Request, call: Call, route: Route) -> web.StreamResponse:
        stream = WatchStream(
            self.state,
            call,
            route.rt,
            delay_max_s=self._watch_delay_max_s,
            bookmark_interval_s=self._bookmark_interval_s,
        )
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        self._watches.add(stream)
        try:
            await response.prepare(request)

            async def write(line: bytes) -> None:
                await response.write(line)

            try:
                await stream.run(write)
            except (ConnectionResetError, ConnectionError):
                return response
            await response.write_eof()
        finally:
            self._watches.discard(stream)
        return response
