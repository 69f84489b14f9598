"""Operator and tenant operations over real gRPC on loopback: usage, its GPU-hour export, requeue, priority and
hold / release, with the `tandem` command line for each."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from broker.launcher import cli
from broker.launcher.client import SubmitItem, status_details
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc
from tests.broker.hub_builders import H100, TOKENS, Broker, eventually, node, policy_doc, spec, start_broker

pytestmark = pytest.mark.timeout(60)

S = job_pb2


@pytest.fixture
async def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    b = await start_broker(tmp_path, policy=policy_doc(alpha={"quotas": {H100: 16}, "weight": 2}))
    yield b
    await b.close()


async def _job(b: Broker, job_id: str) -> job_pb2.Job:
    return await b.client("admin").get(job_id)


async def _is(b: Broker, job_id: str, state: int) -> bool:
    return (await _job(b, job_id)).status.state == state


async def _submit(b: Broker, who: str = "alpha", key: str = "k", **kw: Any) -> str:
    [res] = await b.client(who).submit("ops", [SubmitItem(key, spec(gpus=8, **kw))])
    assert res.job_id, res.error_message
    return res.job_id


async def _running(b: Broker, agent: Any, who: str = "alpha", key: str = "k", **kw: Any) -> str:
    """Submit an 8-GPU job and take it to RUNNING on `agent`'s cluster (attempt 1)."""
    job_id = await _submit(b, who, key, **kw)
    d = await agent.expect("dispatch")
    assert (d.attempt.job_id, d.attempt.attempt) == (job_id, 1)
    agent.accept(d)
    agent.status(job_id, 1, cs.WORKLOAD_PHASE_GATED, replicas=1)
    await agent.expect("start")
    agent.status(job_id, 1, cs.WORKLOAD_PHASE_RUNNING, replicas=1, running=1)
    await eventually(lambda: _is(b, job_id, S.JOB_STATE_RUNNING))
    return job_id


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


def _fields(err: grpc.aio.AioRpcError) -> list[str]:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    bad = [d for d in status_details(err) if isinstance(d, error_details_pb2.BadRequest)]
    assert bad, err.details()
    return [v.field for v in bad[0].field_violations]


def _reason(err: grpc.aio.AioRpcError) -> str:
    infos = [d for d in status_details(err) if isinstance(d, error_details_pb2.ErrorInfo)]
    return infos[0].reason if infos else ""


def _audit(b: Broker) -> list[tuple[str, str, str]]:
    lines = [json.loads(x) for x in (b.tmp / "audit.jsonl").read_text().splitlines()]
    return [(e["method"], e["caller"], e["outcome"]) for e in lines]


# ----------------------------------------------------------------------------- GetUsage


