"""Leader election on the agent Lease (FLEET-NOTES A-11) against the local API server (sim.kubeapi), with
hand-moved monotonic clocks.

The server is the real fake: one global resourceVersion, 409 Conflict on a stale resourceVersion, 409
AlreadyExists, Leases created on update, no-op updates that keep the resourceVersion, MicroTime with
exactly six fractional digits, RBAC loaded from manifests/base/agent-rbac.yaml (the candidates use the
tandem-agent ServiceAccount's tokens), and partitions: a dropped client's requests hang and are never
applied. Each candidate's KubeClient records what it sent (with its own clock) and can hold a request
before sending it.

Each candidate has its own VirtualClock: its monotonic time and its sleeps move only when the test moves
them, so a "20 s pause" is a clock that does not move while the other's does, then jumps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from extender import kube
from extender.agent.config import LeaseConfig
from extender.agent.lease import ACQUIRE_JITTER, LeaderElector, micro_time
from sim.kubeapi import KubeAPIServer, write_kubeconfig

NS, NAME = "tandem-system", "tandem-agent"
LEASE = kube.api_path("coordination.k8s.io", "v1", "leases", NS, NAME)
LEASES = kube.api_path("coordination.k8s.io", "v1", "leases", NS)
CONFIGMAPS = kube.api_path("", "v1", "configmaps", NS)
AGENT_RBAC = Path(__file__).resolve().parents[2] / "manifests" / "base" / "agent-rbac.yaml"
CONFIG = LeaseConfig()  # 15 s / 10 s / 2 s, kube-scheduler's timing
WALL0 = 1_750_000_000.0
TICK = 0.25
RETRY_MAX = CONFIG.retry_period_s * (1 + ACQUIRE_JITTER)
MICRO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
ABANDONED = -1  # the client gave up on the request (cancelled): no answer


# -- time ------------------------------------------------------------------------------------------


class VirtualClock:
    """A monotonic clock and its sleep: sleepers wake only when advance() moves the clock past them."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, asyncio.Future[None], asyncio.Task[Any] | None]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.now + max(0.0, delay), fut, asyncio.current_task())
        self._sleepers.append(entry)
        if delay <= 0:
            fut.set_result(None)
        try:
            await fut
        finally:
            self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for at, fut, _ in self._sleepers:
            if at <= self.now and not fut.done():
                fut.set_result(None)

    def parked(self) -> list[asyncio.Task[Any] | None]:
        """Tasks asleep on this clock (not yet woken)."""
        return [task for _, fut, task in self._sleepers if not fut.done()]


# -- clients -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Write:
    """One mutating request a client sent: method, path, the answer's status, the spec, the sender's clock."""

    method: str
    path: str
    status: int  # 200 for any success, the HTTP status of a refusal, 0 for the guard, ABANDONED
    spec: dict[str, Any]
    at: float


