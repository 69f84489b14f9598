"""Fast mode's tandem-fair: the broker's preemption decision (broker.scheduling.fairness.choose_preemption) in virtual
time — the owner takes borrowed GPUs back, victims lose only the work since their last checkpoint and run
again, gangs go whole, and the flood experiment's workload."""

from __future__ import annotations

from fleetsim.fast import FastParams, FastSim
from fleetsim.mix_shapes import declared_max_runtime
from fleetsim.model import TenantSpec, WorkItem
from fleetsim.spec import default_fleet
from fleetsim.workload import PREEMPTIBLE_KINDS, flood_then_mix
from tests.fleetsim.test_fast import cluster, fleet, group, item, outcome

TENANTS = (TenantSpec("owner", quota=(("*", 32),)), TenantSpec("borrower", quota=(("*", 0),)))
P = FastParams(checkpoint_s=600.0, preempt_grace_s=30.0)


def _two_racks():  # type: ignore[no-untyped-def]
    return fleet(cluster("c", group("g", nodes=4, per_rack=2)), tenants=TENANTS)


def test_the_owner_takes_borrowed_gpus_back_and_the_victim_finishes_later() -> None:
    work = [
        item("b1", 0.0, 5000.0, replicas=2, tenant="borrower", level="rack", preemptible=True),
        item("b2", 0.0, 5000.0, replicas=2, tenant="borrower", level="rack", preemptible=True),
        item("own", 1000.0, 2000.0, replicas=2, tenant="owner", level="rack"),
    ]
    sim = FastSim(_two_racks(), work, policy="tandem-fair", seed=0, params=P)
    r = sim.run()
    own = outcome(r, "own")
    victims = [o for o in r.outcomes if o.preemptions]
    assert len(victims) == 1 and r.preemptions == {"reclaim": 1}
    v = victims[0]
    # it ran 1000 s (+ decision lag) before its grace ended: the 600 s checkpoint survives, the rest is lost
    assert 16 * 380 <= v.lost_gpu_s <= 16 * 460, v.lost_gpu_s
    assert own.started_s is not None and own.started_s < 1000.0 + 30.0 + 30.0
    assert v.finished_s is not None and v.finished_s > own.finished_s  # type: ignore[operator]
    # its last attempt ran the rest after its checkpoint, no more
    assert v.last_start_s is not None and abs((v.finished_s - v.last_start_s) - (5000.0 - 600.0)) < 1e-6
    events = [(e, j) for _, e, j, _ in sim.log if e in ("preempt", "preempted", "start")]
    assert events.index(("preempted", v.item.name)) < events.index(("start", "own"))  # nodes freed first


def test_without_preemption_the_owner_waits_for_the_borrowers() -> None:
    work = [
        item("b1", 0.0, 5000.0, replicas=2, tenant="borrower", level="rack", preemptible=True),
        item("b2", 0.0, 5000.0, replicas=2, tenant="borrower", level="rack", preemptible=True),
        item("own", 1000.0, 2000.0, replicas=2, tenant="owner", level="rack"),
    ]
    r = FastSim(_two_racks(), work, policy="tandem", seed=0, params=P).run()
    assert not any(o.preemptions for o in r.outcomes) and r.preemptions == {}
    assert outcome(r, "own").started_s is not None and outcome(r, "own").started_s >= 5000.0  # type: ignore[operator]


def test_a_job_that_is_not_preemptible_is_never_a_victim() -> None:
    work = [
        item("b1", 0.0, 5000.0, replicas=2, tenant="owner", level="rack"),
        item("b2", 0.0, 5000.0, replicas=2, tenant="owner", level="rack"),
        item("late", 1000.0, 2000.0, replicas=2, tenant="borrower", level="rack", preemptible=True),
    ]
    tenants = (TenantSpec("owner"), TenantSpec("borrower", quota=(("*", 16),)))
    r = FastSim(
        fleet(cluster("c", group("g", nodes=4, per_rack=2)), tenants=tenants),
        work,
        policy="tandem-fair",
        seed=0,
        params=P,
    ).run()
    assert not any(o.preemptions for o in r.outcomes)
    assert outcome(r, "late").started_s is not None and outcome(r, "late").started_s >= 5000.0  # type: ignore[operator]


def test_flood_then_mix_is_the_flooder_s_preemptible_work_then_the_others() -> None:
    f = default_fleet()
    items = flood_then_mix(f, hours=0.5, load=0.5, seed=3)
    assert items == flood_then_mix(f, hours=0.5, load=0.5, seed=3)
    flood = [i for i in items if i.name.startswith("flood-")]
    rest = [i for i in items if not i.name.startswith("flood-")]
    flooder = min(f.tenants, key=lambda t: (t.weight, t.name)).name
    assert flood and rest
    assert all(i.tenant == flooder and i.preemptible and i.kind in PREEMPTIBLE_KINDS for i in flood)
    assert all(i.arrival_s <= 900.0 for i in flood) and all(i.arrival_s >= 900.0 for i in rest)
    assert {i.tenant for i in rest} == {t.name for t in f.tenants} - {flooder}
    assert sum(i.gpu_cost for i in flood) >= 0.8 * f.gpus  # enough to fill the fleet


def test_a_held_rack_drains_for_its_gang_and_only_a_job_that_ends_before_backfills() -> None:
    def job(name: str, at: float, duration: float, **kw: object) -> WorkItem:
        return item(name, at, duration, max_runtime_s=declared_max_runtime(duration), **kw)

    work = [job(f"f{k}", 0.0, d) for k, d in enumerate((1000.0, 3000.0, 5000.0, 6000.0))]
    work += [
        job("gang", 10.0, 1000.0, replicas=2, level="rack"),
        job("long", 200.0, 5000.0),
        job("short", 200.0, 300.0),
    ]
    f = fleet(cluster("c", group("g", nodes=4, per_rack=2)))
    params = FastParams(hold_after_s=100.0)
    fair = FastSim(f, work, policy="tandem-fair", seed=0, params=params)
    r = fair.run()
    plain = FastSim(f, work, policy="tandem", seed=0, params=params).run()
    assert fair.holds_started == 1
    gang, short, long_ = outcome(r, "gang"), outcome(r, "short"), outcome(r, "long")
    assert short.started_s is not None and short.started_s < 1100.0  # it ends before the rack has drained
    assert long_.started_s is not None and long_.started_s >= 3000.0  # kept out of the held rack
    assert gang.started_s is not None and gang.started_s < outcome(plain, "gang").started_s  # type: ignore[operator]
    assert outcome(plain, "long").started_s < 1100.0  # type: ignore[operator]  # without a hold it took the node
