"""Leader election for the cluster agent on the Lease `tandem-system/tandem-agent` (FLEET-NOTES A-11).

Our own, not `kubernetes.aio.leaderelection`: that one measures the renew deadline on the wall clock,
writes local time with a "Z", never increments `leaseTransitions` (the broker's epoch, A-12), cannot
release, returns from `run()` once leadership is lost, and lets writes run on past the renew deadline.

Rules, as client-go's LeaderElector except where marked:
* Expiry is judged on the LOCAL MONOTONIC clock only: a record held by another expires when it has not
  changed (holderIdentity, renewTime, resourceVersion) for its own `leaseDurationSeconds` since this
  candidate first saw it as it is (measured from when the GET answered, the late end). `renewTime` is
  written for humans and never compared with our wall clock, so clock skew cannot change a decision.
  An empty holderIdentity (a released Lease) can be taken at once.
* Every write is a PUT carrying the observed resourceVersion; the server's 409 makes takeovers atomic.
* Epoch = `leaseTransitions`. A create starts at 0 (client-go's value); every takeover writes the observed
  value + 1, renewals and the release keep it. Only one conditional write can succeed from one observed
  record, so two terms never share an epoch and each new term's epoch is higher than every earlier one's.
  Unlike client-go, re-taking a record that still names us after we stepped down also adds 1: every term
  gets its own epoch, so the broker can always tell the new stream from the old one. (If someone deletes
  the Lease the count restarts at 0; see the deletion rule below.)
* The leader's deadline runs from when its last successful renew was SENT (the early end): it stops at
  `sent + renew_deadline` (10 s), others may take over at the earliest `seen + leaseDuration` (15 s)
  with `seen` after the server applied that write. `may_write()` is pure clock arithmetic, so it turns
  False on time even while a renew request hangs; a watchdog on the injected sleep ends the term
  (callbacks, events) at the same moment.
* Release on shutdown (client-go's ReleaseOnCancel, including its choice to CLEAR holderIdentity):
  leaseDurationSeconds 1, renewTime and acquireTime now, holderIdentity "". An empty holder is free at
  once, so a rolling update hands over within one follower retry (about 2 s), not 15 s.
* Deviation: a candidate that has seen the Lease and then finds it gone (404) waits `duration_s` of
  unchanged absence before creating it, instead of creating at once: a live leader's next renew
  re-creates it (Leases are created on update), so deleting the Lease does not give us two leaders.
  A candidate that never saw the Lease (first start) creates it at once, as client-go does.
* Jitter: acquire retries wait retry_period * (1 + 0.2 * rand), i.e. up to +20 % (client-go's
  JitterFactor 1.2 means up to +120 %, which would stretch the 2 s handover to 4.4 s). Renewals run
  every retry period, without jitter.

The elector's own Lease writes bypass `KubeClient.guard` (`mutating=False`), so the agent can install
`client.guard = elector.may_write` on the client it shares with the elector. Lease-based election is
not fencing (A-11): a write that passed the guard may still land late; the broker's epoch (A-12) and
idempotent, deterministically named writes (A-9) cover that.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from extender.agent.config import LeaseConfig
from extender.kube import KubeClient, KubeError, api_path

__all__ = ["ACQUIRE_JITTER", "LeaderElector", "micro_time"]

log = logging.getLogger("tandem.agent.lease")

GROUP, VERSION, PLURAL = "coordination.k8s.io", "v1", "leases"
ACQUIRE_JITTER = 0.2
"""Acquire retries wait retry_period * (1 + ACQUIRE_JITTER * rand)."""

_T = TypeVar("_T")
_Key = tuple[str, str, str]
_ABSENT: _Key = ("", "", "")  # what "observed" holds while the Lease does not exist


def micro_time(t: float) -> str:
    """A wall-clock instant as MicroTime: always six fractional digits (the server parses exactly six;
    `isoformat()` drops the fraction when microsecond == 0 and the write is refused)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Lost(Exception):
    """The Lease names someone else, or is gone: our term is over."""


