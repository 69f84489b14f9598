"""Store contract tests: submit/idempotency, CAS transitions, outbox, watch, pagination, cancel, retention."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

import pytest

from broker.domain import errors, job_events, lifecycle
from broker.domain.errors import Code
from broker.domain.records import (
    AttemptRecord,
    JobFilter,
    OrderKind,
    OrderSpec,
    ReplicaRecord,
    Transition,
    WatchPage,
)
from broker.domain.states import AttemptOutcome, JobState
from broker.store.migrations import LATEST, MIGRATIONS
from broker.store.sqlite import SqliteStore
from fleetplan.catalog import ReplicaPlacement
from tests.broker.store_builders import (  # noqa: F401
    FakeClock,
    clock,
    file_store,
    id_gen,
    new_job,
    pg_server,
    sqlite_only,
    store,
)

S = JobState


async def _reserve(s: SqliteStore, job_id: str, attempt: int = 0, cluster: str = "c1", model: str = "H100") -> None:
    _, r = await s.apply_event(
        job_events.Reserve(
            job_id,
            attempt,
            cluster,
            ("z1", "r1"),
            (ReplicaPlacement("w", 0, "n1"), ReplicaPlacement("w", 1, "n2")),
            model,
            16.0,
            expires_at=None,
        )
    )
    assert r.transition is not None


async def _run(s: SqliteStore, job_id: str, attempt: int = 1) -> None:
    for ev in (
        job_events.DispatchSent(job_id, attempt),
        job_events.DispatchAccepted(job_id, attempt, "ns1"),
        job_events.WorkloadReady(job_id, attempt),
        job_events.AllRunning(job_id, attempt),
    ):
        _, r = await s.apply_event(ev)
        assert r.transition is not None, ev


# -- submission ------------------------------------------------------------------------------------


async def test_submit_writes_queued_job_with_event(store: SqliteStore, clock: FakeClock) -> None:
    r = await store.submit(new_job(key="k1", labels={"team": "a"}))
    assert r.created
    j = r.job
    assert (j.job_id, j.state, j.attempt, j.create_time) == ("job-00001", S.QUEUED, 0, clock())
    assert await store.get_job(j.job_id) == j
    events = await store.watch_events(0)
    assert [(e.revision, e.job_id, e.from_state, e.to_state, e.reason) for e in events] == [
        (j.revision, j.job_id, None, S.QUEUED, "Submitted")
    ]


async def test_submission_records_its_actor(store: SqliteStore) -> None:
    import dataclasses

    j = (await store.submit(dataclasses.replace(new_job(key="k"), actor="tenant/alice"))).job
    [ev] = await store.job_history(j.job_id)
    assert ev.actor == "tenant/alice"
    again = await store.submit(dataclasses.replace(new_job(key="k"), actor="tenant/bob"))
    assert not again.created  # the actor is not part of the request's identity


async def test_same_key_same_body_returns_original_job(store: SqliteStore) -> None:
    first = await store.submit(new_job(key="k1"))
    again = await store.submit(new_job(key="k1"))
    assert not again.created
    assert again.job == first.job
    assert len(await store.watch_events(0)) == 1
    assert len((await store.list_jobs(JobFilter())).jobs) == 1


async def test_same_key_other_body_is_conflict(store: SqliteStore) -> None:
    first = await store.submit(new_job(key="k1", gpus=8))
    with pytest.raises(errors.IdempotencyConflict) as ei:
        await store.submit(new_job(key="k1", gpus=16))
    assert ei.value.code is Code.ALREADY_EXISTS
    assert ei.value.meta("job_id") == first.job.job_id
    assert ei.value.details.reason == "IDEMPOTENCY_KEY_REUSED"


async def test_keys_are_scoped_per_tenant(store: SqliteStore) -> None:
    a = await store.submit(new_job("t1", key="k"))
    b = await store.submit(new_job("t2", key="k"))
    assert a.created and b.created and a.job.job_id != b.job.job_id


# -- group commit ----------------------------------------------------------------------------------


class _Blocker:
    """Occupies the store's writer (thread or task) until released, so requests queue up behind it."""

    def __init__(self, s: SqliteStore) -> None:
        self.store = s
        if isinstance(s, SqliteStore):
            self._gate, self._entered = threading.Event(), threading.Event()

            def hold(_: sqlite3.Connection) -> None:
                self._entered.set()
                self._gate.wait(10)

            self.done = asyncio.ensure_future(s.committer.call(hold))
        else:
            self._agate, self._aentered = asyncio.Event(), asyncio.Event()

            async def ahold(_: object) -> None:
                self._aentered.set()
                await self._agate.wait()

            self.done = asyncio.ensure_future(s._write(ahold))  # type: ignore[attr-defined]

    async def entered(self) -> None:
        if isinstance(self.store, SqliteStore):
            await asyncio.get_running_loop().run_in_executor(None, self._entered.wait, 10)
        else:
            await self._aentered.wait()

    async def release(self) -> None:
        await asyncio.sleep(0)  # let every queued task enqueue first
        if isinstance(self.store, SqliteStore):
            self._gate.set()
        else:
            self._agate.set()
        await self.done


def _stats(s: SqliteStore) -> Any:
    return s.committer.stats if isinstance(s, SqliteStore) else s.stats  # type: ignore[attr-defined]


def _set_fault(s: SqliteStore, fault: Any) -> None:
    if isinstance(s, SqliteStore):
        s.committer.fault = fault
    else:
        s.fault = fault  # type: ignore[attr-defined]


async def test_waiting_submissions_share_one_transaction(store: SqliteStore) -> None:
    blocker = _Blocker(store)
    await blocker.entered()
    before = _stats(store).batches
    tasks = [asyncio.ensure_future(store.submit(new_job(key=f"k{i}"))) for i in range(50)]
    await blocker.release()
    results = await asyncio.gather(*tasks)
    assert all(r.created for r in results)
    assert _stats(store).batches - before == 2  # the blocker's batch + one batch of 50
    assert _stats(store).sizes[50] == 1