class RecordingClient(kube.KubeClient):
    """The agent's KubeClient (one attempt per request: no hidden retries) that records every write and can
    hold a request of a given method before it is sent."""

    def __init__(self, api: Any, clock: Callable[[], float], partitioned: Callable[[], bool]) -> None:
        super().__init__(api, retries=0)
        self.clock = clock
        self.partitioned = partitioned
        self.writes: list[Write] = []
        self.holds: dict[str, asyncio.Event] = {}
        self.held = 0
        self.doomed = 0  # requests in flight that were sent into a partition: they never get an answer

    async def request(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        hold = self.holds.pop(method, None)
        if hold is not None:
            self.held += 1
            try:
                await hold.wait()
            finally:
                self.held -= 1
        sent = self.clock()
        body = options.get("body")
        spec = dict((body or {}).get("spec") or {}) if isinstance(body, dict) else {}
        doomed = self.partitioned()
        self.doomed += doomed
        try:
            out = await super().request(method, path, **options)
        except kube.KubeError as e:
            self._note(method, path, e.status, spec, sent)
            raise
        except asyncio.CancelledError:
            self._note(method, path, ABANDONED, spec, sent)
            raise
        finally:
            self.doomed -= doomed
        self._note(method, path, 200, dict(out.get("spec") or {}), sent)
        return out

    def _note(self, method: str, path: str, status: int, spec: dict[str, Any], at: float) -> None:
        if method != "GET":
            self.writes.append(Write(method, path, status, spec, at))

    def lease_writes(self) -> list[Write]:
        return [w for w in self.writes if w.path.startswith(LEASES)]


@dataclasses.dataclass
class Cluster:
    """The API server, an admin client (kubectl's stand-in) and the partitions the test made."""

    server: KubeAPIServer
    admin: kube.KubeClient
    dropped: set[str] = dataclasses.field(default_factory=set)

    def drop_requests_from(self, token: str) -> None:
        self.dropped.add(token)
        self.server.drop_requests_from(token)

    def heal(self, token: str) -> None:
        self.dropped.discard(token)
        self.server.drop_requests_from(token, dropped=False)

    async def lease(self) -> dict[str, Any]:
        lease = await self.admin.get(LEASE)
        assert lease is not None
        return lease

    async def seed(self, spec: dict[str, Any]) -> None:
        """A Lease as another process left it."""
        await self.admin.create(
            LEASES,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": NAME, "namespace": NS},
                "spec": spec,
            },
        )


# -- candidates --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Candidate:
    """One replica: its token, clock, guarded client and elector; `events` records the callbacks as
    (kind, epoch, clock, writes sent so far)."""

    name: str
    token: str
    clock: VirtualClock
    client: RecordingClient
    cluster: Cluster
    elector: LeaderElector = dataclasses.field(init=False)
    events: list[tuple[str, int | None, float, int]] = dataclasses.field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def started(self, epoch: int) -> None:
        self.events.append(("start", epoch, self.clock(), len(self.client.writes)))

    def stopped(self) -> None:
        self.events.append(("stop", None, self.clock(), len(self.client.writes)))

    def at(self, kind: str, nth: int = 0) -> float:
        return [e[2] for e in self.events if e[0] == kind][nth]

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.elector.run())

    def settled(self) -> bool:
        """Nothing happens any more until the clock moves: the loop sleeps between attempts, or its
        request hangs in a partition while the deadline timer sleeps."""
        if self.task is None or self.task.done():
            return True
        parked = self.clock.parked()
        hung = self.token in self.cluster.dropped or self.client.doomed > 0
        return self.task in parked or (bool(parked) and hung)

    def last_write(self) -> float:
        """When the last Lease write that succeeded was sent (this candidate's clock)."""
        return max(w.at for w in self.client.lease_writes() if w.status == 200)

    def writes_since(self, t: float) -> list[tuple[str, int]]:
        return [(w.method, w.status) for w in self.client.lease_writes() if w.at > t]


async def until(condition: Callable[[], bool]) -> None:
    # The timeout guards against a hung test; it is not a timing assertion.
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.001)


async def settle(*cands: Candidate) -> None:
    await until(lambda: all(c.settled() for c in cands))


def one_writer(*cands: Candidate) -> None:
    writers = [c.name for c in cands if c.elector.may_write()]
    assert len(writers) <= 1, writers


async def drive(
    cands: Iterable[Candidate],
    seconds: float,
    *,
    stop: Callable[[], bool] | None = None,
    check: Callable[[], None] | None = None,
) -> float:
    """Move every candidate's clock TICK at a time, letting each settle; returns the seconds driven."""
    cands = list(cands)
    elapsed = 0.0
    while elapsed < seconds - 1e-9:
        for c in cands:
            c.clock.advance(TICK)
        await settle(*cands)
        elapsed += TICK
        if check is not None:
            check()
        if stop is not None and stop():
            break
    return elapsed


MakeClient = Callable[..., Awaitable[RecordingClient]]
MakeCandidate = Callable[..., Awaitable[Candidate]]


async def a_leads_b_follows(make: MakeCandidate) -> tuple[Candidate, Candidate]:
    """Candidate a starts alone and takes the Lease, then b joins; both run 4 s with at most one writer."""
    a, b = await make("a"), await make("b")
    a.start()
    await settle(a)
    b.start()
    await settle(a, b)
    await drive([a, b], 4, check=lambda: one_writer(a, b))
    return a, b


