"""Fleet-wide preemption through the real broker on loopback, with scripted cluster streams: the owner takes
borrowed GPUs back, a higher band displaces a lower one, fair share without ping-pong, whole gangs only,
and a victim runs again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from broker.config import FairnessConfig
from broker.launcher.client import SubmitItem
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tests.broker.hub_builders import (
    AutoCluster,
    Broker,
    ScriptedAgent,
    eventually,
    node,
    policy_doc,
    spec,
    start_broker,
)

pytestmark = pytest.mark.timeout(90)

FAST = FairnessConfig(interval_s=0.05, min_runtime_s=0.0)


async def _broker(tmp: Path, *, fairness: FairnessConfig = FAST, **tenants: dict[str, Any]) -> Broker:
    doc = policy_doc(**tenants)
    doc["priority_bands"] = {"default": 0, "high": 100}
    return await start_broker(tmp, policy=doc, fairness=fairness, grace_period_s=5.0)


def _bound(d: cs.Dispatch) -> list[tuple[str, int, str, int, str]]:
    out, index = [], 0
    for ps in d.pod_sets:
        for n in ps.nodes:
            for _ in range(n.replicas):
                out.append((d.attempt.job_id, d.attempt.attempt, ps.name, index, n.node))
                index += 1
    return out


def _nodes(d: cs.Dispatch) -> list[str]:
    return sorted(n.node for ps in d.pod_sets for n in ps.nodes)


async def _start(agent: ScriptedAgent, d: cs.Dispatch) -> None:
    """Accept, start and run a dispatched gang."""
    replicas = sum(n.replicas for ps in d.pod_sets for n in ps.nodes)
    agent.accept(d)
    agent.status(d.attempt.job_id, d.attempt.attempt, cs.WORKLOAD_PHASE_GATED, replicas=replicas)
    await agent.expect("start")
    agent.status(d.attempt.job_id, d.attempt.attempt, cs.WORKLOAD_PHASE_RUNNING, replicas=replicas, running=replicas)


async def _run(agent: ScriptedAgent, d: cs.Dispatch, all_nodes: list[str], busy: set[str]) -> None:
    """Accept, start and run a dispatched gang; report its nodes busy."""
    await _start(agent, d)
    busy.update(_nodes(d))
    agent.snapshot([node(n, free=0 if n in busy else 8) for n in all_nodes], bound=_bound(d))


async def _job(b: Broker, job_id: str) -> job_pb2.Job:
    return await b.client("admin").get(job_id)


async def _state(b: Broker, job_id: str) -> int:
    return (await _job(b, job_id)).status.state


async def test_the_owner_takes_borrowed_gpus_back_and_the_borrower_runs_again(tmp_path: Path) -> None:
    b = await _broker(tmp_path, alpha={"quotas": {"*": 16}}, beta={"quotas": {"*": 16}})
    nodes = [f"n{i}" for i in range(4)]
    agent = b.agent("c1")
    await agent.connect([node(n) for n in nodes])
    busy: set[str] = set()
    # beta borrows 16 GPUs beyond its quota: allowed while they are idle, because its job is preemptible
    [borrower] = await b.client("beta").submit("s", [SubmitItem("k1", spec(gpus=8, replicas=4, preemptible=True))])
    d1 = await agent.expect("dispatch")
    await _run(agent, d1, nodes, busy)
    await eventually(lambda: _is(b, borrower.job_id, job_pb2.JOB_STATE_RUNNING))
    # the owner comes back: alpha's job (within alpha's quota, not preemptible) takes two nodes back
    [owner] = await b.client("alpha").submit("s", [SubmitItem("k2", spec(gpus=8, replicas=2))])
    # first the cluster is told to keep the nodes the owner will get (its extender keeps others off them) …
    hold = await agent.expect("hold")
    assert (hold.attempt.job_id, hold.attempt.attempt) == (owner.job_id, 1)
    held_nodes = sorted(n.node for ps in hold.pod_sets for n in ps.nodes)
    assert len(held_nodes) == 2 and set(held_nodes) <= set(nodes) and not hold.pod_sets[0].pod_template_json
    assert hold.expires_at.seconds > 0 and hold.dispatch_id.endswith(f"/{owner.job_id}/1")
    # … then the borrower is preempted
    cancel = await agent.expect("cancel")
    assert (cancel.attempt.job_id, cancel.attempt.attempt) == (borrower.job_id, 1)
    assert cancel.reason == cs.CANCEL_REASON_PREEMPTED
    assert cancel.grace_period.seconds == 5
    waiting = await _job(b, owner.job_id)
    assert waiting.status.state == job_pb2.JOB_STATE_QUEUED
    assert "preempting 1 job(s)" in waiting.status.queue_info.message
    victim = await _job(b, borrower.job_id)
    assert victim.status.state == job_pb2.JOB_STATE_PREEMPTED
    assert borrower.job_id not in waiting.status.queue_info.message
    # the victim's pods are gone: the owner is dispatched onto the freed nodes, the borrower re-queued
    agent.cancel_ack(borrower.job_id, 1)
    busy.clear()
    agent.snapshot([node(n) for n in nodes])
    d2 = await agent.expect("dispatch")
    assert d2.attempt.job_id == owner.job_id and _nodes(d2) == held_nodes
    victim = await _job(b, borrower.job_id)
    assert victim.status.state == job_pb2.JOB_STATE_QUEUED
    assert victim.status.infra_retries == 0
    assert victim.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_PREEMPTED
    # the owner finishes; the borrower runs again as attempt 2
    await _run(agent, d2, nodes, busy)
    agent.status(
        owner.job_id, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=2, running=2, outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    )
    busy.clear()
    agent.snapshot([node(n) for n in nodes])
    d3 = await agent.expect("dispatch")
    assert (d3.attempt.job_id, d3.attempt.attempt) == (borrower.job_id, 2)
    assert b.hub.metrics.preemptions.labels("reclaim")._value.get() == 1  # type: ignore[attr-defined]
    await agent.close()
    await b.close()


async def _wait_reason(b: Broker, job_id: str, reason: int) -> bool:
    return (await _job(b, job_id)).status.queue_info.reason == reason


async def _is(b: Broker, job_id: str, state: int) -> bool:
    return await _state(b, job_id) == state


async def test_a_job_that_is_not_preemptible_never_borrows_and_is_never_a_victim(tmp_path: Path) -> None:
    b = await _broker(tmp_path, beta={"quotas": {"*": 16}})
    nodes = ["n0", "n1", "n2", "n3"]
    agent = b.agent("c1")
    await agent.connect([node(n) for n in nodes])
    busy: set[str] = set()
    beta = b.client("beta")
    [within] = await beta.submit("s", [SubmitItem("k2", spec(gpus=8, replicas=2))])
    d = await agent.expect("dispatch")
    assert d.attempt.job_id == within.job_id
    await _run(agent, d, nodes, busy)
    [over] = await beta.submit("s", [SubmitItem("k1", spec(gpus=8))])  # 16 held + 8 > quota 16, nodes idle
    await eventually(lambda: _wait_reason(b, over.job_id, job_pb2.WAIT_REASON_QUOTA_EXCEEDED))
    # a higher band of another tenant needs every node: the only running job is not preemptible
    [high] = await b.client("alpha").submit("s", [SubmitItem("k3", spec(gpus=8, replicas=4, band="high"))])
    rounds = b.hub.preemptor.rounds
    await eventually(lambda: b.hub.preemptor.rounds >= rounds + 10)
    assert all(m is None or m.WhichOneof("body") != "cancel" for m in list(agent.inbox._queue))  # type: ignore[attr-defined]
    assert await _state(b, high.job_id) == job_pb2.JOB_STATE_QUEUED
    assert await _state(b, within.job_id) == job_pb2.JOB_STATE_RUNNING
    stuck = await _job(b, over.job_id)
    assert stuck.status.queue_info.reason == job_pb2.WAIT_REASON_QUOTA_EXCEEDED
    assert b.hub.preemptor.history == []
    await agent.close()
    await b.close()


async def test_a_higher_band_preempts_a_whole_gang_never_a_part(tmp_path: Path) -> None:
    b = await _broker(tmp_path)
    nodes = ["n0", "n1"]
    agent = b.agent("c1")
    await agent.connect([node(n) for n in nodes])
    busy: set[str] = set()
    [gang] = await b.client("beta").submit("s", [SubmitItem("k1", spec(gpus=8, replicas=2, preemptible=True))])
    d = await agent.expect("dispatch")
    await _run(agent, d, nodes, busy)
    [high] = await b.client("alpha").submit("s", [SubmitItem("k2", spec(gpus=8, replicas=1, band="high"))])
    cancel = await agent.expect("cancel")
    assert (cancel.attempt.job_id, cancel.attempt.attempt) == (gang.job_id, 1)  # the whole attempt goes
    assert [(p.preemptor, [v for v, _ in p.victims]) for p in b.hub.preemptor.history] == [(high.job_id, [gang.job_id])]
    agent.cancel_ack(gang.job_id, 1)
    busy.clear()
    agent.snapshot([node(n) for n in nodes])
    d2 = await agent.expect("dispatch")
    assert d2.attempt.job_id == high.job_id and len(_nodes(d2)) == 1
    await _run(agent, d2, nodes, busy)
    # one node is left: the gang of two waits whole, it is never placed in part
    await eventually(lambda: b.hub.preemptor.rounds >= 10)
    victim = await _job(b, gang.job_id)
    assert victim.status.state == job_pb2.JOB_STATE_QUEUED and len(victim.status.attempts) == 1
    await agent.close()
    await b.close()


async def test_fair_share_preemption_does_not_ping_pong(tmp_path: Path) -> None:
    b = await _broker(tmp_path)
    nodes = ["n0", "n1"]
    agent = b.agent("c1")
    await agent.connect([node(n) for n in nodes])
    busy: set[str] = set()
    beta = b.client("beta")
    placed: dict[str, list[str]] = {}
    for k in ("k1", "k2"):
        [r] = await beta.submit("s", [SubmitItem(k, spec(gpus=8, preemptible=True))])
        d0 = await agent.expect("dispatch")
        placed[r.job_id] = _nodes(d0)
        await _run(agent, d0, nodes, busy)
    jobs = list(placed)
    # alpha (equal weight) asks for one node: beta holds both, above its fair share of 8
    [a1] = await b.client("alpha").submit("s", [SubmitItem("k3", spec(gpus=8, preemptible=True))])
    cancel = await agent.expect("cancel")
    victim = cancel.attempt.job_id
    assert victim in jobs
    agent.cancel_ack(victim, 1)
    busy.clear()
    survivor = next(j for j in jobs if j != victim)
    busy.update(placed[survivor])
    agent.snapshot([node(n, free=0 if n in busy else 8) for n in nodes])
    d = await agent.expect("dispatch")
    assert d.attempt.job_id == a1.job_id
    await _run(agent, d, nodes, busy)
    # now 8 / 8: the re-queued victim must not take its node back from alpha
    rounds = b.hub.preemptor.rounds
    await eventually(lambda: b.hub.preemptor.rounds >= rounds + 20)
    assert all(m is None or m.WhichOneof("body") != "cancel" for m in list(agent.inbox._queue))  # type: ignore[attr-defined]
    assert await _state(b, a1.job_id) == job_pb2.JOB_STATE_RUNNING
    assert await _state(b, victim) == job_pb2.JOB_STATE_QUEUED
    assert len(b.hub.preemptor.history) == 1
    await agent.close()
    await b.close()


async def test_three_tenants_weighted_1_1_2_converge_to_their_shares(tmp_path: Path) -> None:
    """A steady stream of 8-GPU jobs from three tenants on 64 GPUs: the queue's weighted order gives 16/16/32.

    Bound: over the second half, the GPUs in use split 1:1:2 within 5 points of each tenant's fraction, and
    all three within one job (8 GPUs) of their weighted share of the GPUs in use in at least 80 % of samples (jobs end
    and start one at a time, so a sample may fall between the two); the time it takes is printed."""
    doc = policy_doc(names=("alpha", "beta", "gamma"), gamma={"weight": 2.0})
    b = await start_broker(tmp_path, policy=doc, fairness=FAST)
    nodes = [f"n{i}" for i in range(8)]
    agent = b.agent("c1")
    await agent.connect([node(n) for n in nodes])
    cluster = AutoCluster(agent, nodes, run_s=0.3)
    cluster.start()
    clients = {t: b.client(t) for t in ("alpha", "beta", "gamma")}
    submitted = {t: 0 for t in clients}
    fair = {"alpha": 16.0, "beta": 16.0, "gamma": 32.0}
    samples: list[tuple[float, dict[str, float]]] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while cluster.finished < 160:
        for t, c in clients.items():
            queued = sum(1 for j in b.hub.placer.book.queued.values() if j.tenant == t)
            for _ in range(max(0, 4 - queued)):
                submitted[t] += 1
                await c.submit("s", [SubmitItem(f"{t}-{submitted[t]}", spec(gpus=8))])
        _, shares = b.hub.placer.book.shares()
        samples.append((loop.time() - t0, {t: shares.usage.get(t, 0.0) for t in clients}))
        await asyncio.sleep(0.05)
    # Within one job of the weighted share of the GPUs in use at that moment: a sample taken while finished
    # jobs' GPUs wait for the next placement step (longer on a loaded machine) measures the order, not the lag.
    within = [all(abs(u[t] - sum(u.values()) * fair[t] / 64.0) <= 8.0 for t in fair) for _, u in samples]
    late = samples[len(samples) // 2 :]
    mean = {t: sum(u[t] for _, u in late) / len(late) for t in fair}
    held = sum(mean.values())
    assert all(abs(mean[t] / held - fair[t] / 64.0) <= 0.05 for t in fair), mean  # the GPUs in use split 1:1:2
    second_half = within[len(within) // 2 :]
    assert sum(second_half) >= 0.8 * len(second_half), late
    converged = next(ts for i, (ts, _) in enumerate(samples) if sum(within[i:]) >= 0.8 * len(within[i:]))
    print(
        f"converged after {converged:.1f}s; {sum(second_half)}/{len(second_half)} late samples within one job;"
        f" late mean {mean}"
    )
    await cluster.stop()
    await agent.close()
    await b.close()


async def _expect_logging(agent: ScriptedAgent, kind: str, log: list[tuple[str, Any]]) -> Any:
    """The next message of `kind`, with every message received meanwhile appended to `log` in order."""
    while True:
        msg = await asyncio.wait_for(agent.inbox.get(), 10.0)
        assert msg is not None, "stream closed"
        body = msg.WhichOneof("body")
        log.append((body, getattr(msg, body)))
        if body == kind:
            return getattr(msg, body)


def _with_runtime(s: job_pb2.JobSpec, seconds: int) -> job_pb2.JobSpec:
    s.max_runtime.FromSeconds(seconds)
    return s


async def test_a_held_domain_drains_for_its_gang_and_backfill_cannot_starve_it(tmp_path: Path) -> None:
    b = await _broker(tmp_path, fairness=FairnessConfig(interval_s=0.05, hold_after_s=0.0, hold_min_gpus=16))
    racks = {"a0": "rA", "a1": "rA", "b0": "rB", "b1": "rB"}
    nodes = list(racks)
    agent = b.agent("c1")

    def report(free: set[str], bound: list[tuple[str, int, str, int, str]]) -> None:
        agent.snapshot([node(n, rack=racks[n], free=8 if n in free else 0) for n in nodes], bound=bound)

    await agent.connect([node(n, rack=racks[n]) for n in nodes])
    beta = b.client("beta")
    where: dict[str, str] = {}
    runtime: dict[str, int] = {}
    bound: list[tuple[str, int, str, int, str]] = []
    for k, seconds in (("f1", 100), ("f2", 200), ("f3", 1000), ("f4", 2000)):
        [r] = await beta.submit("s", [SubmitItem(k, _with_runtime(spec(gpus=8), seconds))])
        d = await agent.expect("dispatch")
        await _start(agent, d)
        where[r.job_id], runtime[r.job_id] = _nodes(d)[0], seconds
        bound += _bound(d)
        report(set(nodes) - set(where.values()), bound)
    # the rack whose jobs end first is the one a rack-wide gang will hold
    drains = {rack: max(runtime[j] for j, n in where.items() if racks[n] == rack) for rack in ("rA", "rB")}
    held = min(drains, key=drains.__getitem__)
    first, second = sorted((j for j, n in where.items() if racks[n] == held), key=runtime.__getitem__)
    [gang] = await b.client("alpha").submit("s", [SubmitItem("g", spec(gpus=8, replicas=2, level="rack"))])
    await eventually(lambda: gang.job_id in b.hub.placer.holds.drains.holds)
    hold = b.hub.placer.holds.drains.holds[gang.job_id]
    assert hold.domain.path[-1] == held and sorted(hold.domain.nodes) == sorted(n for n in nodes if racks[n] == held)
    # a job without max runtime cannot backfill; one that ends before the rack has drained can
    [unbounded] = await beta.submit("s", [SubmitItem("y", spec(gpus=8))])
    [short] = await beta.submit("s", [SubmitItem("z", _with_runtime(spec(gpus=8), 10))])
    agent.status(
        first, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=1, running=1, outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    )
    free = {where[first]}
    report(free, [x for x in bound if x[0] != first])
    # the cluster is told to keep the freed node for the gang too (its extender holds it against others) …
    drain = await agent.expect("hold")
    assert drain.drain and (drain.attempt.job_id, drain.attempt.attempt) == (gang.job_id, 1)
    assert [(n.node, ps.shape.gpu_count) for ps in drain.pod_sets for n in ps.nodes] == [(where[first], 8)]
    # … while a job bound to end before the drain may still backfill it
    d = await agent.expect("dispatch")
    assert d.attempt.job_id == short.job_id and _nodes(d) == [where[first]]
    assert await _state(b, unbounded.job_id) == job_pb2.JOB_STATE_QUEUED
    await _start(agent, d)
    bound = [x for x in bound if x[0] != first] + _bound(d)
    report(set(), bound)
    # the rest of the rack drains: its idle GPUs are charged to the gang while it waits
    agent.status(
        second, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=1, running=1, outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    )
    bound = [x for x in bound if x[0] != second]
    report({where[second]}, bound)
    await eventually(lambda: b.hub.placer.holds.drains.holds[gang.job_id].idle_gpus == 8)
    waiting = await _job(b, gang.job_id)
    assert (
        job_pb2.WAIT_REASON_DRAINING_DOMAIN in (waiting.status.queue_info.reason,)
        or "holding a domain while it drains" in waiting.status.queue_info.message
    )
    assert await _state(b, unbounded.job_id) == job_pb2.JOB_STATE_QUEUED  # the idle node stays the gang's
    agent.status(
        short.job_id, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=1, running=1, outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    )
    bound = [x for x in bound if x[0] != short.job_id]
    report({where[first], where[second]}, bound)
    log: list[tuple[str, Any]] = []
    d = await _expect_logging(agent, "dispatch", log)
    assert d.attempt.job_id == gang.job_id and sorted(_nodes(d)) == sorted(hold.domain.nodes)
    # the rack's idle GPUs were held in the cluster up to the gang's placement, then released for its dispatch
    holds = [
        (k, sorted(n.node for ps in m.pod_sets for n in ps.nodes) if k == "hold" else None)
        for k, m in log
        if k in ("hold", "release_hold") and m.drain
    ]
    assert holds[-2:] == [("hold", sorted(hold.domain.nodes)), ("release_hold", None)], holds
    await eventually(lambda: gang.job_id not in b.hub.placer.holds.drains.holds)
    await agent.close()
    await b.close()


async def test_the_lost_work_rate_limit_holds_preemption_back(tmp_path: Path) -> None:
    # every GPU-hour counts: a limit far below one running gang's lost work lets no preemption through
    limited = FairnessConfig(interval_s=0.05, min_runtime_s=0.0, max_lost_gpu_hours_per_hour=1e-6)
    b = await _broker(tmp_path, fairness=limited, alpha={"quotas": {"*": 16}}, beta={"quotas": {"*": 16}})
    nodes = [f"n{i}" for i in range(4)]
    agent = b.agent("c1")
    await agent.connect([node(n) for n in nodes])
    [borrower] = await b.client("beta").submit("s", [SubmitItem("k1", spec(gpus=8, replicas=4, preemptible=True))])
    await _run(agent, await agent.expect("dispatch"), nodes, set())
    await eventually(lambda: _is(b, borrower.job_id, job_pb2.JOB_STATE_RUNNING))
    [owner] = await b.client("alpha").submit("s", [SubmitItem("k2", spec(gpus=8, replicas=2))])
    await eventually(lambda: b.hub.preemptor.rounds >= 20)
    assert all(m is None or m.WhichOneof("body") != "cancel" for m in list(agent.inbox._queue))  # type: ignore[attr-defined]
    assert await _state(b, owner.job_id) == job_pb2.JOB_STATE_QUEUED and b.hub.preemptor.history == []
    await agent.close()
    await b.close()