async def test_failed_commit_fails_every_member_and_keeps_nothing(store: SqliteStore) -> None:
    blocker = _Blocker(store)
    await blocker.entered()
    _set_fault(store, lambda size: OSError("disk I/O error") if size == 5 else None)
    tasks = [asyncio.ensure_future(store.submit(new_job(key=f"k{i}"))) for i in range(5)]
    await blocker.release()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    _set_fault(store, None)
    assert all(isinstance(o, errors.BatchFailed) for o in outcomes)
    assert all(o.code is Code.UNAVAILABLE and o.retryable for o in outcomes if isinstance(o, errors.TandemError))
    assert (await store.list_jobs(JobFilter())).jobs == ()
    retried = await asyncio.gather(*(store.submit(new_job(key=f"k{i}")) for i in range(5)))
    assert all(r.created for r in retried)


async def test_one_members_error_does_not_sink_the_batch(store: SqliteStore) -> None:
    await store.submit(new_job(key="dup", gpus=1))
    blocker = _Blocker(store)
    await blocker.entered()
    good1 = asyncio.ensure_future(store.submit(new_job(key="g1")))
    bad = asyncio.ensure_future(store.submit(new_job(key="dup", gpus=2)))
    good2 = asyncio.ensure_future(store.submit(new_job(key="g2")))
    cas = asyncio.ensure_future(store.transition(Transition("nope", S.QUEUED, 0, S.RESERVED, reason="x")))
    await blocker.release()
    assert (await good1).created and (await good2).created
    with pytest.raises(errors.IdempotencyConflict):
        await bad
    with pytest.raises(errors.JobNotFound):
        await cas
    assert len((await store.list_jobs(JobFilter())).jobs) == 3


