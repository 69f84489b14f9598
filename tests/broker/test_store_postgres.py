"""PostgreSQL-only store behaviour: leader election by advisory lock, state surviving a leader change."""

from __future__ import annotations

import pytest

from broker.domain import errors, job_events
from broker.domain.records import JobFilter, OrderKind
from broker.store.migrations import PG_LATEST
from broker.store.postgres import PostgresStore
from fleetplan.catalog import ReplicaPlacement
from tests.broker.store_builders import FakeClock, fresh_pg_database, id_gen, new_job, pg_server  # noqa: F401


async def test_one_leader_per_database_and_state_survives_a_takeover(pg_server: str) -> None:
    dsn = await fresh_pg_database(pg_server)
    clock = FakeClock()
    leader = PostgresStore(dsn, clock=clock, id_gen=id_gen("a"))
    await leader.open()
    assert leader.schema_version == PG_LATEST
    standby = PostgresStore(dsn, clock=clock, id_gen=id_gen("b"))
    with pytest.raises(errors.StoreUnavailable):
        await standby.open()
    j = (await leader.submit(new_job(key="k"))).job
    _, r = await leader.apply_event(
        job_events.Reserve(j.job_id, 0, "c1", ("z",), (ReplicaPlacement("w", 0, "n1"),), "H100", 8.0)
    )
    assert r.transition is not None
    for _ in range(3):
        await leader.submit(new_job())
    token = (await leader.list_jobs(JobFilter(), page_size=1)).next_page_token
    rev = await leader.current_revision()
    await leader.close()  # releases the lock

    await standby.open()
    try:
        assert await standby.current_revision() == rev
        assert not (await standby.submit(new_job(key="k"))).created
        [res] = await standby.active_attempts()
        assert (res.job_id, res.number, res.cluster) == (j.job_id, 1, "c1")
        assert [o.kind for o in await standby.pending_orders("c1")] == [OrderKind.DISPATCH]
        assert len((await standby.list_jobs(JobFilter(), page_size=1, page_token=token)).jobs) == 1
        nxt = (await standby.submit(new_job())).job
        assert nxt.revision > rev
    finally:
        await standby.close()


async def test_losing_the_writer_connection_stops_writes(pg_server: str) -> None:
    dsn = await fresh_pg_database(pg_server)
    store = PostgresStore(dsn, clock=FakeClock(), id_gen=id_gen())
    await store.open()
    try:
        await store.submit(new_job(key="before"))
        store._conn.terminate()  # the leader's session dies (network, server restart)
        with pytest.raises(errors.BatchFailed):
            await store.submit(new_job(key="during"))
        with pytest.raises(errors.StoreUnavailable) as ei:
            await store.submit(new_job(key="after"))
        assert "leadership" in ei.value.message
        takeover = PostgresStore(dsn, clock=FakeClock(), id_gen=id_gen("b"))
        await takeover.open()  # the lock died with the session
        assert [j.idempotency_key for j in (await takeover.list_jobs(JobFilter())).jobs] == ["before"]
        await takeover.close()
    finally:
        await store._pool.close()
        store._task = None
