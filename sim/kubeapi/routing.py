"""URL paths and methods to (resource, namespace, name, subresource, verb) as the real RequestInfoFactory does.

`/api/v1/namespaces/{ns}/{plural}[/{name}[/{sub}]]`, `/api/v1/{plural}[/{name}[/{sub}]]`, the
same under `/apis/{group}/{version}`, and the legacy `/watch/` prefix. GET of a collection is
`list` (`watch` with `?watch=`), DELETE of one is `deletecollection`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sim.kubeapi import errors
from sim.kubeapi.resources import ResourceType, by_path

__all__ = ["RequestInfo", "Route", "parse_route", "request_info"]

_TRUE = ("1", "true", "t", "yes", "y")


@dataclasses.dataclass(frozen=True)
class Route:
    rt: ResourceType
    verb: str
    namespace: str
    name: str
    subresource: str


def _verb(method: str, collection: bool, watch: bool, subresource: str) -> str:
    if method == "GET":
        if watch:
            return "watch"
        return "list" if collection else "get"
    if method == "POST":
        if collection or subresource in ("binding", "token"):
            return "create"
        raise errors.method_not_allowed()
    if method == "PUT" and not collection:
        return "update"
    if method == "PATCH" and not collection:
        return "patch"
    if method == "DELETE":
        return "deletecollection" if collection else "delete"
    raise errors.method_not_allowed()


def parse_route(method: str, group: str, version: str, rest: list[str], query: Mapping[str, str]) -> Route:
    """Resolve the part of the path after the group/version prefix; 404 or 405 as the real server answers."""
    watch = query.get("watch", "").lower() in _TRUE
    if rest and rest[0] == "watch":
        watch = True
        rest = rest[1:]
    if not rest:
        raise errors.path_not_found()
    namespace = ""
    rt: ResourceType | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        candidate = by_path(group, version, rest[2])
        if candidate is not None and candidate.namespaced:
            namespace, rt, tail = rest[1], candidate, rest[3:]
    if rt is None:
        rt = by_path(group, version, rest[0])
        tail = rest[1:]
        if rt is None:
            raise errors.path_not_found()
        if rt.namespaced and tail:
            raise errors.path_not_found()
        if rt.namespaced and method != "GET":
            raise errors.method_not_allowed()
    if len(tail) > 2:
        raise errors.path_not_found()
    name = tail[0] if tail else ""
    subresource = tail[1] if len(tail) > 1 else ""
    if subresource and subresource not in rt.subresources:
        raise errors.path_not_found()
    if watch and method == "GET" and subresource:
        raise errors.path_not_found()
    verb = _verb(method, not name, watch, subresource)
    allowed = set(rt.verbs)
    if verb not in allowed and not (subresource and verb in ("get", "update", "patch", "create")):
        raise errors.method_not_allowed()
    if subresource in ("binding", "token") and verb != "create":
        raise errors.method_not_allowed()
    if subresource == "status" and verb not in ("get", "update", "patch"):
        raise errors.method_not_allowed()
    return Route(rt, verb, namespace, name, subresource)


@dataclasses.dataclass(frozen=True)
class RequestInfo:
    """What the authorizer sees, parsed from the path alone (RequestInfoFactory), before any routing:
    so a request for a resource the server does not serve is still a 403 when it is not allowed."""

    verb: str
    namespace: str
    resource: str
    name: str
    subresource: str

    @property
    def label(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def request_info(method: str, rest: list[str], query: Mapping[str, str]) -> RequestInfo:
    watch = query.get("watch", "").lower() in _TRUE
    if rest and rest[0] == "watch":
        watch, rest = True, rest[1:]
    namespace = ""
    parts = rest
    if parts and parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0] if parts else ""
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method == "GET":
        verb = "watch" if watch else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = verbs.get(method, method.lower())
    return RequestInfo(verb, namespace, resource, name, subresource)