async def test_unexpected_error_in_a_savepoint_free_request_fails_the_whole_batch(store: SqliteStore) -> None:
    sqlite_only(store)
    blocker = _Blocker(store)
    await blocker.entered()

    def half_write(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO meta (key, value) VALUES ('half', 1)")
        raise RuntimeError("bug after a write")

    good = asyncio.ensure_future(store.submit(new_job(key="g")))
    bad = asyncio.ensure_future(store.committer.call(half_write, savepoint=False))
    await blocker.release()
    outcomes = await asyncio.gather(good, bad, return_exceptions=True)
    assert all(isinstance(o, errors.BatchFailed) for o in outcomes)
    assert (await store.list_jobs(JobFilter())).jobs == ()
    assert await store.committer.call(lambda c: c.execute("SELECT * FROM meta WHERE key='half'").fetchall()) == []


async def test_closed_store_is_unavailable(clock: FakeClock) -> None:
    s = SqliteStore(clock=clock)
    await s.open()
    await s.close()
    with pytest.raises(errors.StoreUnavailable) as ei:
        await s.submit(new_job())
    assert ei.value.code is Code.UNAVAILABLE


# -- transitions -----------------------------------------------------------------------------------


async def test_reserve_persists_attempt_event_and_dispatch_order_together(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    rev0 = await store.current_revision()
    await _reserve(store, j.job_id)
    job = await store.get_job(j.job_id)
    assert (job.state, job.attempt, job.revision) == (S.RESERVED, 1, rev0 + 1)
    [a] = await store.list_attempts(j.job_id)
    assert (a.number, a.cluster, a.domain, a.gpu_model, a.gpus, a.outcome) == (
        1,
        "c1",
        ("z1", "r1"),
        "H100",
        16.0,
        None,
    )
    assert a.assignments == (ReplicaPlacement("w", 0, "n1"), ReplicaPlacement("w", 1, "n2"))
    [o] = await store.pending_orders("c1")
    assert (o.job_id, o.attempt, o.kind) == (j.job_id, 1, OrderKind.DISPATCH)
    [res] = await store.active_attempts()
    assert (res.job_id, res.number, j.tenant, res.cluster) == (j.job_id, 1, "t1", "c1")


async def test_cas_refuses_stale_state_or_attempt(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    await _reserve(store, j.job_id)
    stale = Transition(j.job_id, S.QUEUED, 0, S.RESERVED, reason="Placed")
    with pytest.raises(errors.StaleTransition) as ei:
        await store.transition(stale)
    assert ei.value.code is Code.ABORTED
    with pytest.raises(errors.StaleTransition):
        await store.transition(Transition(j.job_id, S.RESERVED, 7, S.DISPATCHED, reason="x"))
    ok = await store.transition(Transition(j.job_id, S.RESERVED, 1, S.DISPATCHED, reason="DispatchSent"))
    assert ok.state is S.DISPATCHED


async def test_concurrent_cas_has_exactly_one_winner(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    attempts = [
        Transition(
            j.job_id,
            S.QUEUED,
            0,
            S.RESERVED,
            reason="Placed",
            new_attempt=AttemptRecord(j.job_id, 1, f"c{i}", (), (), "H100", 8.0, 0.0),
        )
        for i in range(20)
    ]
    results = await asyncio.gather(*(store.transition(t) for t in attempts), return_exceptions=True)
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, errors.StaleTransition) for r in results if isinstance(r, BaseException))
    assert len(await store.list_attempts(j.job_id)) == 1
    assert len(await store.job_history(j.job_id)) == 2


async def test_edges_outside_the_table_are_refused(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    with pytest.raises(errors.InvalidTransition) as ei:
        await store.transition(Transition(j.job_id, S.QUEUED, 0, S.RUNNING, reason="x"))
    assert ei.value.code is Code.FAILED_PRECONDITION
    assert (await store.get_job(j.job_id)).state is S.QUEUED


async def test_unknown_job_is_not_found(store: SqliteStore) -> None:
    with pytest.raises(errors.JobNotFound) as ei:
        await store.get_job("nope")
    assert ei.value.code is Code.NOT_FOUND


async def test_other_tenant_sees_not_found(store: SqliteStore) -> None:
    j = (await store.submit(new_job("t1"))).job
    with pytest.raises(errors.JobNotFound):
        await store.get_job(j.job_id, tenant="t2")
    with pytest.raises(errors.JobNotFound):
        await store.cancel_job(j.job_id, tenant="t2", actor="tenant/x")
    assert (await store.get_job(j.job_id, tenant="t1")).state is S.QUEUED


async def test_full_lifecycle_records_attempt_times(store: SqliteStore, clock: FakeClock) -> None:
    j = (await store.submit(new_job())).job
    await _reserve(store, j.job_id)
    clock.advance(5)
    await _run(store, j.job_id)
    clock.advance(100)
    job, r = await store.apply_event(job_events.AttemptEnded(j.job_id, 1, AttemptOutcome.SUCCEEDED))
    assert job.state is S.SUCCEEDED and job.end_time == clock()
    [a] = await store.list_attempts(j.job_id)
    assert a.outcome is AttemptOutcome.SUCCEEDED and a.namespace == "ns1"
    assert a.dispatch_time == a.accept_time == a.start_time == a.running_time == clock() - 100
    assert [o.kind for o in await store.pending_orders("c1")] == [OrderKind.DISPATCH, OrderKind.START]
    history = [(e.from_state, e.to_state) for e in await store.job_history(j.job_id)]
    assert history == [
        (None, S.QUEUED),
        (S.QUEUED, S.RESERVED),
        (S.RESERVED, S.DISPATCHED),
        (S.DISPATCHED, S.ACCEPTED),
        (S.ACCEPTED, S.STARTING),
        (S.STARTING, S.RUNNING),
        (S.RUNNING, S.SUCCEEDED),
    ]
    assert await store.active_attempts() == []


async def test_stale_attempt_messages_are_ignored(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    await _reserve(store, j.job_id)
    await store.apply_event(job_events.DispatchRejected(j.job_id, 1, "DOES_NOT_FIT", "no room", ("n1",)))
    await _reserve(store, j.job_id, attempt=1, cluster="c2")
    job, r = await store.apply_event(job_events.AttemptEnded(j.job_id, 1, AttemptOutcome.APP_FAILED, exit_code=3))
    assert r.ignored is lifecycle.IgnoreReason.STALE_ATTEMPT
    assert (job.state, job.attempt) == (S.RESERVED, 2)
    a1, a2 = await store.list_attempts(j.job_id)
    assert (a1.outcome, a1.rejection_reason, a1.rejection_nodes) == (AttemptOutcome.REJECTED, "DOES_NOT_FIT", ("n1",))
    assert a2.outcome is None and a2.cluster == "c2"


async def test_infra_failure_backs_off_and_spends_budget(store: SqliteStore, clock: FakeClock) -> None:
    j = (await store.submit(new_job(max_infra_retries=1))).job
    await _reserve(store, j.job_id)
    await _run(store, j.job_id)
    job, _ = await store.apply_event(
        job_events.AttemptEnded(j.job_id, 1, AttemptOutcome.INFRA_FAILED, message="node down")
    )
    assert (job.state, job.infra_retries, job.not_before) == (S.QUEUED, 1, clock() + 10.0)
    await _reserve(store, j.job_id, attempt=1)
    await _run(store, j.job_id, attempt=2)
    job, _ = await store.apply_event(job_events.AttemptEnded(j.job_id, 2, AttemptOutcome.GANG_TIMEOUT))
    assert (job.state, job.infra_retries, job.reason) == (S.FAILED, 2, "RetryBudgetSpent")


# -- cancel ----------------------------------------------------------------------------------------


async def test_cancel_queued_is_immediate(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    out = await store.cancel_job(j.job_id, tenant="t1", actor="tenant/alice", message="bye")
    assert out.state is S.CANCELLED and out.end_time is not None
    [ev] = (await store.job_history(j.job_id))[1:]
    assert (ev.actor, ev.message, ev.reason) == ("tenant/alice", "bye", "Cancelled")
    again = await store.cancel_job(j.job_id, tenant="t1", actor="tenant/alice")
    assert again.revision == out.revision  # idempotent


async def test_cancel_running_waits_for_cluster_confirmation(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    await _reserve(store, j.job_id)
    await _run(store, j.job_id)
    out = await store.cancel_job(j.job_id, tenant="t1", actor="tenant/a", grace_s=45)
    assert out.state is S.CANCELLING
    cancel = (await store.pending_orders("c1"))[-1]
    assert (cancel.kind, cancel.attempt, cancel.grace_s) == (OrderKind.CANCEL, 1, 45)
    job, _ = await store.apply_event(job_events.ClusterSilent(j.job_id, 1))
    assert job.state is S.CANCELLING  # kept across a disconnect
    job, _ = await store.apply_event(job_events.AttemptEnded(j.job_id, 1, AttemptOutcome.INFRA_FAILED))
    assert job.state is S.CANCELLED
    [a] = await store.list_attempts(j.job_id)
    assert a.outcome is AttemptOutcome.CANCELLED


async def test_cancel_finished_job_fails_precondition(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    await _reserve(store, j.job_id)
    await _run(store, j.job_id)
    await store.apply_event(job_events.AttemptEnded(j.job_id, 1, AttemptOutcome.SUCCEEDED))
    with pytest.raises(errors.JobFinished) as ei:
        await store.cancel_job(j.job_id, tenant=None, actor="admin/root")
    assert ei.value.code is Code.FAILED_PRECONDITION


async def test_cancel_job_set(store: SqliteStore) -> None:
    a = (await store.submit(new_job(job_set="run1"))).job
    b = (await store.submit(new_job(job_set="run1"))).job
    other = (await store.submit(new_job(job_set="run2"))).job
    foreign = (await store.submit(new_job("t2", job_set="run1"))).job
    await _reserve(store, b.job_id)
    await _run(store, b.job_id)
    changed = await store.cancel_job_set("t1", "run1", actor="tenant/a")
    assert {(j.job_id, j.state) for j in changed} == {(a.job_id, S.CANCELLED), (b.job_id, S.CANCELLING)}
    assert (await store.get_job(other.job_id)).state is S.QUEUED
    assert (await store.get_job(foreign.job_id)).state is S.QUEUED


# -- outbox ----------------------------------------------------------------------------------------


async def test_orders_are_acked_per_cluster(store: SqliteStore) -> None:
    for _ in range(3):
        j = (await store.submit(new_job())).job
        await _reserve(store, j.job_id)
    orders = await store.pending_orders("c1")
    assert [o.order_id for o in orders] == sorted(o.order_id for o in orders) and len(orders) == 3
    assert await store.ack_orders("c2", [orders[0].order_id]) == 0  # another cluster's ack is ignored
    assert await store.ack_orders("c1", [orders[0].order_id, orders[1].order_id]) == 2
    assert [o.order_id for o in await store.pending_orders("c1")] == [orders[2].order_id]
    assert await store.pending_orders("c1", after=orders[2].order_id) == []


async def test_transition_with_explicit_orders(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    t = Transition(
        j.job_id,
        S.QUEUED,
        0,
        S.RESERVED,
        reason="Placed",
        new_attempt=AttemptRecord(j.job_id, 1, "c9", (), (), "A100", 1.0, 0.0),
        orders=(OrderSpec(OrderKind.DISPATCH, "c9"),),
    )
    await store.transition(t)
    [o] = await store.pending_orders("c9")
    assert (o.attempt, o.kind) == (1, OrderKind.DISPATCH)
    bad = Transition(
        j.job_id,
        S.RESERVED,
        1,
        S.QUEUED,
        reason="x",
        new_attempt=AttemptRecord(j.job_id, 5, "c9", (), (), "A100", 1.0, 0.0),
    )
    with pytest.raises(errors.InvalidTransition):
        await store.transition(bad)


# -- watch -----------------------------------------------------------------------------------------


async def test_watch_resumes_from_a_revision(store: SqliteStore) -> None:
    a = (await store.submit(new_job("t1", job_set="s"))).job
    b = (await store.submit(new_job("t2"))).job
    await _reserve(store, a.job_id)
    events = await store.watch_events(0)
    revs = [e.revision for e in events]
    assert revs == sorted(revs) and len(set(revs)) == 3
    assert revs[-1] == await store.current_revision()
    assert [e.job_id for e in await store.watch_events(revs[0])] == [b.job_id, a.job_id]
    assert [e.job_id for e in await store.watch_events(0, tenant="t2")] == [b.job_id]
    assert [e.to_state for e in await store.watch_events(0, job_set="s")] == [S.QUEUED, S.RESERVED]
    assert len(await store.watch_events(0, limit=2)) == 2


async def test_wait_for_revision_wakes_on_commit(store: SqliteStore) -> None:
    rev = await store.current_revision()
    waiter = asyncio.ensure_future(store.wait_for_revision(rev, timeout_s=30))
    await asyncio.sleep(0)
    assert not waiter.done()
    j = (await store.submit(new_job())).job
    assert await asyncio.wait_for(waiter, 10) == j.revision
    assert await store.wait_for_revision(j.revision, timeout_s=0.01) == j.revision


async def test_filtered_watch_page_advances_past_other_tenants(store: SqliteStore) -> None:
    mine = (await store.submit(new_job("t1"))).job
    others = [(await store.submit(new_job("t2"))).job for _ in range(3)]
    page = await store.watch_page(0, tenant="t1")
    assert [e.job_id for e in page.events] == [mine.job_id]
    assert page.revision == others[-1].revision == await store.current_revision()
    empty = await store.watch_page(page.revision, tenant="t1")
    assert (empty.events, empty.revision) == ((), page.revision)
    full = await store.watch_page(0, limit=2)
    assert len(full.events) == 2 and full.revision == full.events[-1].revision  # a full page resumes at its end


async def test_watch_follows_own_events_and_skips_others_without_spinning(store: SqliteStore) -> None:
    start = await store.current_revision()
    pages: list[WatchPage] = []
    calls = 0
    real_page = store.watch_page

    async def counting_page(*a: Any, **kw: Any) -> WatchPage:
        nonlocal calls
        calls += 1
        return await real_page(*a, **kw)

    store.watch_page = counting_page  # type: ignore[method-assign]

    async def follow() -> None:
        # Until the cancellation shows: the submit and the cancel may arrive in one page or in two,
        # depending on whether the watcher read between the two commits.
        async for page in store.watch(start, tenant="t1", bookmark_s=30):
            pages.append(page)
            if any(e.to_state is S.CANCELLED for e in page.events):
                return

    task = asyncio.ensure_future(follow())
    await asyncio.sleep(0)
    for _ in range(5):
        await store.submit(new_job("t2"))  # another tenant's commits wake the watcher but yield nothing
    mine = (await store.submit(new_job("t1"))).job
    await store.cancel_job(mine.job_id, tenant="t1", actor="tenant/a")
    await asyncio.wait_for(task, 10)
    events = [e for p in pages for e in p.events]
    assert [(e.job_id, e.to_state) for e in events] == [(mine.job_id, S.QUEUED), (mine.job_id, S.CANCELLED)]
    assert all(e.tenant == "t1" for e in events)
    assert calls <= 2 * 7 + 2  # at most a read or two per commit (7 commits), never a busy loop


async def test_watch_yields_bookmarks_when_idle(store: SqliteStore) -> None:
    rev = await store.current_revision()
    agen = store.watch(rev, bookmark_s=0.05)
    page = await asyncio.wait_for(agen.__anext__(), 10)
    assert (page.events, page.revision) == ((), rev)
    await agen.aclose()


async def test_waiting_does_not_spin_on_its_own_reads(store: SqliteStore) -> None:
    sqlite_only(store)
    rev = await store.current_revision()
    before = store.committer.stats.batches
    assert await store.wait_for_revision(rev, timeout_s=0.2) == rev
    assert store.committer.stats.batches - before <= 2  # reads do not count as commits that wake waiters


async def test_many_waiters_all_wake_on_one_commit(store: SqliteStore) -> None:
    rev = await store.current_revision()
    waiters = [asyncio.ensure_future(store.wait_for_revision(rev, timeout_s=30)) for _ in range(20)]
    await asyncio.sleep(0)
    j = (await store.submit(new_job())).job
    assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [j.revision] * 20


# -- retention -------------------------------------------------------------------------------------


async def test_compaction_deletes_old_finished_jobs_and_marks_revision(store: SqliteStore, clock: FakeClock) -> None:
    old = (await store.submit(new_job(key="old"))).job
    await store.cancel_job(old.job_id, tenant=None, actor="admin")
    live = (await store.submit(new_job(key="live"))).job
    clock.advance(3600)
    recent = (await store.submit(new_job(key="recent"))).job
    await store.cancel_job(recent.job_id, tenant=None, actor="admin")
    result = await store.compact(finished_before=clock() - 60)
    assert result.deleted_jobs == 1 and result.deleted_events == 2
    assert result.compacted_revision == 2 == await store.compacted_revision()
    with pytest.raises(errors.JobNotFound):
        await store.get_job(old.job_id)
    assert (await store.get_job(live.job_id)).state is S.QUEUED
    with pytest.raises(errors.RevisionCompacted) as ei:
        await store.watch_events(1)
    assert ei.value.code is Code.OUT_OF_RANGE and ei.value.compacted_revision == 2
    assert {e.job_id for e in await store.watch_events(2)} == {live.job_id, recent.job_id}
    # the key went with its job: a new submission under it is a new job
    again = await store.submit(new_job(key="old"))
    assert again.created and again.job.job_id != old.job_id
    assert again.job.revision > result.compacted_revision


async def test_revisions_stay_monotonic_after_compacting_the_newest(store: SqliteStore, clock: FakeClock) -> None:
    j = (await store.submit(new_job())).job
    done = await store.cancel_job(j.job_id, tenant=None, actor="admin")
    clock.advance(10)
    r = await store.compact(finished_before=clock())
    assert r.compacted_revision == done.revision
    nxt = (await store.submit(new_job())).job
    assert nxt.revision == done.revision + 1 and nxt.seq == j.seq + 1


async def test_compaction_is_bounded_per_call(store: SqliteStore, clock: FakeClock) -> None:
    for _ in range(5):
        j = (await store.submit(new_job())).job
        await store.cancel_job(j.job_id, tenant=None, actor="admin")
        clock.advance(1)
    first = await store.compact(finished_before=clock(), limit=3)
    second = await store.compact(finished_before=clock(), limit=3)
    assert (first.deleted_jobs, second.deleted_jobs) == (3, 2)
    assert second.compacted_revision > first.compacted_revision
    assert (await store.list_jobs(JobFilter())).jobs == ()


# -- listing ---------------------------------------------------------------------------------------


async def test_list_pages_with_filters(store: SqliteStore) -> None:
    made = []
    for i in range(7):
        made.append(
            (
                await store.submit(
                    new_job(
                        "t1" if i % 2 == 0 else "t2",
                        queue="q1" if i < 4 else "q2",
                        job_set=f"s{i % 3}",
                        labels={"team": "a" if i < 5 else "b", "i": str(i)},
                    )
                )
            ).job
        )
    flt = JobFilter(tenant="t1")
    page1 = await store.list_jobs(flt, page_size=2)
    page2 = await store.list_jobs(flt, page_size=2, page_token=page1.next_page_token)
    assert [j.job_id for j in page1.jobs + page2.jobs] == [made[i].job_id for i in (0, 2, 4, 6)]
    assert page2.next_page_token == ""
    cases = [
        (JobFilter(queue="q2"), [4, 5, 6]),
        (JobFilter(job_set="s1"), [1, 4]),
        (JobFilter(labels=(("team", "b"),)), [5, 6]),
        (JobFilter(tenant="t1", labels=(("team", "a"), ("i", "4"))), [4]),
        (JobFilter(states=frozenset({S.CANCELLED})), []),
        (JobFilter(states=frozenset({S.QUEUED, S.CANCELLED}), queue="q1"), [0, 1, 2, 3]),
    ]
    assert len((await store.list_jobs(JobFilter(), page_size=-3)).jobs) == 7  # non-positive = default size
    for f, want in cases:
        got = (await store.list_jobs(f, page_size=100)).jobs
        assert [j.job_id for j in got] == [made[i].job_id for i in want], f


async def test_list_filters_by_current_attempt_cluster_and_gpu_model(store: SqliteStore) -> None:
    moved = (await store.submit(new_job())).job  # attempt 1 on c1 (H100), rejected; current attempt 2 on c2 (A100)
    await _reserve(store, moved.job_id, cluster="c1", model="H100")
    await store.apply_event(job_events.DispatchRejected(moved.job_id, 1, "DOES_NOT_FIT", "no room", ("n1",)))
    await _reserve(store, moved.job_id, attempt=1, cluster="c2", model="A100")
    on_c1 = (await store.submit(new_job())).job  # current attempt 1 on c1 (H100), accepts any model
    await _reserve(store, on_c1.job_id, cluster="c1", model="H100")
    listed = (await store.submit(new_job(models=("H100", "A100")))).job  # no attempt, spec lists two models
    anything = (await store.submit(new_job())).job  # no attempt, accepts any model: matches no model filter
    l4 = (await store.submit(new_job("t2", models=("L4",)))).job
    await _reserve(store, l4.job_id, cluster="c2", model="L4")
    assert (await store.get_job(moved.job_id)).attempt == 2  # type: ignore[union-attr]
    cases = [
        (JobFilter(cluster="c1"), [on_c1]),  # `moved` was on c1 only in an earlier attempt
        (JobFilter(cluster="c2"), [moved, l4]),
        (JobFilter(cluster="c3"), []),
        (JobFilter(gpu_model="H100"), [on_c1, listed]),  # `moved` got H100 only in an earlier attempt
        (JobFilter(gpu_model="A100"), [moved, listed]),
        (JobFilter(gpu_model="L4"), [l4]),
        (JobFilter(gpu_model="H10"), []),  # whole names only, not substrings of the stored JSON
        (JobFilter(gpu_model="B200"), []),
        (JobFilter(cluster="c2", gpu_model="A100"), [moved]),
        (JobFilter(tenant="t2", cluster="c2"), [l4]),
        (JobFilter(cluster="c1", gpu_model="A100"), []),
        (JobFilter(states=frozenset({S.QUEUED}), gpu_model="A100"), [listed]),
    ]
    for f, want in cases:
        got = (await store.list_jobs(f, page_size=100)).jobs
        assert [j.job_id for j in got] == [j.job_id for j in want], f
    assert anything.job_id not in {j.job_id for j in (await store.list_jobs(JobFilter(gpu_model="H100"))).jobs}
    flt = JobFilter(cluster="c2")
    page1 = await store.list_jobs(flt, page_size=1)
    page2 = await store.list_jobs(flt, page_size=1, page_token=page1.next_page_token)
    assert [j.job_id for j in page1.jobs + page2.jobs] == [moved.job_id, l4.job_id] and page2.next_page_token == ""
    for other in (JobFilter(cluster="c1"), JobFilter(), JobFilter(cluster="c2", gpu_model="A100")):
        with pytest.raises(errors.InvalidPageToken):
            await store.list_jobs(other, page_size=1, page_token=page1.next_page_token)
    by_model = (await store.list_jobs(JobFilter(gpu_model="H100"), page_size=1)).next_page_token
    assert by_model
    for other in (JobFilter(gpu_model="A100"), JobFilter(cluster="H100")):
        with pytest.raises(errors.InvalidPageToken):
            await store.list_jobs(other, page_size=1, page_token=by_model)


async def test_tampered_or_foreign_page_tokens_are_invalid_argument(store: SqliteStore) -> None:
    for _ in range(3):
        await store.submit(new_job())
    page = await store.list_jobs(JobFilter(tenant="t1"), page_size=1)
    token = page.next_page_token
    forged = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    for bad, flt in (
        (forged, JobFilter(tenant="t1")),
        ("garbage!", JobFilter(tenant="t1")),
        (token, JobFilter(tenant="t2")),  # from here: a real token, used with another filter
        (token, JobFilter(tenant="t1", cluster="c1")),
        (token, JobFilter(tenant="t1", gpu_model="H100")),
    ):
        with pytest.raises(errors.InvalidPageToken) as ei:
            await store.list_jobs(flt, page_size=1, page_token=bad)
        assert ei.value.code is Code.INVALID_ARGUMENT


# -- schema ----------------------------------------------------------------------------------------


async def test_schema_is_migrated_once_and_newer_schemas_refused(tmp_path, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "s.db")
    async with SqliteStore(path, clock=clock) as s:
        assert s.schema_version == LATEST
        await s.submit(new_job(key="k"))
    async with SqliteStore(path, clock=clock) as s:
        assert (await s.submit(new_job(key="k"))).created is False
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(v,) for v, _ in MIGRATIONS]
    conn.execute("INSERT INTO schema_version VALUES (99, 0)")
    conn.commit()
    conn.close()
    with pytest.raises(errors.StoreUnavailable):
        await SqliteStore(path, clock=clock).open()


async def test_reservations_and_orders_survive_reopen(tmp_path, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "s.db")
    async with SqliteStore(path, clock=clock, id_gen=id_gen()) as s:
        j = (await s.submit(new_job())).job
        await _reserve(s, j.job_id)
        token = (await s.list_jobs(JobFilter(), page_size=1)).next_page_token
        assert token == ""
        for _ in range(2):
            await s.submit(new_job())
        token = (await s.list_jobs(JobFilter(), page_size=1)).next_page_token
    async with SqliteStore(path, clock=clock, id_gen=id_gen("x")) as s:
        [res] = await s.active_attempts()
        assert (res.job_id, res.number, res.cluster) == (j.job_id, 1, "c1")
        assert [o.kind for o in await s.pending_orders("c1")] == [OrderKind.DISPATCH]
        assert [a.job_id for a in await s.active_attempts()] == [j.job_id]
        assert len(await s.active_jobs()) == 3
        # page tokens stay valid across a restart (the signing secret is stored)
        assert len((await s.list_jobs(JobFilter(), page_size=1, page_token=token)).jobs) == 1


# -- errors ----------------------------------------------------------------------------------------


def test_error_codes_match_grpc() -> None:
    import grpc

    for code in Code:
        assert grpc.StatusCode[code.name].value[0] == code.value
    e = errors.QuotaExceeded(
        "no",
        details=errors.ErrorDetails(quota_violations=(errors.QuotaViolation("tenant/a", "gpu/H100", 16, 16, 8),)),
        job_id="j1",
    )
    assert (e.code, e.http_status, e.details.reason, e.meta("job_id")) == (
        Code.RESOURCE_EXHAUSTED,
        429,
        "QUOTA_EXCEEDED",
        "j1",
    )
    assert errors.BatchFailed("x").retryable and not errors.InvalidArgument("x").retryable
    bad = errors.InvalidArgument.fields(errors.FieldViolation("pod_sets[0].count", "must be >= 1"))
    assert (
        bad.message == "pod_sets[0].count: must be >= 1"
        and bad.details.field_violations[0].field == "pod_sets[0].count"
    )


async def test_new_migrations_apply_once_in_order_and_a_failing_one_rolls_back(
    tmp_path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from broker.store import sql

    path = str(tmp_path / "m.db")
    async with SqliteStore(path, clock=clock) as s:
        await s.submit(new_job(key="before"))
    nxt = LATEST + 1
    v_next = (nxt, ("ALTER TABLE jobs ADD COLUMN note TEXT NOT NULL DEFAULT ''",))
    broken = (nxt + 1, ("CREATE TABLE extra (x INTEGER)", "THIS IS NOT SQL"))
    monkeypatch.setattr(sql, "MIGRATIONS", MIGRATIONS + (v_next, broken))
    monkeypatch.setattr(sql, "LATEST", nxt + 1)
    with pytest.raises(errors.StoreUnavailable):
        await SqliteStore(path, clock=clock).open()
    conn = sqlite3.connect(path)
    assert [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")] == [
        v for v, _ in MIGRATIONS
    ] + [nxt]
    assert conn.execute("SELECT name FROM sqlite_master WHERE name='extra'").fetchall() == []  # rolled back
    conn.close()
    monkeypatch.setattr(sql, "MIGRATIONS", MIGRATIONS + (v_next,))
    monkeypatch.setattr(sql, "LATEST", nxt)
    async with SqliteStore(path, clock=clock) as s:
        assert s.schema_version == nxt
        assert not (await s.submit(new_job(key="before"))).created  # data kept across the migration


# -- observed status and cluster state ---------------------------------------------------------------


async def test_replica_status_rendezvous_and_feedback_are_kept_per_attempt(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    assert not await store.record_workload(j.job_id, 1, [ReplicaRecord("w", 0)])  # no attempt yet
    await _reserve(store, j.job_id)
    first = [ReplicaRecord("w", 1, "p-1", "n2", "PENDING"), ReplicaRecord("w", 0, "p-0", "n1", "RUNNING")]
    assert await store.record_workload(j.job_id, 1, first, "j-1.ns.svc:29500")
    later = [
        ReplicaRecord("w", 0, "p-0", "n1", "FAILED", 137, "OOMKilled", "out of memory"),
        ReplicaRecord("w", 1, "p-1", "n2", "RUNNING"),
    ]
    assert await store.record_workload(j.job_id, 1, later)  # replaces the replicas, keeps the address
    assert await store.record_feedback(j.job_id, 1, "n3: INSUFFICIENT_GPU", 12.5)
    assert not await store.record_feedback(j.job_id, 2, "stale", 13.0)
    [a] = await store.list_attempts(j.job_id)
    assert a.replicas == tuple(later)
    assert (a.rendezvous, a.feedback, a.feedback_time) == ("j-1.ns.svc:29500", "n3: INSUFFICIENT_GPU", 12.5)


async def test_cordons_are_durable_and_lifted(store: SqliteStore) -> None:
    assert await store.cordons() == {}
    await store.set_cordon("c1", "maintenance", actor="admin/a")
    await store.set_cordon("c2", "drain", actor="admin/a")
    await store.set_cordon("c1", "new reason", actor="admin/b")
    await store.set_cordon("c2", None, actor="admin/a")
    assert await store.cordons() == {"c1": "new reason"}


async def test_active_runs_pair_each_open_attempt_with_its_job(store: SqliteStore) -> None:
    waiting = (await store.submit(new_job())).job
    placed = (await store.submit(new_job())).job
    await _reserve(store, placed.job_id)
    runs = await store.active_runs()
    assert [(j.job_id, j.state, a.number, a.cluster) for j, a in runs] == [(placed.job_id, S.RESERVED, 1, "c1")]
    assert waiting.job_id not in {j.job_id for j, _ in runs}


# -- operator requeue --------------------------------------------------------------------------------


async def test_requeue_of_a_running_job_preempts_it_even_if_not_preemptible(
    store: SqliteStore, clock: FakeClock
) -> None:
    j = (await store.submit(new_job(preemptible=False))).job
    await _reserve(store, j.job_id)
    await _run(store, j.job_id)
    _, refused = await store.apply_event(job_events.PreemptRequested(j.job_id, 1))
    assert refused.ignored is lifecycle.IgnoreReason.NOT_PREEMPTIBLE  # what the new event does differently
    job, r = await store.apply_event(
        job_events.RequeueRequested(j.job_id, 1, actor="admin/ops", grace_s=20, message="maintenance")
    )
    assert r.transition is not None and job.state is S.PREEMPTED
    order = (await store.pending_orders("c1"))[-1]
    assert (order.kind, order.attempt, order.grace_s) == (OrderKind.PREEMPT, 1, 20)
    ev = (await store.job_history(j.job_id))[-1]
    assert (ev.actor, ev.message) == ("admin/ops", "maintenance")
    clock.advance(3)
    job, _ = await store.apply_event(job_events.AttemptEnded(j.job_id, 1, AttemptOutcome.INFRA_FAILED))
    assert (job.state, job.infra_retries, job.attempt) == (S.QUEUED, 0, 1)
    [a] = await store.list_attempts(j.job_id)
    assert (a.outcome, a.spent_retry) == (AttemptOutcome.PREEMPTED, False)


async def test_requeue_of_a_reserved_job_queues_it_at_once_and_cancels_the_dispatch(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    await _reserve(store, j.job_id)
    job, r = await store.apply_event(job_events.RequeueRequested(j.job_id, 1, actor="tenant/t1"))
    assert r.transition is not None and (job.state, job.infra_retries) == (S.QUEUED, 0)
    assert [o.kind for o in await store.pending_orders("c1")] == [OrderKind.DISPATCH, OrderKind.CANCEL]
    [a] = await store.list_attempts(j.job_id)
    assert (a.outcome, a.spent_retry, a.message) == (AttemptOutcome.PREEMPTED, False, "requeued by tenant/t1")
    assert await store.active_attempts() == []
    _, again = await store.apply_event(job_events.RequeueRequested(j.job_id, 1))
    assert again.ignored is lifecycle.IgnoreReason.NOT_APPLICABLE  # QUEUED: nothing to requeue


# -- scheduling settings: priority, band, hold -------------------------------------------------------


def _respec(raw: bytes, priority: int, band: str) -> bytes:
    return raw.split(b"|")[0] + f"|{priority}|{band}".encode()


async def test_set_priority_updates_columns_spec_and_history(store: SqliteStore, clock: FakeClock) -> None:
    j = (await store.submit(new_job(key="k", priority=3))).job
    clock.advance(10)
    out = await store.set_priority(
        j.job_id, tenant="t1", actor="tenant/t1", priority=7, message="deadline", respec=_respec
    )
    assert (out.priority, out.priority_band, out.spec, out.state) == (7, "default", b"spec|7|default", S.QUEUED)
    assert out.revision > j.revision and out.update_time == j.update_time  # not a state change
    assert await store.get_job(j.job_id) == out
    ev = (await store.job_history(j.job_id))[-1]
    assert (ev.kind.value, ev.from_state, ev.to_state, ev.reason, ev.actor, ev.revision) == (
        "UPDATED",
        S.QUEUED,
        S.QUEUED,
        "PriorityChanged",
        "tenant/t1",
        out.revision,
    )
    assert ev.message == "priority 3 -> 7: deadline"
    both = await store.set_priority(j.job_id, tenant=None, actor="admin/a", priority=1, band="high", respec=_respec)
    assert (both.priority, both.priority_band, both.spec) == (1, "high", b"spec|1|high")
    same = await store.set_priority(j.job_id, tenant=None, actor="admin/a", band="high", respec=_respec)
    assert same.revision == both.revision  # nothing changed, nothing written
    assert not (await store.submit(new_job(key="k", priority=3))).created  # the original request still matches
    with pytest.raises(errors.JobNotFound):
        await store.set_priority(j.job_id, tenant="t2", actor="tenant/t2", priority=9)
    await store.cancel_job(j.job_id, tenant=None, actor="admin/a")
    with pytest.raises(errors.JobFinished):
        await store.set_priority(j.job_id, tenant=None, actor="admin/a", priority=9)


async def test_a_held_job_gets_no_reservation_until_released(store: SqliteStore) -> None:
    j = (await store.submit(new_job())).job
    held, changed = await store.set_hold(j.job_id, held=True, tenant=None, actor="admin/ops", message="audit")
    assert changed and (held.held, held.held_by, held.state) == (True, "admin/ops", S.QUEUED)
    assert await store.get_job(j.job_id) == held
    again, changed = await store.set_hold(j.job_id, held=True, tenant="t1", actor="tenant/t1")
    assert not changed and again == held  # idempotent: the first holder stays
    _, r = await store.apply_event(
        job_events.Reserve(j.job_id, 0, "c1", ("z1",), (ReplicaPlacement("w", 0, "n1"),), "H100", 8.0)
    )
    assert r.ignored is lifecycle.IgnoreReason.NOT_APPLICABLE and await store.pending_orders("c1") == []
    with pytest.raises(errors.PermissionDenied) as ei:
        await store.set_hold(j.job_id, held=False, tenant="t1", actor="tenant/t1")
    assert ei.value.details.reason == "HELD_BY_ADMIN"
    with pytest.raises(errors.JobNotFound):
        await store.set_hold(j.job_id, held=False, tenant="t2", actor="tenant/t2")
    released, changed = await store.set_hold(j.job_id, held=False, tenant=None, actor="admin/ops")
    assert changed and (released.held, released.held_by) == (False, "")
    assert [(e.reason, e.message) for e in (await store.job_history(j.job_id))[1:]] == [
        ("Held", "held by admin/ops: audit"),
        ("Released", "released by admin/ops (held by admin/ops)"),
    ]
    await _reserve(store, j.job_id)
    assert (await store.get_job(j.job_id)).state is S.RESERVED
    # a tenant lifts its own hold
    k = (await store.submit(new_job())).job
    await store.set_hold(k.job_id, held=True, tenant="t1", actor="tenant/t1")
    out, changed = await store.set_hold(k.job_id, held=False, tenant="t1", actor="tenant/t1")
    assert changed and not out.held


# -- GPU-hours -----------------------------------------------------------------------------------------


async def test_gpu_hours_sum_each_attempts_overlap_with_the_window(store: SqliteStore, clock: FakeClock) -> None:
    t0 = clock()
    ran = (await store.submit(new_job())).job  # t1, c1: 16 GPUs running t0+120 .. t0+3720
    await _reserve(store, ran.job_id)
    for ev in (job_events.DispatchSent(ran.job_id, 1), job_events.DispatchAccepted(ran.job_id, 1)):
        await store.apply_event(ev)
    clock.advance(60)
    await store.apply_event(job_events.WorkloadReady(ran.job_id, 1))  # start t0+60
    clock.advance(60)
    await store.apply_event(job_events.AllRunning(ran.job_id, 1))  # running t0+120
    never_ran = (await store.submit(new_job("t2"))).job  # t2, c2: started at t0+120, never all running
    await _reserve(store, never_ran.job_id, cluster="c2")
    for ev in (
        job_events.DispatchSent(never_ran.job_id, 1),
        job_events.DispatchAccepted(never_ran.job_id, 1),
        job_events.WorkloadReady(never_ran.job_id, 1),
    ):
        await store.apply_event(ev)
    placed_only = (await store.submit(new_job())).job  # reserved, never started: no GPU-hours
    await _reserve(store, placed_only.job_id)
    clock.advance(1800)
    await store.apply_event(job_events.AttemptEnded(never_ran.job_id, 1, AttemptOutcome.GANG_TIMEOUT))  # t0+1920
    clock.advance(1800)
    await store.apply_event(job_events.AttemptEnded(ran.job_id, 1, AttemptOutcome.SUCCEEDED))  # t0+3720
    still = (await store.submit(new_job(gpus=8))).job  # t1, c1: running from t0+3720, open
    await _reserve(store, still.job_id)
    await _run(store, still.job_id)
    clock.advance(1800)  # now = t0+5520

    def table(rows: list[Any]) -> list[tuple[str, str, str, float]]:
        return [(r.tenant, r.gpu_model, r.cluster, round(r.gpu_hours, 9)) for r in rows]

    now = clock()
    everything = await store.gpu_hours(since=0, until=now, now=now)
    # _reserve charges 16 GPUs: t1 = 16 x 1h (ran) + 16 x 0.5h (still, to now); t2 = 16 x 0.5h from its start
    assert table(everything) == [("t1", "H100", "c1", 24.0), ("t2", "H100", "c2", 8.0)]
    # [t0+1020, t0+4620]: 0.75h of ran + 0.25h of still for t1, 0.25h of never_ran (it ended at t0+1920) for t2
    window = await store.gpu_hours(since=t0 + 1020, until=t0 + 4620, now=now)
    assert table(window) == [("t1", "H100", "c1", 16.0), ("t2", "H100", "c2", 4.0)]
    assert table(await store.gpu_hours(since=0, until=now, now=now, tenant="t2")) == [("t2", "H100", "c2", 8.0)]
    assert await store.gpu_hours(since=now, until=now + 3600, now=now, tenant="t2") == []  # ended before
    assert await store.gpu_hours(since=0, until=t0 + 100, now=now) == []  # nothing was running yet


# -- schema version 3 over a version 2 database ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_version_2_database_opens_with_its_jobs_unchanged(
    backend: str,
    tmp_path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]
) -> None:
    from broker.store import pg_sql, sql
    from broker.store.migrations import PG_MIGRATIONS

    def open_store(ids: str) -> Any:
        if backend == "postgres":
            from broker.store.postgres import PostgresStore

            return PostgresStore(dsn, clock=clock, id_gen=id_gen(ids))
        return SqliteStore(str(tmp_path / "v2.db"), clock=clock, id_gen=id_gen(ids))

    dsn = ""
    if backend == "postgres":
        from tests.broker.store_builders import fresh_pg_database

        dsn = await fresh_pg_database(request.getfixturevalue("pg_server"))
    v2 = [m for m in MIGRATIONS if m[0] <= 2]
    with monkeypatch.context() as m:
        m.setattr(sql, "MIGRATIONS", tuple(v2))
        m.setattr(sql, "LATEST", 2)
        m.setattr(pg_sql, "PG_MIGRATIONS", tuple(x for x in PG_MIGRATIONS if x[0] <= 2))
        m.setattr(pg_sql, "PG_LATEST", 2)
        async with open_store("old") as old:
            assert old.schema_version == 2
            written = [(await old.submit(new_job(key=f"k{i}", priority=i, labels={"i": str(i)}))).job for i in range(3)]
    async with open_store("new") as s:
        assert s.schema_version == 3 and LATEST == 3
        assert list((await s.list_jobs(JobFilter())).jobs) == written  # every field as it was, none held
        assert not any(j.held for j in written)
        assert not (await s.submit(new_job(key="k1", priority=1, labels={"i": "1"}))).created
        held, _ = await s.set_hold(written[0].job_id, held=True, tenant=None, actor="admin/a")
        assert (await s.get_job(held.job_id)).held_by == "admin/a"