@pytest.fixture
async def server() -> AsyncIterator[KubeAPIServer]:
    srv = KubeAPIServer(rbac_paths=[AGENT_RBAC], seed=7)
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client_for(server: KubeAPIServer, tmp_path: Path) -> AsyncIterator[MakeClient]:
    """A RecordingClient for a new token: the agent's ServiceAccount by default, or an admin."""
    made: list[RecordingClient] = []

    async def factory(
        name: str, *, clock: Callable[[], float] = lambda: 0.0, admin: bool = False, token: str | None = None
    ) -> RecordingClient:
        if token is None:
            token = server.admin_token if admin else server.service_account_token(NS, "tandem-agent")
        path = tmp_path / f"kubeconfig-{name}"
        write_kubeconfig(path, server.url, token, namespace=NS)
        bearer = token
        client = RecordingClient(
            await kube.load_api_client(kubeconfig=str(path)), clock, lambda: bearer in server.state.dropped
        )
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
async def cluster(server: KubeAPIServer, client_for: MakeClient) -> Cluster:
    return Cluster(server, await client_for("kubectl", admin=True))


@pytest.fixture
async def make(server: KubeAPIServer, cluster: Cluster, client_for: MakeClient) -> AsyncIterator[MakeCandidate]:
    made: list[Candidate] = []

    async def factory(
        name: str, *, wall: Callable[[], float] | None = None, wall_skew_s: float = 0.0, rand: float = 0.5
    ) -> Candidate:
        clock = VirtualClock()
        token = server.service_account_token(NS, "tandem-agent")
        client = await client_for(name, clock=clock, token=token)
        cand = Candidate(name, token, clock, client, cluster)
        cand.elector = LeaderElector(
            client,
            CONFIG,
            f"{name}_{token[:6]}",
            clock=clock,
            wall=wall or (lambda: WALL0 + wall_skew_s + clock()),
            sleep=clock.sleep,
            rand=lambda: rand,
            on_start=cand.started,
            on_stop=cand.stopped,
        )
        client.guard = cand.elector.may_write  # as the agent installs it: the elector's own writes pass
        made.append(cand)
        return cand

    yield factory
    for token in list(cluster.dropped):
        cluster.heal(token)
    for c in made:
        if c.task is not None:
            c.task.cancel()
    for c in made:
        if c.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                async with asyncio.timeout(10):
                    await c.task


CONFIGMAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "reservation-x", "namespace": NS},
    "data": {"k": "v"},
}


# -- the tests -----------------------------------------------------------------------------------------


