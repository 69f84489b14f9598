"""Property test against the real store: random lifecycle traffic keeps history, attempts and outbox consistent."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.domain.retry import RetryPolicy
from broker.domain.states import HOLDS_CAPACITY, AttemptOutcome, JobState
from broker.store.base import Store, StoreOptions
from broker.store.sqlite import SqliteStore
from fleetplan.catalog import ReplicaPlacement
from tests.broker.lifecycle_events import EVENT_KINDS, lifecycle_event
from tests.broker.store_builders import FakeClock, fresh_pg_database, id_gen, new_job, pg_server  # noqa: F401

O = AttemptOutcome
# progress events more often than cancels, so runs get deep into the state machine
WEIGHTED = EVENT_KINDS[:6] * 4 + ("ended",) * 3 + EVENT_KINDS[7:]
STEP = st.tuples(st.integers(0, 2), st.sampled_from(WEIGHTED), st.sampled_from((0, 0, 0, -1)), st.sampled_from(list(O)))
HOLD = (ReplicaPlacement("w", 0, "n1"),)
"""What every reservation holds (on cluster c0 or c1, by attempt number)."""


async def _scenario(steps: list[tuple[int, str, int, AttemptOutcome]], pg_server: str | None = None) -> None:
    clock = FakeClock()
    opts = StoreOptions(retry=RetryPolicy(max_infra_retries=2, max_attempts=6))
    store: Store = SqliteStore(clock=clock, id_gen=id_gen(), options=opts)
    if pg_server is not None:
        from broker.store.postgres import PostgresStore

        store = PostgresStore(await fresh_pg_database(pg_server), clock=clock, id_gen=id_gen(), options=opts)
    async with store as s:
        ids = [(await s.submit(new_job(preemptible=i == 1))).job.job_id for i in range(3)]
        for which, kind, offset, outcome in steps:
            job = await s.get_job(ids[which])
            clock.advance(1)
            n = max(0, job.attempt + offset)
            await s.apply_event(lifecycle_event(kind, job.job_id, n, outcome, cluster=f"c{n % 2}", assignments=HOLD))
        revisions = [e.revision for e in await s.watch_events(0)]
        assert revisions == sorted(set(revisions))
        reservations = {r.job_id for r in await s.active_attempts()}
        for job_id in ids:
            job = await s.get_job(job_id)
            history = await s.job_history(job_id)
            assert history[-1].to_state is job.state and history[-1].revision == job.revision
            for prev, cur in zip(history, history[1:]):
                assert cur.from_state is prev.to_state
            attempts = await s.list_attempts(job_id)
            assert [a.number for a in attempts] == list(range(1, job.attempt + 1))
            open_ = [a for a in attempts if a.outcome is None]
            assert len(open_) <= 1
            assert (job_id in reservations) == bool(open_) == (job.state in HOLDS_CAPACITY)
            if open_:
                assert open_[0].number == job.attempt
            assert job.infra_retries == sum(a.spent_retry for a in attempts)
            assert job.infra_retries <= 3
            if job.state.terminal:
                assert job.end_time is not None
            if job.state is JobState.QUEUED and attempts:
                assert attempts[-1].outcome is not None


@settings(max_examples=80, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60))
def test_store_stays_consistent_under_random_lifecycle_traffic(
    steps: list[tuple[int, str, int, AttemptOutcome]],
) -> None:
    asyncio.run(_scenario(steps))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, min_size=1, max_size=60))
def test_postgres_store_stays_consistent_too(pg_server: str, steps: list[tuple[int, str, int, AttemptOutcome]]) -> None:
    asyncio.run(_scenario(steps, pg_server))
