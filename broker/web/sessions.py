"""Browser logins: a bearer token, checked by the broker's own authoriser, becomes an HttpOnly session cookie.

The token never reaches a URL or the page's JavaScript: the browser posts it once, the server keeps it
beside a random session id and checks it against the current policy on every request (a token taken out
of the policy ends its sessions at once). Each session carries a CSRF token the page sends back in a
header on every change (cancel, cordon); SameSite=Strict keeps the cookie off cross-site requests too.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

__all__ = ["COOKIE", "WebSession", "Sessions", "LoginThrottle"]

COOKIE = "tandem_session"


@dataclass(frozen=True, slots=True)
class WebSession:
    """One browser login (the cookie's id, the bearer token it stands for, its CSRF token); an agent's stream
    is a `broker.clusters.session.Session`."""

    id: str
    token: str
    csrf: str

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


class Sessions:
    """Live logins, each for `ttl_s`; past `max_sessions` the least recently used goes (an unbounded map
    is a memory leak a client with a token could grow)."""

    def __init__(self, ttl_s: float, max_sessions: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._live: TTLCache[str, WebSession] = TTLCache(maxsize=max_sessions, ttl=ttl_s, timer=clock)

    def open(self, token: str) -> WebSession:
        session = WebSession(secrets.token_urlsafe(32), token, secrets.token_urlsafe(32))
        self._live[session.id] = session
        return session

    def get(self, session_id: str | None) -> WebSession | None:
        if not session_id:
            return None
        return self._live.get(session_id)

    def close(self, session_id: str) -> None:
        self._live.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._live)


class LoginThrottle:
    """Failed logins per client address: at most `max_failures` in any `window_s`, so tokens cannot be
    guessed at speed."""

    def __init__(
        self,
        max_failures: int = 10,
        window_s: float = 60.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_failures
        self._window_s = window_s
        self._clock = clock
        self._failures: TTLCache[str, deque[float]] = TTLCache(maxsize=max_clients, ttl=window_s, timer=clock)

    def _recent(self, client: str) -> deque[float]:
        seen = self._failures.get(client)
        if seen is None:
            return deque()
        cutoff = self._clock() - self._window_s
        while seen and seen[0] <= cutoff:
            seen.popleft()
        return seen

    def retry_after_s(self, client: str) -> float:
        """0 when this client may try now; else seconds until its oldest failure leaves the window."""
        seen = self._recent(client)
        if len(seen) < self._max:
            return 0.0
        return max(seen[0] + self._window_s - self._clock(), 0.0)

    def failed(self, client: str) -> None:
        seen = self._recent(client)
        seen.append(self._clock())
        self._failures[client] = seen  # re-inserting restarts the entry's time to live