def test_micro_time_always_has_six_fractional_digits_in_utc() -> None:
    assert micro_time(1_700_000_000.0) == "2023-11-14T22:13:20.000000Z"
    assert micro_time(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"
    assert micro_time(0.000001) == "1970-01-01T00:00:00.000001Z"


async def test_two_candidates_exactly_one_leads_and_the_epoch_rises_on_takeover(
    make: MakeCandidate, cluster: Cluster
) -> None:
    a, b = await make("a"), await make("b")
    a.start()
    b.start()  # both find no Lease and race to create it: one create wins, the other gets AlreadyExists
    await settle(a, b)
    leader, follower = (a, b) if a.elector.is_leader else (b, a)
    assert leader.elector.is_leader and not follower.elector.is_leader
    assert leader.elector.epoch == 0 and follower.elector.epoch is None
    lease = await cluster.lease()
    assert lease["spec"]["holderIdentity"] == leader.elector.identity
    assert lease["spec"]["leaseTransitions"] == 0

    await drive([a, b], 30, check=lambda: one_writer(a, b))
    assert leader.elector.is_leader and follower.events == []
    renewals = [w for w in leader.client.lease_writes() if w.method == "PUT" and w.status == 200]
    assert len(renewals) >= 14  # every 2 s for 30 s
    assert follower.elector.holder == leader.elector.identity
    assert all(w.status == 409 for w in follower.client.lease_writes())  # at most its lost create race

    # The leader's process dies without releasing: the follower takes over only after the record has not
    # changed for leaseDurationSeconds on its own clock, with the next epoch.
    cluster.drop_requests_from(leader.token)
    last = leader.last_write()
    await drive([follower], 25, stop=lambda: follower.elector.is_leader)
    assert follower.elector.is_leader and follower.elector.epoch == 1
    took_over = follower.at("start")
    assert took_over - last > CONFIG.duration_s
    assert took_over - last <= CONFIG.duration_s + 2 * RETRY_MAX + TICK
    lease = await cluster.lease()
    assert lease["spec"]["holderIdentity"] == follower.elector.identity
    assert lease["spec"]["leaseTransitions"] == 1


async def test_a_partitioned_leader_steps_down_before_the_other_can_take_over(
    make: MakeCandidate, cluster: Cluster
) -> None:
    a, b = await a_leads_b_follows(make)
    assert a.elector.epoch == 0

    cluster.drop_requests_from(a.token)  # A's requests hang; it may still be connected to the broker
    await drive([a, b], 40, stop=lambda: b.elector.is_leader, check=lambda: one_writer(a, b))
    last = a.last_write()
    stepped_down, took_over = a.at("stop"), b.at("start")
    assert stepped_down <= last + CONFIG.renew_deadline_s  # the watchdog fires although the renew is stuck
    assert took_over - last > CONFIG.duration_s  # B waited for leaseDuration of unchanged record on its clock
    assert stepped_down < took_over
    assert b.elector.epoch == 1 and not a.elector.is_leader
    assert all(w.status == ABANDONED for w in a.client.lease_writes() if w.at > last)  # none was answered
    with pytest.raises(kube.NotLeader):
        await a.client.create(CONFIGMAPS, CONFIGMAP)

    # The partition heals: A's hung read is abandoned at its deadline (10 s), the next one sees B; A stays a
    # follower and sends no write at all.
    cluster.heal(a.token)
    healed = a.clock()
    await drive([a, b], CONFIG.renew_deadline_s + 2 * RETRY_MAX, check=lambda: one_writer(a, b))
    assert a.writes_since(healed) == []
    assert a.elector.holder == b.elector.identity and b.elector.is_leader


async def test_may_write_turns_false_at_the_deadline_while_the_renew_hangs(
    make: MakeCandidate, cluster: Cluster
) -> None:
    a = await make("a")
    await a.elector.step()
    assert a.elector.is_leader
    before = await cluster.lease()
    lost = asyncio.get_running_loop().create_task(a.elector.wait_lost())
    cluster.drop_requests_from(a.token)
    a.clock.advance(CONFIG.retry_period_s)
    renew = asyncio.get_running_loop().create_task(a.elector.step())
    await until(lambda: bool(a.clock.parked()))  # the renew is sent; its deadline timer sleeps
    assert a.elector.may_write()

    a.clock.advance(CONFIG.renew_deadline_s - CONFIG.retry_period_s + 0.5)  # 10.5 s after the last renew
    # The clock alone decides: no task has run since the jump, the renew request is still in flight.
    assert not a.elector.may_write() and not a.elector.is_leader
    assert not renew.done() and [e[0] for e in a.events] == ["start"]
    with pytest.raises(kube.NotLeader):
        await a.client.create(CONFIGMAPS, CONFIGMAP)

    async with asyncio.timeout(10):  # guard against a hang, not a timing assertion
        await renew  # the deadline timer fires: the stuck request is abandoned and the term ends
        await lost
    assert [e[0] for e in a.events] == ["start", "stop"]
    assert a.elector.epoch is None
    assert [(w.method, w.status) for w in a.client.lease_writes()] == [("POST", 200), ("PUT", ABANDONED)]
    cluster.heal(a.token)
    assert (await cluster.lease())["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # Back in touch: the record still names A, so it takes it again at once, as a new term.
    a.clock.advance(RETRY_MAX)
    await a.elector.step()
    assert a.elector.is_leader and a.elector.epoch == 1
    assert (await cluster.lease())["spec"]["leaseTransitions"] == 1


async def test_a_paused_leader_finds_it_lost_and_never_writes_after(make: MakeCandidate) -> None:
    a, b = await a_leads_b_follows(make)
    last = a.last_write()

    await drive([b], 20)  # A is paused (GC, SIGSTOP, a starved node): its clock and loop stand still
    assert b.elector.is_leader and b.elector.epoch == 1
    assert b.at("start") - last > CONFIG.duration_s

    a.clock.advance(20)  # A resumes: 20 s passed for it at once
    assert not a.elector.may_write()  # before its loop even runs
    await settle(a, b)
    assert [e[0] for e in a.events] == ["start", "stop"] and not a.elector.is_leader
    await drive([a, b], 8, check=lambda: one_writer(a, b))
    assert a.writes_since(last) == []
    assert a.elector.holder == b.elector.identity
    with pytest.raises(kube.NotLeader):
        await a.client.create(CONFIGMAPS, CONFIGMAP)


async def test_release_on_shutdown_hands_over_within_one_retry(make: MakeCandidate, cluster: Cluster) -> None:
    a, b = await make("a"), await make("b")
    a.start()
    await settle(a)
    b.start()
    await settle(a, b)
    await drive([a, b], 3)
    epoch = a.elector.epoch
    assert epoch == 0
    waiter = asyncio.get_running_loop().create_task(b.elector.wait_leading())

    assert a.task is not None
    a.task.cancel()  # SIGTERM: the agent cancels the elector's task
    async with asyncio.timeout(10):  # guard against a hang, not a timing assertion
        await asyncio.wait([a.task])
    assert a.task.cancelled()
    release = a.client.writes[-1]
    assert (release.method, release.status) == ("PUT", 200)
    assert a.events[-1][0] == "stop" and a.events[-1][3] == len(a.client.writes) - 1  # stepped down first
    lease = await cluster.lease()
    assert lease["spec"]["holderIdentity"] == "" and lease["spec"]["leaseDurationSeconds"] == 1
    assert lease["spec"]["leaseTransitions"] == epoch
    assert lease["spec"]["renewTime"] == lease["spec"]["acquireTime"] == micro_time(WALL0 + a.clock())
    assert await a.elector.release() is False  # what the agent calls after the task: nothing left to do
    assert a.client.writes[-1] is release

    elapsed = await drive([b], 15, stop=lambda: b.elector.is_leader)
    assert b.elector.is_leader
    assert elapsed <= RETRY_MAX + TICK  # one follower retry, not leaseDurationSeconds
    assert await waiter == epoch + 1


async def test_a_free_lease_is_taken_at_once_with_the_next_epoch(make: MakeCandidate, cluster: Cluster) -> None:
    await cluster.seed(
        {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "leaseTransitions": 7,
            "renewTime": micro_time(WALL0),
            "acquireTime": micro_time(WALL0),
        }
    )
    b = await make("b")
    await b.elector.step()
    assert b.elector.is_leader and b.elector.epoch == 8


@pytest.mark.parametrize(
    ("renew_offset_s", "wall_skew_s"),
    [(-365 * 86400.0, 0.0), (365 * 86400.0, 0.0), (0.0, -3600.0), (0.0, 30 * 86400.0)],
    ids=["renewTime-a-year-ago", "renewTime-a-year-ahead", "our-wall-an-hour-behind", "our-wall-a-month-ahead"],
)
async def test_wall_clock_skew_does_not_change_the_decision(
    make: MakeCandidate, cluster: Cluster, renew_offset_s: float, wall_skew_s: float
) -> None:
    await cluster.seed(
        {
            "holderIdentity": "ghost_1",
            "leaseDurationSeconds": 15,
            "leaseTransitions": 4,
            "renewTime": micro_time(WALL0 + renew_offset_s),
            "acquireTime": micro_time(WALL0 + renew_offset_s),
        }
    )
    b = await make("b", wall_skew_s=wall_skew_s)
    b.start()
    await settle(b)
    first_seen = b.clock()
    await drive([b], CONFIG.duration_s)
    assert not b.elector.is_leader and b.events == []  # not before 15 s of unchanged record on our clock
    await drive([b], 2 * RETRY_MAX, stop=lambda: b.elector.is_leader)
    assert b.elector.is_leader and b.elector.epoch == 5
    assert CONFIG.duration_s < b.at("start") - first_seen <= CONFIG.duration_s + RETRY_MAX + TICK


async def test_written_micro_times_have_six_digits_even_on_a_whole_second(
    make: MakeCandidate, cluster: Cluster
) -> None:
    clock_holder: list[VirtualClock] = []
    a = await make("a", wall=lambda: float(math.floor(WALL0 + clock_holder[0]())))
    clock_holder.append(a.clock)
    a.start()
    await settle(a)
    await drive([a], 6)
    writes = a.client.lease_writes()
    assert len(writes) >= 3 and all(w.status == 200 for w in writes)
    for w in writes:  # what the server stored and answered
        for field in ("acquireTime", "renewTime"):
            assert MICRO.match(w.spec[field]) and w.spec[field].endswith(".000000Z"), w.spec[field]

    # The server refuses what isoformat() writes, so the check above has teeth.
    lease = await cluster.lease()
    for bad in ("2025-06-15T15:06:40+00:00", "2025-06-15T15:06:40Z", "2025-06-15T15:06:40.5Z"):
        with pytest.raises(kube.KubeError) as refused:
            await cluster.admin.replace(LEASE, {**lease, "spec": {**lease["spec"], "renewTime": bad}})
        assert refused.value.status == 400


async def test_a_conflict_on_renew_after_someone_else_wrote_means_lost(make: MakeCandidate, cluster: Cluster) -> None:
    a = await make("a")
    a.start()
    await settle(a)
    await drive([a], 1)
    lease = await cluster.lease()
    now = micro_time(WALL0 + a.clock())
    spec = {
        "holderIdentity": "intruder_1",
        "leaseDurationSeconds": 15,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": lease["spec"]["leaseTransitions"] + 1,
    }
    await cluster.admin.replace(LEASE, {**lease, "spec": spec})
    taken = a.clock()

    await drive([a], 2)  # A's renew carries the old resourceVersion: 409, re-read, someone else holds it
    assert not a.elector.is_leader and [e[0] for e in a.events] == ["start", "stop"]
    assert a.writes_since(taken) == [("PUT", 409)]
    assert a.elector.holder == "intruder_1"

    await drive([a], 12)  # the intruder never renews, but 15 s have not passed on A's clock
    assert a.writes_since(taken) == [("PUT", 409)]
    await drive([a], 10, stop=lambda: a.elector.is_leader)
    assert a.elector.is_leader and a.elector.epoch == 2


async def test_a_conflict_on_renew_from_an_edit_that_keeps_us_the_holder_is_not_a_loss(
    make: MakeCandidate, cluster: Cluster
) -> None:
    a = await make("a")
    a.start()
    await settle(a)
    lease = await cluster.lease()
    await cluster.admin.replace(LEASE, {**lease, "metadata": {**lease["metadata"], "labels": {"team": "gpu-ops"}}})

    await drive([a], 2)
    assert a.elector.is_leader and a.elector.epoch == 0 and [e[0] for e in a.events] == ["start"]
    assert [(w.method, w.status) for w in a.client.lease_writes()][-2:] == [("PUT", 409), ("PUT", 200)]
    lease = await cluster.lease()
    assert lease["metadata"]["labels"] == {"team": "gpu-ops"} and lease["spec"]["leaseTransitions"] == 0


async def test_a_create_race_lost_with_already_exists_leaves_a_follower(make: MakeCandidate) -> None:
    a, b = await make("a"), await make("b")
    go = b.client.holds["POST"] = asyncio.Event()
    attempt = asyncio.get_running_loop().create_task(b.elector.step())
    await until(lambda: b.client.held == 1)  # B saw 404 and is about to create the Lease
    await a.elector.step()
    assert a.elector.is_leader and a.elector.epoch == 0
    go.set()
    await attempt
    assert not b.elector.is_leader and b.events == []
    assert [(w.method, w.status) for w in b.client.lease_writes()] == [("POST", 409)]
    b.clock.advance(RETRY_MAX)
    await b.elector.step()
    assert not b.elector.is_leader and b.elector.holder == a.elector.identity


async def test_a_deleted_lease_under_a_live_leader_is_not_recreated_by_a_follower(
    make: MakeCandidate, cluster: Cluster
) -> None:
    a, b = await make("a"), await make("b")
    await a.elector.step()
    await b.elector.step()
    await cluster.admin.delete(LEASE, propagation_policy="Background")

    b.clock.advance(RETRY_MAX)
    await b.elector.step()  # 404, but B has seen a holder: it does not create the Lease at once
    assert not b.elector.is_leader and b.client.lease_writes() == []
    a.clock.advance(CONFIG.retry_period_s)
    await a.elector.step()  # the live leader's renew re-creates it (create on update), same epoch
    assert a.elector.is_leader and a.elector.epoch == 0 and [e[0] for e in a.events] == ["start"]
    assert (await cluster.lease())["spec"]["holderIdentity"] == a.elector.identity
    b.clock.advance(RETRY_MAX)
    await b.elector.step()
    assert not b.elector.is_leader and b.elector.holder == a.elector.identity

    # Deleted again and the leader is really gone: B creates it once the absence lasted leaseDuration.
    await cluster.admin.delete(LEASE, propagation_policy="Background")
    cluster.drop_requests_from(a.token)
    b.clock.advance(RETRY_MAX)
    await b.elector.step()
    gone_since = b.clock()
    while not b.elector.is_leader:
        assert b.clock() - gone_since <= CONFIG.duration_s + RETRY_MAX
        b.clock.advance(RETRY_MAX)
        await b.elector.step()
    assert b.clock() - gone_since > CONFIG.duration_s and b.elector.epoch == 0


async def test_timing_and_identity_are_checked(client_for: MakeClient) -> None:
    client = await client_for("x")
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElector(client, LeaseConfig(renew_deadline_s=15.0), "x_1")
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElector(client, LeaseConfig(retry_period_s=9.0), "x_1")
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(client, CONFIG, "")


@pytest.mark.parametrize("rand", [0.0, 0.5, 1.0])
async def test_acquire_retries_are_jittered_by_up_to_a_fifth_and_renewals_are_not(
    make: MakeCandidate, cluster: Cluster, rand: float
) -> None:
    await cluster.seed(
        {
            "holderIdentity": "ghost_1",
            "leaseDurationSeconds": 15,
            "leaseTransitions": 0,
            "renewTime": micro_time(WALL0),
            "acquireTime": micro_time(WALL0),
        }
    )
    b = await make("b", rand=rand)
    assert await b.elector.step() == pytest.approx(CONFIG.retry_period_s * (1 + 0.2 * rand))
    a = await make("a", rand=rand)
    await cluster.admin.delete(LEASE, propagation_policy="Background")
    assert await a.elector.step() == CONFIG.retry_period_s  # A never saw a Lease: creates it, leads
    assert a.elector.is_leader
    a.clock.advance(CONFIG.retry_period_s)
    assert await a.elector.step() == CONFIG.retry_period_s


async def test_release_rereads_after_a_conflict_and_still_hands_over(make: MakeCandidate, cluster: Cluster) -> None:
    a = await make("a")
    await a.elector.step()
    lease = await cluster.lease()
    await cluster.admin.replace(LEASE, {**lease, "metadata": {**lease["metadata"], "labels": {"team": "gpu-ops"}}})
    assert await a.elector.release() is True
    assert [e[0] for e in a.events] == ["start", "stop"]
    assert [(w.method, w.status) for w in a.client.lease_writes()] == [("POST", 200), ("PUT", 409), ("PUT", 200)]
    lease = await cluster.lease()
    assert lease["spec"]["holderIdentity"] == "" and lease["metadata"]["labels"] == {"team": "gpu-ops"}