async def test_usage_rows_tenant_sees_its_own_admin_sees_every_tenant(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1")])
    await _running(broker, agent, "alpha")
    waiting = await _submit(broker, "beta", "b1")  # no room left: beta only has demand
    await eventually(lambda: waiting in broker.hub.placer.book.waits)

    mine = await broker.client("alpha").usage()
    assert [t.tenant for t in mine.tenants] == ["alpha"]  # never beta's row
    [alpha] = mine.tenants
    assert dict(alpha.gpus) == {H100: 8.0} and dict(alpha.quotas) == {H100: 16.0} and dict(alpha.borrowed) == {}
    assert alpha.weight == 2.0 and alpha.usage_cost > 0 and alpha.demand_cost == alpha.usage_cost
    assert mine.capacity_cost > 0

    everyone = {t.tenant: t for t in (await broker.client("admin").usage()).tenants}
    assert set(everyone) == {"alpha", "beta"}
    assert everyone["alpha"] == alpha
    beta = everyone["beta"]
    assert dict(beta.gpus) == {} and beta.usage_cost == 0 and beta.demand_cost > 0 and beta.weight == 1.0
    assert [t.tenant for t in (await broker.client("admin").usage("beta")).tenants] == ["beta"]

    err = await _refused(broker.client("alpha").usage("beta"))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert ("GetUsage", "alpha", "ok") in _audit(broker) and ("GetUsage", "admin", "ok") in _audit(broker)
    await agent.close()


# ----------------------------------------------------------------------------- ExportUsage


async def test_export_counts_the_gpu_hours_of_a_job_that_ran(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1")])
    job_id = await _running(broker, agent, "alpha")
    [open_attempt] = await broker.hub.store.list_attempts(job_id)
    assert open_attempt.running_time is not None
    await eventually(lambda: broker.hub.clock() > open_attempt.running_time)  # some running time to count
    agent.status(job_id, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=1, running=1, outcome=S.ATTEMPT_OUTCOME_SUCCEEDED)
    await eventually(lambda: _is(broker, job_id, S.JOB_STATE_SUCCEEDED))
    [a] = await broker.hub.store.list_attempts(job_id)
    assert a.end_time is not None and a.running_time is not None
    expected = (a.end_time - a.running_time) * a.gpus / 3600

    resp = await broker.client("alpha").export_usage()
    assert [(r.tenant, r.gpu_model, r.cluster) for r in resp.records] == [("alpha", H100, "c1")]
    assert resp.records[0].gpu_hours == pytest.approx(expected, rel=1e-9) and expected > 0
    assert (await broker.client("beta").export_usage()).records == []  # beta sees none of alpha's rows
    assert [r.tenant for r in (await broker.client("admin").export_usage()).records] == ["alpha"]
    half = (a.running_time + a.end_time) / 2
    clipped = await broker.client("admin").export_usage(since=half)
    # `since` crosses the wire as a Timestamp and an epoch float holds it to ~0.2 µs: allow a microsecond of GPU time
    assert clipped.records[0].gpu_hours == pytest.approx((a.end_time - half) * a.gpus / 3600, abs=a.gpus * 1e-6 / 3600)
    assert (await broker.client("admin").export_usage(since=a.end_time + 1)).records == []

    err = await _refused(broker.client("admin").export_usage(since=a.end_time, until=a.running_time))
    assert _fields(err) == ["until"]
    assert ("ExportUsage", "beta", "ok") in _audit(broker)
    await agent.close()


# ----------------------------------------------------------------------------- RequeueJob


async def test_requeue_of_a_running_job_preempts_it_and_dispatches_attempt_two(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1")])
    job_id = await _running(broker, agent, "alpha", preemptible=False)  # an operator requeue works for any job

    err = await _refused(broker.client("beta").requeue(job_id, "not mine"))
    assert err.code() == grpc.StatusCode.NOT_FOUND  # as CancelJob answers for another tenant's job
    assert await _is(broker, job_id, S.JOB_STATE_RUNNING)

    resp = await broker.client("admin").requeue(job_id, "node maintenance")
    assert resp.state == S.JOB_STATE_PREEMPTED
    cancel = await agent.expect("cancel")
    assert (cancel.attempt.job_id, cancel.attempt.attempt, cancel.reason) == (job_id, 1, cs.CANCEL_REASON_PREEMPTED)
    assert await _is(broker, job_id, S.JOB_STATE_PREEMPTED)  # until the cluster confirms
    agent.cancel_ack(job_id, 1)
    d2 = await agent.expect("dispatch")
    assert (d2.attempt.job_id, d2.attempt.attempt) == (job_id, 2)

    job = await _job(broker, job_id)
    assert job.status.infra_retries == 0
    assert job.status.attempts[0].outcome == S.ATTEMPT_OUTCOME_PREEMPTED
    steps = [(h.from_state, h.to_state, h.actor) for h in job.status.history]
    assert (S.JOB_STATE_RUNNING, S.JOB_STATE_PREEMPTED, "admin/admin") in steps
    assert (S.JOB_STATE_PREEMPTED, S.JOB_STATE_QUEUED, "broker") in steps
    assert ("RequeueJob", "admin", "ok") in _audit(broker) and ("RequeueJob", "beta", "error") in _audit(broker)
    await agent.close()


async def test_requeue_before_accept_queues_at_once_and_a_queued_job_is_refused(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1")])
    job_id = await _submit(broker, "alpha")
    d1 = await agent.expect("dispatch")
    assert d1.attempt.attempt == 1
    resp = await broker.client("alpha").requeue(job_id)  # the job's own tenant may
    assert resp.state == S.JOB_STATE_QUEUED
    cancel = await agent.expect("cancel")  # the dispatch in flight is taken back
    assert (cancel.attempt.attempt, cancel.reason) == (1, cs.CANCEL_REASON_SUPERSEDED)
    d2 = await agent.expect("dispatch")
    assert (d2.attempt.job_id, d2.attempt.attempt) == (job_id, 2)
    job = await _job(broker, job_id)
    assert (job.status.infra_retries, job.status.attempts[0].outcome) == (0, S.ATTEMPT_OUTCOME_PREEMPTED)

    queued = await _submit(broker, "alpha", "k2")  # no room: it stays QUEUED
    await eventually(lambda: queued in broker.hub.placer.book.waits)
    err = await _refused(broker.client("alpha").requeue(queued))
    assert (err.code(), _reason(err)) == (grpc.StatusCode.FAILED_PRECONDITION, "NOT_REQUEUEABLE")
    assert "QUEUED" in (err.details() or "")
    await broker.client("alpha").cancel(queued)
    err = await _refused(broker.client("alpha").requeue(queued))
    assert (err.code(), _reason(err)) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_FINISHED")
    await agent.close()


# ----------------------------------------------------------------------------- SetJobPriority


async def test_priority_band_the_tenant_may_not_use_is_refused_naming_the_field(broker: Broker) -> None:
    job_id = await _submit(broker, "alpha")
    c = broker.client("alpha")
    for band in ("low", "no-such-band"):  # "low" exists in the policy, alpha may not use it
        assert _fields(await _refused(c.set_priority(job_id, band=band))) == ["priority_band"]
    assert _fields(await _refused(c.set_priority(job_id, priority=5000))) == ["priority"]
    assert _fields(await _refused(c.set_priority(job_id))) == ["priority"]  # neither given
    err = await _refused(broker.client("beta").set_priority(job_id, priority=1))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    job = await _job(broker, job_id)
    assert (job.spec.priority, job.spec.priority_band) == (0, "")  # nothing changed


async def test_raised_band_is_used_by_the_next_placement(broker: Broker) -> None:
    first = await _submit(broker, "alpha", "first")
    second = await _submit(broker, "alpha", "second")
    await eventually(lambda: {first, second} <= set(broker.hub.placer.book.waits))  # both looked at: no cluster yet
    assert [j.job_id for j in broker.hub.placer.book.ordered()] == [first, second]
    before = (await _job(broker, second)).status.revision
    cached = broker.hub.placer.book.requests[second]  # parsed at submission, with the old priority
    job = await broker.client("alpha").set_priority(second, priority=7, band="high", reason="deadline")
    assert (job.spec.priority, job.spec.priority_band, job.status.state) == (7, "high", S.JOB_STATE_QUEUED)
    assert job.status.revision > before
    again = broker.hub.placer.book.requests.get(second)  # dropped, or parsed again since: never the stale one
    assert again is None or again.priority != cached.priority
    assert [j.job_id for j in broker.hub.placer.book.ordered()] == [second, first]
    agent = broker.agent("c1")
    await agent.connect([node("n1")])  # room for one: the raised one goes first
    d = await agent.expect("dispatch")
    assert d.attempt.job_id == second
    full = await _job(broker, second)
    assert any(
        h.reason == "PriorityChanged" and h.actor == "tenant/alpha" and "deadline" in h.message
        for h in full.status.history
    )
    assert ("SetJobPriority", "alpha", "ok") in _audit(broker)
    await agent.close()


# ----------------------------------------------------------------------------- HoldJob / ReleaseJob


async def test_a_held_job_is_passed_over_until_released(broker: Broker) -> None:
    held_id = await _submit(broker, "alpha", "held")
    c = broker.client("admin")
    rev = (await _job(broker, held_id)).status.revision
    held = await c.hold(held_id, "dataset not ready")
    assert held.job.status.held and held.job.status.held_by == "admin/admin" and not held.already_held
    assert (await c.hold(held_id)).already_held
    watch = broker.client("alpha").watch(from_revision=rev, job_ids=[held_id])
    ev = await asyncio.wait_for(watch.__anext__(), 10)
    assert (ev.type, ev.transition.reason, ev.job.status.held) == (svc.JOB_EVENT_TYPE_JOB_UPDATED, "Held", True)
    await watch.aclose()
    other = await _submit(broker, "alpha", "other")  # behind the held one in the queue

    agent = broker.agent("c1")
    await agent.connect([node("n1"), node("n2", rack="r2")])  # room for both
    d = await agent.expect("dispatch")
    assert d.attempt.job_id == other  # the placer's step looked at the held job first and passed it over
    job = await _job(broker, held_id)
    assert (job.status.state, job.status.current_attempt, job.status.held) == (S.JOB_STATE_QUEUED, 0, True)
    assert job.status.queue_info.reason == S.WAIT_REASON_HELD
    assert job.status.queue_info.message.startswith("held by admin/admin")

    err = await _refused(broker.client("alpha").release(held_id))  # an admin's hold: not the tenant's to lift
    assert (err.code(), _reason(err)) == (grpc.StatusCode.PERMISSION_DENIED, "HELD_BY_ADMIN")
    assert (await _refused(broker.client("beta").hold(held_id))).code() == grpc.StatusCode.NOT_FOUND
    released = await c.release(held_id, "dataset ready")
    assert not released.job.status.held and not released.was_not_held
    d2 = await agent.expect("dispatch")
    assert (d2.attempt.job_id, d2.attempt.attempt) == (held_id, 1)
    assert (await c.release(held_id)).was_not_held
    seen = _audit(broker)
    assert ("HoldJob", "admin", "ok") in seen and ("ReleaseJob", "alpha", "error") in seen
    await agent.close()


async def test_a_held_job_leaves_its_room_to_the_next_job(broker: Broker) -> None:
    held_id = await _submit(broker, "alpha", "held")
    await broker.client("alpha").hold(held_id)
    other = await _submit(broker, "alpha", "other")
    await eventually(lambda: other in broker.hub.placer.book.waits)
    assert held_id not in broker.hub.placer.book.waits  # a held job is out of the order: never decided
    agent = broker.agent("c1")
    await agent.connect([node("n1")])  # room for one job: the held one, ahead in arrival, must leave it

    async def decided() -> bool:
        w = broker.hub.placer.book.waits.get(other)
        return not await _is(broker, other, S.JOB_STATE_QUEUED) or (
            w is not None and w.reason.value == "INSUFFICIENT_CAPACITY"
        )

    await eventually(decided)
    assert not await _is(broker, other, S.JOB_STATE_QUEUED)
    assert await _is(broker, held_id, S.JOB_STATE_QUEUED)
    await agent.close()


async def test_hold_on_a_finished_job_fails(broker: Broker) -> None:
    job_id = await _submit(broker, "alpha")
    await broker.client("alpha").cancel(job_id)
    err = await _refused(broker.client("alpha").hold(job_id))
    assert (err.code(), _reason(err)) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_FINISHED")


# ----------------------------------------------------------------------------- the command line


async def tandem(b: Broker, *argv: str, who: str = "alpha") -> tuple[int, str]:
    out = io.StringIO()
    code = await asyncio.to_thread(cli.main, ["--broker", b.tenant_addr, "--token", TOKENS[who], *argv], out)
    return code, out.getvalue()


async def test_cli_usage_table_json_and_csv(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1")])
    job_id = await _running(broker, agent, "alpha")
    await _submit(broker, "beta", "b1")
    code, text = await tandem(broker, "usage")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["TENANT", "WEIGHT"]
    assert [line.split()[0] for line in lines[1:-1]] == ["alpha"]
    assert f"{H100}: 8" in lines[1] and f"{H100}: 16" in lines[1]
    code, text = await tandem(broker, "usage", "--json", who="admin")
    assert code == 0
    doc = json.loads(text)
    assert [t["tenant"] for t in doc["tenants"]] == ["alpha", "beta"]
    assert doc["tenants"][0]["gpus"] == {H100: 8.0}

    agent.status(job_id, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=1, running=1, outcome=S.ATTEMPT_OUTCOME_SUCCEEDED)
    await eventually(lambda: _is(broker, job_id, S.JOB_STATE_SUCCEEDED))
    [a] = await broker.hub.store.list_attempts(job_id)
    assert a.end_time is not None and a.running_time is not None
    code, text = await tandem(broker, "usage", "--csv", "--since", "1d", "--until", "2100-01-01")
    assert code == 0
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["tenant", "gpu_model", "cluster", "gpu_hours"]
    assert [r[:3] for r in rows[1:]] == [["alpha", H100, "c1"]]
    assert float(rows[1][3]) == pytest.approx((a.end_time - a.running_time) * a.gpus / 3600, rel=1e-9)
    code, text = await tandem(broker, "usage", "--csv", who="beta")
    assert (code, text) == (0, "tenant,gpu_model,cluster,gpu_hours\n")
    code, text = await tandem(broker, "usage", "--since", "1d")
    assert code == 2 and "--csv" in text
    await agent.close()


async def test_cli_requeue_priority_hold_release(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1")])
    running = await _running(broker, agent, "alpha")
    code, text = await tandem(broker, "requeue", running)
    assert (code, text) == (0, f"{running}: PREEMPTED\n")
    assert (await agent.expect("cancel")).reason == cs.CANCEL_REASON_PREEMPTED

    waiting = await _submit(broker, "alpha", "w")
    code, text = await tandem(broker, "priority", waiting, "--band", "low")
    assert code == 1 and "INVALID_ARGUMENT" in text and "  priority_band: " in text
    code, text = await tandem(broker, "priority", waiting, "--priority", "5", "--band", "high")
    assert (code, text) == (0, f"{waiting}: priority 5, band high\n")
    code, text = await tandem(broker, "hold", waiting, "--reason", "wait for data")
    assert (code, text) == (0, f"{waiting}: QUEUED, held by tenant/alpha\n")
    code, text = await tandem(broker, "get", waiting)
    assert "priority: 5   band: high   HELD by tenant/alpha" in text and "HELD: held by tenant/alpha" in text
    code, text = await tandem(broker, "release", waiting)
    assert (code, text) == (0, f"{waiting}: QUEUED, not held\n")
    code, text = await tandem(broker, "release", waiting)
    assert text.endswith("(was not held)\n")
    await agent.close()


def test_cli_times_accept_epoch_iso_and_durations_ago() -> None:
    import argparse

    assert cli.parse_time("1767225600") == 1767225600.0
    assert cli.parse_time("2026-01-01") == 1767225600.0
    assert cli.parse_time("2026-01-01T01:00:00Z") == 1767229200.0
    assert cli.parse_time("2026-01-01T02:00:00+01:00") == 1767229200.0
    assert cli.parse_time("24h", now=1767225600.0) == 1767225600.0 - 86400
    with pytest.raises(argparse.ArgumentTypeError):
        cli.parse_time("yesterday")
