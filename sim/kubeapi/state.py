"""Everything one fake API server holds: store, users, RBAC, randomness, faults and partitions."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import random
import string
import uuid
from collections.abc import Callable

from sim.kubeapi import errors
from sim.kubeapi.defaults import ServiceIPs
from sim.kubeapi.objects import User
from sim.kubeapi.rbac import Authorizer
from sim.kubeapi.store import Store

__all__ = ["ApiState", "Fault"]

_NAME_CHARS = string.ascii_lowercase + string.digits


@dataclasses.dataclass
class Fault:
    """The next `remaining` requests matching verb/resource/namespace fail with `status`."""

    verb: str
    resource: str
    status: int
    retry_after_s: int | None
    remaining: int
    namespace: str | None

    def matches(self, verb: str, resource: str, namespace: str) -> bool:
        return (
            self.remaining > 0
            and self.verb in ("*", verb)
            and self.resource in ("*", resource)
            and (self.namespace is None or self.namespace == namespace)
        )


class ApiState:
    """Shared by the HTTP layer, the verb handlers and the in-process controllers (GC, quota)."""

    def __init__(
        self,
        *,
        event_window: int,
        seed: int | None,
        page_size_cap: int | None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.store = Store(event_window)
        self.rng = random.Random(seed)
        self.authorizer = Authorizer(self.store)
        self.page_size_cap = page_size_cap
        self.service_ips = ServiceIPs(self.rng)
        self.users: dict[str, User] = {}
        self.faults: list[Fault] = []
        self.dropped: set[str] = set()
        self.partition_changed = asyncio.Event()
        self.stopping = asyncio.Event()
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))

    def now(self) -> dt.datetime:
        return self._clock()

    def new_uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def random_suffix(self, n: int = 5) -> str:
        return "".join(self.rng.choice(_NAME_CHARS) for _ in range(n))

    def new_token(self) -> str:
        return "".join(self.rng.choice(string.ascii_letters + string.digits) for _ in range(43))

    def mint_service_account_token(self, namespace: str, name: str) -> str:
        token = self.new_token()
        self.users[token] = User.of(
            f"system:serviceaccount:{namespace}:{name}",
            ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            token,
        )
        return token

    def authenticate(self, header: str | None) -> User:
        if not header or not header.startswith("Bearer "):
            raise errors.unauthorized()
        user = self.users.get(header[len("Bearer ") :].strip())
        if user is None:
            raise errors.unauthorized()
        return user

    def take_fault(self, verb: str, resource: str, namespace: str) -> errors.ApiError | None:
        for fault in self.faults:
            if fault.matches(verb, resource, namespace):
                fault.remaining -= 1
                return errors.injected(fault.status, fault.retry_after_s)
        self.faults = [f for f in self.faults if f.remaining > 0]
        return None

    async def wait_reachable(self, token: str) -> None:
        """Block while the token's client is partitioned away (returns at once if it is not)."""
        while token in self.dropped and not self.stopping.is_set():
            self.partition_changed.clear()
            waiter = asyncio.ensure_future(self.partition_changed.wait())
            stopper = asyncio.ensure_future(self.stopping.wait())
            try:
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()
