"""The kube shell's errors, retry backoff and REST paths, shared by the watch and the writes (no Kubernetes client)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import aiohttp
import orjson

from extender.errors import ExtenderError

__all__ = ["Backoff", "KubeError", "NotLeader", "ResourceVersionTooOld", "api_path", "error_from_reply"]


class KubeError(ExtenderError):
    """A kube API call failed; ``status`` is the HTTP status (0 when the stream itself was bad)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class ResourceVersionTooOld(KubeError):
    """The resourceVersion we resume from is too old (HTTP 410 or an ERROR event with code 410): relist."""


@dataclasses.dataclass
class Backoff:
    """Capped exponential backoff with equal jitter: delay n is in [d/2, d], d = min(cap, base * 2**n)."""

    base_s: float
    cap_s: float
    rand: Callable[[], float] = random.random
    failures: int = 0

    def next_delay(self) -> float:
        d = min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return d / 2 + self.rand() * d / 2

    def reset(self) -> None:
        self.failures = 0


async def error_from_reply(resp: aiohttp.ClientResponse) -> KubeError:
    """Turn a non-200 reply into a KubeError carrying the Status message; 410 becomes ResourceVersionTooOld."""
    try:
        body = await resp.read()
        status = orjson.loads(body)
        message = str(status.get("message", "")) if isinstance(status, dict) else ""
    except (ValueError, aiohttp.ClientError):
        message = ""
    finally:
        resp.release()
    message = message or (resp.reason or "")
    cls = ResourceVersionTooOld if resp.status == 410 else KubeError
    return cls(resp.status, message)


def api_path(
    group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None, sub: str | None = None
) -> str:
    """REST path of a collection or object: `/api/v1/...` for the core group, `/apis/<g>/<v>/...` else."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
        if sub:
            path += f"/{sub}"
    return path


class NotLeader(KubeError):
    """A mutating call was refused by the leader guard: this replica is not (or no longer) the leader."""

    def __init__(self) -> None:
        super().__init__(0, "not the leader: mutating calls are refused")