class _TimedOut(Exception):
    """A request outlived its monotonic deadline and was abandoned."""


def _spec(obj: dict[str, Any] | None) -> dict[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def _holder(obj: dict[str, Any] | None) -> str:
    return str(_spec(obj).get("holderIdentity") or "")


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class LeaderElector:
    """One candidate for the agent Lease. `run()` is the loop; the agent reads `is_leader` / `may_write()`
    and follows terms with `wait_leading()` (returns the term's epoch) and `wait_lost()`: the agent's
    leader work is a task started after `wait_leading()` and cancelled when `wait_lost()` returns. The
    optional `on_start(epoch)` / `on_stop()` callbacks run synchronously at the transition itself, before
    any waiter wakes (e.g. to close the broker stream without a scheduling delay); they must not block."""

    def __init__(
        self,
        client: KubeClient,
        config: LeaseConfig,
        identity: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        on_start: Callable[[int], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        if not identity:
            raise ValueError("a Lease candidate needs a non-empty identity")
        retry, deadline, duration = config.retry_period_s, config.renew_deadline_s, config.duration_s
        if not 0 < retry * (1 + ACQUIRE_JITTER) < deadline < duration:
            raise ValueError(
                f"lease timing must satisfy 0 < retry_period*{1 + ACQUIRE_JITTER} < renew_deadline "
                f"< duration, got {retry}, {deadline}, {duration}"
            )
        self.identity = identity
        self._client = client
        self._config = config
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._rand = rand
        self._on_start = on_start
        self._on_stop = on_stop
        self._path = api_path(GROUP, VERSION, PLURAL, config.namespace, config.name)
        self._collection = api_path(GROUP, VERSION, PLURAL, config.namespace)
        self._duration_field = max(1, math.ceil(duration))
        self._leading = False
        self._epoch: int | None = None
        self._acquire_time = ""
        self._last_renew = -math.inf  # monotonic time the last successful write was sent
        self._record: dict[str, Any] | None = None  # the Lease as last read or written
        self._observed: _Key | None = None
        self._observed_at = -math.inf
        self._seen_lease = False
        self._changed = asyncio.Event()

    # -- what the agent reads ------------------------------------------------------------------

    def may_write(self) -> bool:
        """The KubeClient guard: leading and within renew_deadline of the last successful renew, by the
        monotonic clock alone (so it turns False on time even while the renew loop is stuck)."""
        return self._leading and self._clock() <= self._last_renew + self._config.renew_deadline_s

    @property
    def is_leader(self) -> bool:
        """Same test as `may_write()`."""
        return self.may_write()

    @property
    def epoch(self) -> int | None:
        """`leaseTransitions` of the current term (None while not leading): the broker keeps the highest."""
        return self._epoch if self._leading else None

    @property
    def holder(self) -> str:
        """holderIdentity as last seen ("" when free or unknown)."""
        return _holder(self._record)

    async def wait_leading(self) -> int:
        """Wait until this replica leads; the term's epoch."""
        while not self._leading or self._epoch is None:
            await self._changed.wait()
        return self._epoch

    async def wait_lost(self, epoch: int | None = None) -> None:
        """Wait until the term with `epoch` (default: the current one) is over; at once if it already is."""
        if epoch is None:
            epoch = self._epoch
        while self._leading and self._epoch == epoch:
            await self._changed.wait()

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Acquire, lead while renewing, step down, retry: forever. On cancellation it steps down and
        releases the Lease if it still names us, then re-raises."""
        try:
            while True:
                await self._sleep(await self.step())
        finally:
            await self.release()

    async def step(self) -> float:
        """One attempt (renew while leading, else acquire); returns the delay before the next one."""
        if self._leading:
            await self._renew()
        else:
            await self._try_acquire()
        if self._leading:
            # Wake at the deadline at the latest, so a failing leader steps down on time.
            return max(0.0, min(self._config.retry_period_s, self._deadline() - self._clock()))
        return self._config.retry_period_s * (1 + ACQUIRE_JITTER * self._rand())

    async def release(self) -> bool:
        """Step down, then hand the Lease over if it still names us: holder "", duration 1 s. True when
        the release was written."""
        self._end_term("releasing the Lease")
        until = self._clock() + self._config.renew_deadline_s
        try:
            for _ in range(2):
                if _holder(self._record) != self.identity:
                    return False  # not ours (someone else's, already released, never seen): nothing to do
                now = micro_time(self._wall())
                spec = {
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": _int(_spec(self._record).get("leaseTransitions"), 0),
                }
                try:
                    self._observe(await self._bounded(self._put(spec), until))
                except KubeError as e:
                    if e.status != 409:
                        raise
                    self._observe(await self._bounded(self._client.get(self._path), until))
                    continue  # re-check with the fresh record (a renew of ours may have landed meanwhile)
                log.info("released the Lease", extra={"detail": {"identity": self.identity}})
                return True
        except (KubeError, ValueError, _TimedOut) as e:
            log.warning("release failed", extra={"error": repr(e)})
        return False

    # -- acquire -------------------------------------------------------------------------------

    async def _try_acquire(self) -> None:
        try:
            await self._acquire_once()
        except KubeError as e:
            if e.status == 409:  # AlreadyExists on create, Conflict on takeover: someone else was faster
                log.info("lost the race for the Lease", extra={"detail": {"identity": self.identity}})
            else:
                log.warning("acquire failed", extra={"error": str(e)})
        except (ValueError, _TimedOut) as e:
            log.warning("acquire failed", extra={"error": repr(e)})

    async def _acquire_once(self) -> None:
        """GET; CREATE when absent (epoch 0), take over when free or expired (observed epoch + 1)."""
        deadline_s = self._config.renew_deadline_s
        current = await self._bounded(self._client.get(self._path), self._clock() + deadline_s)
        self._observe(current)
        if current is None:
            if not self._may_create():
                return
            epoch, previous = 0, ""
        else:
            previous = _holder(current)
            if previous and previous != self.identity and not self._expired(current):
                return
            epoch = _int(_spec(current).get("leaseTransitions"), 0) + 1
        sent = self._clock()
        now = micro_time(self._wall())
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._duration_field,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": epoch,
        }
        if current is None:
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Lease",
                "metadata": {"name": self._config.name, "namespace": self._config.namespace},
                "spec": spec,
            }
            write = self._client.request(
                "POST", self._collection, body=body, query=self._client.write_query(), mutating=False
            )
        else:
            write = self._put(spec)
        written = await self._bounded(write, sent + deadline_s)
        self._begin_term(epoch, sent, written, previous=previous)

    def _may_create(self) -> bool:
        # A Lease that disappeared under running candidates may still have a live leader, whose next
        # renew re-creates it: wait out one lease duration of unchanged absence first.
        return not self._seen_lease or self._clock() - self._observed_at > self._config.duration_s

    def _expired(self, current: dict[str, Any]) -> bool:
        duration = _int(_spec(current).get("leaseDurationSeconds"), 0)
        limit = float(duration) if duration > 0 else self._config.duration_s
        return self._clock() - self._observed_at > limit

    # -- lead ----------------------------------------------------------------------------------

    def _deadline(self) -> float:
        return self._last_renew + self._config.renew_deadline_s

    async def _renew(self) -> None:
        deadline = self._deadline()
        if self._clock() >= deadline:
            self._end_term("renew deadline passed")
            return
        try:
            await self._bounded(self._renew_once(), deadline)
        except _Lost as e:
            self._end_term(f"lost the Lease: {e}")
        except _TimedOut:
            self._end_term("renew deadline passed while renewing")
        except (KubeError, ValueError) as e:
            log.warning(
                "renew failed",
                extra={"error": repr(e), "detail": {"deadline_in_s": round(deadline - self._clock(), 3)}},
            )

    async def _renew_once(self) -> None:
        for _ in range(2):
            sent = self._clock()
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._duration_field,
                "acquireTime": self._acquire_time,
                "renewTime": micro_time(self._wall()),
                "leaseTransitions": self._epoch,
            }
            try:
                written = await self._put(spec)
            except KubeError as e:
                if e.status == 404:
                    raise _Lost("the Lease is gone") from e
                if e.status != 409:
                    raise
                current = await self._client.get(self._path)
                self._observe(current)
                if _holder(current) != self.identity:
                    raise _Lost(f"now held by {_holder(current) or 'nobody'!r}") from e
                continue  # still ours (someone edited it): retry once with the fresh resourceVersion
            self._observe(written)
            self._last_renew = sent
            return
        raise KubeError(409, "renew kept conflicting")

    # -- terms ---------------------------------------------------------------------------------

    def _begin_term(self, epoch: int, sent: float, written: dict[str, Any], *, previous: str) -> None:
        self._observe(written)
        self._leading = True
        self._epoch = epoch
        self._last_renew = sent
        self._acquire_time = str(_spec(written).get("acquireTime") or micro_time(self._wall()))
        log.info("became leader", extra={"detail": {"identity": self.identity, "epoch": epoch, "previous": previous}})
        self._notify(self._on_start, epoch)

    def _end_term(self, reason: str) -> None:
        if not self._leading:
            return
        self._leading = False
        log.warning(
            "stepped down", extra={"detail": {"identity": self.identity, "epoch": self._epoch, "reason": reason}}
        )
        self._notify(self._on_stop, None)

    def _notify(self, callback: Callable[..., None] | None, epoch: int | None) -> None:
        if callback is not None:
            try:
                if epoch is None:
                    callback()
                else:
                    callback(epoch)
            except Exception:
                log.exception("leadership callback failed")
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    # -- plumbing ------------------------------------------------------------------------------

    def _observe(self, obj: dict[str, Any] | None) -> None:
        """Note the record as read or written; a change restarts the expiry measurement."""
        if obj is None:
            key = _ABSENT
        else:
            meta = obj.get("metadata") or {}
            key = (_holder(obj), str(_spec(obj).get("renewTime") or ""), str(meta.get("resourceVersion") or ""))
            self._seen_lease = True
        if key != self._observed:
            if key[0] != (self._observed or _ABSENT)[0]:
                log.info("lease holder", extra={"detail": {"holder": key[0], "identity": self.identity}})
            self._observed = key
            self._observed_at = self._clock()
        self._record = obj

    async def _put(self, spec: dict[str, Any]) -> dict[str, Any]:
        """PUT our spec over the observed record, conditional on its resourceVersion."""
        meta = (self._record or {}).get("metadata") or {}
        metadata = {k: meta[k] for k in ("name", "namespace", "resourceVersion", "labels", "annotations") if k in meta}
        metadata.setdefault("name", self._config.name)
        metadata.setdefault("namespace", self._config.namespace)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Lease", "metadata": metadata, "spec": spec}
        return await self._client.request(
            "PUT", self._path, body=body, query=self._client.write_query(), mutating=False
        )

    async def _bounded(self, aw: Awaitable[_T], until: float) -> _T:
        """Await `aw` until the monotonic time `until` (measured with the injected sleep); past it the
        request is abandoned (cancelled) and _TimedOut raised."""
        task = asyncio.ensure_future(aw)
        timer = asyncio.ensure_future(self._sleep(max(0.0, until - self._clock())))
        try:
            await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            timer.cancel()
            raise
        timer.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.wait((task,))  # the request is really abandoned before we go on
        if not task.cancelled():
            task.exception()  # finished just as the cancel landed: too late to count (and retrieved)
        raise _TimedOut(f"no answer within {self._config.renew_deadline_s} s")
