"""Broker state that lives in the store, over real gRPC: cordons across a restart, the PostgreSQL backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import load_config
from broker.hub import Hub
from broker.launcher.client import SubmitItem
from broker.store.postgres import PostgresStore
from broker.store.sqlite import SqliteStore
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tests.broker.hub_builders import Broker, eventually, node, spec, start_broker
from tests.broker.store_builders import fresh_pg_database, pg_server  # noqa: F401

pytestmark = pytest.mark.timeout(60)


async def _state(b: Broker, job_id: str) -> int:
    job = await b.client("admin").get(job_id)
    return job.status.state


async def _is(b: Broker, job_id: str, state: int) -> bool:
    return await _state(b, job_id) == state


async def test_cordon_survives_a_broker_restart(tmp_path: Path) -> None:
    b = await start_broker(tmp_path)
    a = b.agent("ca")
    await a.connect([node("a1")])
    await b.client("admin").cordon("ca", "firmware upgrade")
    await a.close()
    await b.close()

    b = await start_broker(tmp_path)  # same database file
    try:
        a = b.agent("ca")
        await a.connect([node("a1")])
        summary = (await b.client("admin").get_cluster("ca")).cluster
        assert (summary.cordoned, summary.cordon_reason) == (True, "firmware upgrade")
        c = b.client("alpha")
        [res] = await c.submit("after-restart", [SubmitItem("k", spec(gpus=8))])
        await eventually(lambda: res.job_id in b.hub.placer.book.waits)
        job = await c.get(res.job_id)
        assert job.status.state == job_pb2.JOB_STATE_QUEUED
        assert job.status.queue_info.reason == job_pb2.WAIT_REASON_CLUSTERS_CORDONED
        await b.client("admin").cordon("ca", "done", on=False)
        d = await a.expect("dispatch")
        assert d.attempt.job_id == res.job_id
        await a.close()
    finally:
        await b.close()

    b = await start_broker(tmp_path)  # the uncordon was durable too
    try:
        assert b.hub.cordon_reasons == {} and not any(e.cordoned for e in b.hub.catalog.clusters.values())
    finally:
        await b.close()


def test_db_flag_or_store_url_selects_the_backend(tmp_path: Path) -> None:
    cfg = load_config(["--db", "postgresql://tandem@db.example.com:5432/tandem"])
    assert cfg.store_url == "postgresql://tandem@db.example.com:5432/tandem"
    assert isinstance(Hub.store_for(cfg), PostgresStore)
    yaml_cfg = tmp_path / "broker.yaml"
    yaml_cfg.write_text("store_url: postgres://tandem@db/tandem\n")
    assert isinstance(Hub.store_for(load_config(["--config", str(yaml_cfg)])), PostgresStore)
    cfg = load_config(["--db", str(tmp_path / "b.db")])
    assert cfg.store_url is None
    assert isinstance(Hub.store_for(cfg), SqliteStore)


async def test_hub_on_postgres_submit_dispatch_done(tmp_path: Path, pg_server: str) -> None:
    dsn = await fresh_pg_database(pg_server)
    b = await start_broker(tmp_path, store_url=dsn)
    try:
        assert isinstance(b.hub.store, PostgresStore)
        agent = b.agent("c1")
        await agent.connect([node("n1"), node("n2")])
        c = b.client("alpha")
        [res] = await c.submit("pg-run", [SubmitItem("k1", spec(gpus=8, replicas=2, level="rack"))])
        assert res.job_id and not res.error_code
        d = await agent.expect("dispatch")
        assert (d.attempt.job_id, d.attempt.attempt) == (res.job_id, 1)
        agent.accept(d)
        agent.status(res.job_id, 1, cs.WORKLOAD_PHASE_GATED, replicas=2)
        await agent.expect("start")
        agent.status(res.job_id, 1, cs.WORKLOAD_PHASE_RUNNING, replicas=2, running=2)
        await eventually(lambda: _is(b, res.job_id, job_pb2.JOB_STATE_RUNNING))
        agent.status(
            res.job_id, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=2, running=2, outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
        )
        await eventually(lambda: _is(b, res.job_id, job_pb2.JOB_STATE_SUCCEEDED))
        # The same key again returns the same job: the idempotency record is in PostgreSQL.
        [again] = await c.submit("pg-run", [SubmitItem("k1", spec(gpus=8, replicas=2, level="rack"))])
        assert (again.job_id, again.duplicate) == (res.job_id, True)
        await agent.close()
    finally:
        await b.close()
    # Reopened by a new hub on the same database: the job and its history are there.
    b = await start_broker(tmp_path, store_url=dsn)
    try:
        job = await b.client("alpha").get(res.job_id)
        assert job.status.state == job_pb2.JOB_STATE_SUCCEEDED
        assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    finally:
        await b.close()
